/*
 * dram_pattern.cu - how fast the SMs get weight bytes by the decode kernels' copy pattern,
 * with no compute: is the pattern or the DRAM the limit? (bench/NOTES.md seventeenth session,
 * item 8: the decode FC1 reads its 21 MB at 28% of the DRAM's peak at M = 1.)
 *
 * Each block has 8 warps; each warp streams GROUPS groups of 16 rows x 32 bytes through a
 * per-warp cp.async ring of RING groups (16-byte copies, 128-byte L2 prefetch hint, RING - 1
 * groups in flight; the decode's cp_async16_pf), like the KS 8 decode kernel with one m16
 * tile per warp, and touches each landed group once (no math). Two layouts of the same bytes:
 *   rows  - row-major [rows][row_bytes] (src/gpu_pack.h's layout until the thirty-first
 *           session, which took the codes to 8-row tiles): block b owns rows 16 b .. 16 b + 15,
 *           warp w the bytes [GROUPS 32 w, GROUPS 32 (w + 1)) of each; a warp copy is 16
 *           pieces of 32 bytes, row_bytes apart;
 *   tiled - the same pieces stored so that a warp's group is 512 contiguous bytes.
 * Blocks per SM are held to the decode's 4 (dynamic shared memory padding) unless
 * --free-occupancy. The L2 is left clean before each repetition (memset of 256 MB, then a
 * read of another 256 MB); median of --reps CUDA-event timings, and of the kernel's own span
 * (%globaltimer: the first block's start to the last block's end; the events also hold ~6 us
 * of launch and event cost, which an empty launch measures).
 *
 *   dram_pattern [--blocks N ...] [--reps R] [--free-occupancy | --cap C] [--work W]
 *                [--xload | --xring] [--xrows R] [--bulk U ...] [--ahead D ...] [--dirty]
 * prints one line per (layout, blocks): microseconds and GB/s of the bytes copied, by the
 * events and by the kernel's span. --work W
 * adds W integer multiply-adds per group and lane (4 independent chains) after each group
 * lands, in place of the decode's ~100 instructions of dequantization and mma. --xload adds
 * the decode's activation loads: 32 bytes per lane and group from an L2-resident buffer of
 * 8 token rows (K = 6144 bf16), one group ahead, which the group's work depends on; --xring
 * copies each group's rows (128 bytes each) into the warp's ring beside its weights instead
 * and reads them from there (RING x rows x 144 bytes of dynamic shared memory per warp:
 * fewer blocks per SM at 8 rows). --xrows R (default 8): the lanes of token rows < R load,
 * the others use zeros (a decode slot of R tokens; M=1: 1).
 * --bulk U (repeatable) adds lines for bulk_kernel at U units of 16 rows per block (blocks / U
 * blocks), each unit's rows asked for by bulk copies at the block's start.
 * --ahead D (repeatable, 1..RING - 1; default RING - 1 as the decode): groups in flight per warp
 * ahead of the one it computes (the copy of group i + D is issued after group i's work), one
 * line per D and layout. --cap C: blocks per SM held to C (default 4; the decode holds M=1's
 * one-wave grids to ceil(blocks / SMs), 3 at 384). --dirty: the L2 is left full of dirty
 * lines (the 256 MB memset alone, as `fp4moe bench` flushes) instead of clean.
 * Build: a CMake target of the CUDA build (bench/micro); runs on sm_80 and later.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_util.cuh" /* the kernels' own copy helpers (cp_async16_pf: the ring's hint) */

#define WARPS 8
#define RING 8
#define GROUPS 12                    /* K = 6144: 96 groups of 64 over 8 warps */
#define ROW_BYTES (WARPS * GROUPS * 32) /* 3072: one NVFP4 row of K = 6144 */
#define FLUSH_BYTES (256u << 20)

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "dram_pattern: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* Source of lane `lane`'s 16 bytes of group i of warp w of block b. */
static __device__ __forceinline__ const unsigned char *src_of(const unsigned char *w, int tiled,
                                                              int b, int warp, int i, int lane)
{
    if (tiled) return w + ((size_t)(b * WARPS + warp) * GROUPS + i) * 512 + 16 * lane;
    return w + (size_t)(16 * b + (lane >> 1)) * ROW_BYTES + (warp * GROUPS + i) * 32 + 16 * (lane & 1);
}

static __device__ __forceinline__ unsigned long long global_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

#define X_ROW_PAD 144 /* bytes per token row and group in the --xring ring (128 + 16 of pad) */
#define XMODE_LOAD 1  /* --xload */
#define XMODE_RING 2  /* --xring */

/* --xring: the group's token rows (xrows of them, 128 bytes each) copied into this warp's
 * stage st beside its weights; chunk c = lane + 32 q is row c / 8, bytes 16 (c % 8). */
static __device__ __forceinline__ void copy_rows(unsigned char *xq, const uint4 *x, int xrows,
                                                 int warp, int i, int st, int lane)
{
    const unsigned char *src = (const unsigned char *)x + (size_t)(warp * GROUPS + i) * 128;
    for (int q = 0; q < 2; q++) {
        const int c = lane + 32 * q, r = c >> 3;
        if (r < xrows)
            cp_async16(smem_u32(xq + (st * xrows + r) * X_ROW_PAD + 16 * (c & 7)),
                       src + (size_t)r * ROW_BYTES * 4 + 16 * (c & 7), 16);
    }
}

/* Waits until at most n of this thread's cp.async commit groups are pending (n < RING). */
static __device__ __forceinline__ void cp_async_wait_n(int n)
{
    switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
    }
}

/* span[0] / span[1]: the earliest block start / the latest block end (ns, %globaltimer).
 * ahead: groups in flight ahead of the one computed (1..RING - 1). */
extern "C" __global__ void __launch_bounds__(WARPS * 32)
pattern_kernel(const unsigned char *w, int tiled, int work, const uint4 *x, int xmode, int xrows,
               int ahead, unsigned *sink, unsigned long long *span)
{
    __shared__ __align__(16) unsigned char ring[WARPS][RING][512];
    extern __shared__ __align__(16) unsigned char dyn[]; /* padding; the --xring rows */
    if (threadIdx.x == 0) atomicMin(&span[0], global_ns());
    if (tiled == 2) return; /* the launch-cost probe */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, b = blockIdx.x;
    const int g = lane >> 2, t = lane & 3; /* B fragment: token row g, lane quad t */
    const uint32_t dst = smem_u32(&ring[warp][0][16 * lane]);
    unsigned char *xq = dyn + (size_t)warp * RING * xrows * X_ROW_PAD;
    for (int i = 0; i < ahead; i++) {
        if (i < GROUPS) {
            cp_async16_pf(dst + 512 * i, src_of(w, tiled, b, warp, i, lane), 16);
            if (xmode == XMODE_RING) copy_rows(xq, x, xrows, warp, i, i, lane);
        }
        cp_async_commit();
    }
    unsigned acc = 0;
    /* --xload: 32 bytes of activations per lane and group (token row g < xrows, as the
     * decode's B fragments), loaded from L2 one group ahead; the group's work needs them.
     * --xring: the same 32 bytes read from the ring once the group has landed. */
    const bool xl = xmode == XMODE_LOAD && g < xrows;
    const uint4 *xr = x + (size_t)g * (ROW_BYTES * 4 / 16) + (size_t)warp * GROUPS * 8 + 2 * t;
    uint4 xa = make_uint4(0, 0, 0, 0), xb = xa;
    if (xl) xa = __ldcg(xr), xb = __ldcg(xr + 1);
    for (int i = 0; i < GROUPS; i++) {
        uint4 xn = make_uint4(0, 0, 0, 0), xm = xn;
        if (xl && i + 1 < GROUPS) xn = __ldcg(xr + 8 * (i + 1)), xm = __ldcg(xr + 8 * (i + 1) + 1);
        cp_async_wait_n(ahead - 1);
        __syncwarp();
        if (xmode == XMODE_RING && g < xrows) {
            const uint4 *xs = (const uint4 *)(xq + ((i % RING) * xrows + g) * X_ROW_PAD + 32 * t);
            xa = xs[0], xb = xs[1];
        }
        const uint4 v = *(const uint4 *)&ring[warp][i % RING][16 * ((lane + 1) & 31)];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
        /* --work: 4 independent chains of work / 4 integer multiply-adds on the group's words,
         * standing in for the dequantization and mma between two copies */
        uint32_t c0 = v.x ^ xa.x ^ xb.x, c1 = v.y ^ xa.y ^ xb.y, c2 = v.z ^ xa.z ^ xb.z,
                 c3 = v.w ^ xa.w ^ xb.w;
        xa = xn, xb = xm;
        for (int j = 0; j < work; j += 4) {
            c0 = c0 * 0x9e3779b1u + 7u, c1 = c1 * 0x85ebca6bu + 11u;
            c2 = c2 * 0xc2b2ae35u + 13u, c3 = c3 * 0x27d4eb2fu + 17u;
        }
        acc ^= c0 ^ c1 ^ c2 ^ c3;
        __syncwarp();
        const int n = i + ahead;
        if (n < GROUPS) {
            cp_async16_pf(dst + 512 * (n % RING), src_of(w, tiled, b, warp, n, lane), 16);
            if (xmode == XMODE_RING) copy_rows(xq, x, xrows, warp, n, n % RING, lane);
        }
        cp_async_commit();
    }
    if (acc == 0x9e3779b9u) sink[0] = acc; /* keeps the reads; never true for these bytes */
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&span[1], global_ns());
}

/* --bulk U: the same rows by bulk copies (cp.async.bulk, one per 3072-byte row, completing on
 * an mbarrier per unit) into padded shared rows; a block owns U units of 16 rows (U x 16 x
 * 3104 bytes), all asked for at its start, and its warps touch each unit's groups as the
 * pattern kernel does (warp w: groups 12 w .. 12 w + 11 of the 16 rows, --work W each). */
#define BULK_ROW (ROW_BYTES + 32) /* padded shared row: rows g, g + 4 on other banks */
#define BULK_UNIT (16 * BULK_ROW)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* bulk copies and mbarriers: sm_90 on */

static __device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, unsigned bytes,
                                                 uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

static __device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity)
{
    asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra W;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
#endif

extern "C" __global__ void __launch_bounds__(WARPS * 32)
bulk_kernel(const unsigned char *w, int units, int work, unsigned *sink, unsigned long long *span)
{
    extern __shared__ __align__(16) unsigned char dyn[];
#if __CUDA_ARCH__ >= 900
    __shared__ __align__(8) unsigned long long bars[8];
    if (threadIdx.x == 0) atomicMin(&span[0], global_ns());
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < units) mbar_init(smem_u32(&bars[threadIdx.x]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
    if (warp == 0) {
        for (int u = 0; u < units; u++) {
            const uint32_t bar = smem_u32(&bars[u]);
            if (lane == 0) mbar_expect_tx(bar, 16 * ROW_BYTES);
            __syncwarp();
            if (lane < 16)
                bulk_copy(smem_u32(dyn + u * BULK_UNIT + lane * BULK_ROW),
                          w + ((size_t)(blockIdx.x * units + u) * 16 + lane) * ROW_BYTES, ROW_BYTES,
                          bar);
        }
    }
    unsigned acc = 0;
    for (int u = 0; u < units; u++) {
        mbar_wait(smem_u32(&bars[u]), 0);
        for (int i = 0; i < GROUPS; i++) {
            const uint4 v = *(const uint4 *)(dyn + u * BULK_UNIT + (lane >> 1) * BULK_ROW +
                                             (warp * GROUPS + i) * 32 + 16 * (lane & 1));
            uint32_t c0 = v.x, c1 = v.y, c2 = v.z, c3 = v.w;
            for (int j = 0; j < work; j += 4) {
                c0 = c0 * 0x9e3779b1u + 7u, c1 = c1 * 0x85ebca6bu + 11u;
                c2 = c2 * 0xc2b2ae35u + 13u, c3 = c3 * 0x27d4eb2fu + 17u;
            }
            acc ^= c0 ^ c1 ^ c2 ^ c3;
        }
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&span[1], global_ns());
#endif
}

/* A read of n words: leaves the L2 full of clean lines. */
extern "C" __global__ void read_kernel(const uint4 *x, size_t n, unsigned *sink)
{
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = x[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) sink[1] = acc;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int blocks[16], n_blocks = 0, reps = 15, free_occ = 0, work = 0, xmode = 0, xrows = 8;
    int bulk[8], n_bulk = 0, aheads[RING], n_ahead = 0, cap = 4, dirty = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--blocks") && i + 1 < argc && n_blocks < 16) {
            blocks[n_blocks] = atoi(argv[++i]);
            if (blocks[n_blocks] < 1) {
                fprintf(stderr, "dram_pattern: --blocks wants a positive count, got %s\n", argv[i]);
                return 2;
            }
            n_blocks++;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 1000) {
                fprintf(stderr, "dram_pattern: --reps wants 1..1000, got %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--work") && i + 1 < argc) {
            work = atoi(argv[++i]);
            if (work < 0 || work > 100000) {
                fprintf(stderr, "dram_pattern: --work wants 0..100000, got %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--xload") || !strcmp(argv[i], "--xring")) {
            xmode = !strcmp(argv[i], "--xload") ? XMODE_LOAD : XMODE_RING;
        } else if (!strcmp(argv[i], "--xrows") && i + 1 < argc) {
            xrows = atoi(argv[++i]);
            if (xrows < 1 || xrows > 8) {
                fprintf(stderr, "dram_pattern: --xrows wants 1..8 token rows, got %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--bulk") && i + 1 < argc && n_bulk < 8) {
            bulk[n_bulk] = atoi(argv[++i]);
            if (bulk[n_bulk] < 1 || bulk[n_bulk] > 4) {
                fprintf(stderr, "dram_pattern: --bulk wants 1..4 units of 16 rows per block, got %s\n", argv[i]);
                return 2;
            }
            n_bulk++;
        } else if (!strcmp(argv[i], "--free-occupancy")) {
            free_occ = 1;
        } else if (!strcmp(argv[i], "--cap") && i + 1 < argc) {
            cap = atoi(argv[++i]);
            if (cap < 1 || cap > 8) {
                fprintf(stderr, "dram_pattern: --cap wants 1..8 blocks per SM, got %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--ahead") && i + 1 < argc && n_ahead < RING) {
            aheads[n_ahead] = atoi(argv[++i]);
            if (aheads[n_ahead] < 1 || aheads[n_ahead] > RING - 1) {
                fprintf(stderr, "dram_pattern: --ahead wants 1..%d groups, got %s\n", RING - 1, argv[i]);
                return 2;
            }
            n_ahead++;
        } else if (!strcmp(argv[i], "--dirty")) {
            dirty = 1;
        } else {
            fprintf(stderr, "usage: dram_pattern [--blocks N ...] [--reps R] [--free-occupancy | --cap C] [--work W]\n"
                            "                    [--xload | --xring] [--xrows R] [--bulk U ...] [--ahead D ...] [--dirty]\n"
                            "unknown or incomplete argument: %s\n", argv[i]);
            return 2;
        }
    }
    if (!n_blocks) { /* M = 1 top-8 FC1 (one wave), M = 8 top-8 FC1 (waves) */
        blocks[0] = 384, blocks[1] = 1536, blocks[2] = 6144;
        n_blocks = 3;
    }
    if (!n_ahead) aheads[n_ahead++] = RING - 1;
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    int max_blocks = 0;
    for (int i = 0; i < n_blocks; i++) max_blocks = blocks[i] > max_blocks ? blocks[i] : max_blocks;
    const size_t bytes = (size_t)max_blocks * 16 * ROW_BYTES;
    unsigned char *w;
    void *flush, *clean;
    unsigned *sink;
    uint4 *x = NULL; /* 8 token rows of K = 6144 bf16 (--xload, --xring) */
    if (xmode) {
        CK(cudaMalloc((void **)&x, 8 * ROW_BYTES * 4));
        CK(cudaMemset(x, 0x3c, 8 * ROW_BYTES * 4));
    }
    CK(cudaMalloc((void **)&w, bytes));
    CK(cudaMalloc(&flush, FLUSH_BYTES));
    CK(cudaMalloc(&clean, FLUSH_BYTES));
    CK(cudaMalloc((void **)&sink, 16));
    CK(cudaMemset(w, 0x5a, bytes));
    CK(cudaMemset(clean, 0, FLUSH_BYTES));
    /* the decode kernel's residency: cap blocks of 256 threads per SM (4: its registers) */
    int pad = 0;
    if (!free_occ) {
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        pad = (int)(prop.sharedMemPerMultiprocessor / cap) - (int)sizeof(unsigned char[WARPS][RING][512]) - 2048;
        if (pad < 0) pad = 0;
    }
    /* --xring: the rows' ring in the same dynamic shared memory (more of it: fewer blocks) */
    const int xring_bytes = xmode == XMODE_RING ? WARPS * RING * xrows * X_ROW_PAD : 0;
    if (xring_bytes > pad) pad = xring_bytes;
    CK(cudaFuncSetAttribute(pattern_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pad));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pattern_kernel, WARPS * 32, pad));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float *t = (float *)malloc(sizeof(float) * reps), *ts = (float *)malloc(sizeof(float) * reps);
    unsigned long long *span, span0[2] = {~0ull, 0ull}, spanh[2];
    CK(cudaMalloc((void **)&span, sizeof span0));
    { /* the fixed cost of one timed launch: an empty grid of one block */
        for (int r = -2; r < reps; r++) {
            CK(cudaEventRecord(a, 0));
            pattern_kernel<<<1, WARPS * 32, pad>>>(w, 2, 0, NULL, 0, xrows, RING - 1, sink, span);
            CK(cudaEventRecord(b, 0));
            CK(cudaEventSynchronize(b));
            if (r >= 0) CK(cudaEventElapsedTime(&t[r], a, b));
        }
        qsort(t, reps, sizeof *t, cmp_float);
        printf("one block, nothing copied: %.2f us (launch and event cost in every line)\n",
               t[reps / 2] * 1000.0);
    }
    printf("layout blocks blocks/SM MB us GB/s kernel_us kernel_GB/s (work %d per group and lane%s,"
           " %d token rows; L2 %s before each; kernel: first block start to last block end,"
           " %%globaltimer)\n", work,
           xmode == XMODE_LOAD ? ", activations from L2 one group ahead"
                               : xmode == XMODE_RING ? ", activations through the ring" : "",
           xrows, dirty ? "dirty" : "clean");
    /* One line: reps timed launches (two untimed first), L2 left clean before each; the median
     * of the events and of the kernel's span. */
    auto timed = [&](const char *name, int nb, int per, auto launch) {
        for (int r = -2; r < reps; r++) {
            CK(cudaMemsetAsync(flush, r & 0xff, FLUSH_BYTES, 0));
            if (!dirty) read_kernel<<<1024, 256>>>((const uint4 *)clean, FLUSH_BYTES / 16, sink);
            CK(cudaMemcpyAsync(span, span0, sizeof span0, cudaMemcpyHostToDevice, 0));
            CK(cudaEventRecord(a, 0));
            launch();
            CK(cudaEventRecord(b, 0));
            CK(cudaEventSynchronize(b));
            CK(cudaGetLastError());
            CK(cudaMemcpy(spanh, span, sizeof spanh, cudaMemcpyDeviceToHost));
            if (r >= 0) {
                CK(cudaEventElapsedTime(&t[r], a, b));
                ts[r] = (float)(spanh[1] - spanh[0]) * 1e-6f; /* ms, like the events */
            }
        }
        qsort(t, reps, sizeof *t, cmp_float);
        qsort(ts, reps, sizeof *ts, cmp_float);
        const double us = t[reps / 2] * 1000.0, mb = nb * 16.0 * ROW_BYTES / 1e6;
        const double kus = ts[reps / 2] * 1000.0;
        printf("%s %d %d %.2f %.2f %.0f %.2f %.0f\n", name, nb, per, mb, us, mb * 1e3 / us, kus,
               mb * 1e3 / kus);
    };
    for (int bi = 0; bi < n_blocks; bi++)
        for (int ai = 0; ai < n_ahead; ai++)
            for (int tiled = 0; tiled < 2; tiled++) {
                char name[32];
                snprintf(name, sizeof name, "%s(ahead-%d)", tiled ? "tiled" : "rows", aheads[ai]);
                timed(name, blocks[bi], per_sm, [&] {
                    pattern_kernel<<<blocks[bi], WARPS * 32, pad>>>(w, tiled, work, x, xmode, xrows,
                                                                    aheads[ai], sink, span);
                });
            }
    for (int bi = 0; bi < n_blocks; bi++) {
        for (int q = 0; q < n_bulk; q++) {
            const int u = bulk[q], grid = blocks[bi] / u, dbytes = u * BULK_UNIT;
            if (blocks[bi] % u) continue;
            CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dbytes));
            int bper_sm = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bper_sm, bulk_kernel, WARPS * 32, dbytes));
            char name[32];
            snprintf(name, sizeof name, "bulk%d(%d-blocks)", u, grid);
            timed(name, blocks[bi], bper_sm,
                  [&] { bulk_kernel<<<grid, WARPS * 32, dbytes>>>(w, u, work, sink, span); });
        }
    }
    free(t), free(ts);
    cudaFree(span), cudaFree(w), cudaFree(flush), cudaFree(clean), cudaFree(sink), cudaFree(x);
    return 0;
}
