/*
 * dram_pattern.cu - how fast the SMs get weight bytes by the decode kernels' copy pattern,
 * with no compute: is the pattern or the DRAM the limit? (bench/NOTES.md seventeenth session,
 * item 8: the decode FC1 reads its 21 MB at 28% of the DRAM's peak at M = 1.)
 *
 * Each block has 8 warps; each warp streams GROUPS groups of 16 rows x 32 bytes through a
 * per-warp cp.async ring of RING groups (16-byte copies, 128-byte L2 prefetch hint, RING - 1
 * groups in flight; the decode's cp_async16_pf), like the KS 8 decode kernel with one m16
 * tile per warp, and touches each landed group once (no math). Two layouts of the same bytes:
 *   rows  - row-major [rows][row_bytes] as src/gpu_pack.h: block b owns rows 16 b .. 16 b + 15,
 *           warp w the bytes [GROUPS 32 w, GROUPS 32 (w + 1)) of each; a warp copy is 16
 *           pieces of 32 bytes, row_bytes apart;
 *   tiled - the same pieces stored so that a warp's group is 512 contiguous bytes.
 * Blocks per SM are held to the decode's 4 (dynamic shared memory padding) unless
 * --free-occupancy. The L2 is left clean before each repetition (memset of 256 MB, then a
 * read of another 256 MB); median of --reps CUDA-event timings, and of the kernel's own span
 * (%globaltimer: the first block's start to the last block's end; the events also hold ~6 us
 * of launch and event cost, which an empty launch measures).
 *
 *   dram_pattern [--blocks N ...] [--reps R] [--free-occupancy] [--work W] [--xload]
 * prints one line per (layout, blocks): microseconds and GB/s of the bytes copied, by the
 * events and by the kernel's span. --work W
 * adds W integer multiply-adds per group and lane (4 independent chains) after each group
 * lands, in place of the decode's ~100 instructions of dequantization and mma. --xload adds
 * the decode's activation loads: 32 bytes per lane and group from an L2-resident buffer of
 * 8 token rows (K = 6144 bf16), one group ahead, which the group's work depends on.
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

/* span[0] / span[1]: the earliest block start / the latest block end (ns, %globaltimer) */
extern "C" __global__ void __launch_bounds__(WARPS * 32)
pattern_kernel(const unsigned char *w, int tiled, int work, const uint4 *x, unsigned *sink,
               unsigned long long *span)
{
    __shared__ __align__(16) unsigned char ring[WARPS][RING][512];
    if (threadIdx.x == 0) atomicMin(&span[0], global_ns());
    if (tiled == 2) return; /* the launch-cost probe */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, b = blockIdx.x;
    const uint32_t dst = smem_u32(&ring[warp][0][16 * lane]);
    for (int i = 0; i < RING - 1; i++) {
        if (i < GROUPS) cp_async16_pf(dst + 512 * i, src_of(w, tiled, b, warp, i, lane), 16);
        cp_async_commit();
    }
    unsigned acc = 0;
    /* --xload: 32 bytes of activations per lane and group (token row lane / 4 of 8, as the
     * decode's B fragments), loaded from L2 one group ahead; the group's work needs them */
    const uint4 *xr = x + (size_t)(lane >> 2) * (ROW_BYTES * 4 / 16) + (size_t)warp * GROUPS * 8 + 2 * (lane & 3);
    uint4 xa = make_uint4(0, 0, 0, 0), xb = xa;
    if (x) xa = __ldcg(xr), xb = __ldcg(xr + 1);
    for (int i = 0; i < GROUPS; i++) {
        uint4 xn = make_uint4(0, 0, 0, 0), xm = xn;
        if (x && i + 1 < GROUPS) xn = __ldcg(xr + 8 * (i + 1)), xm = __ldcg(xr + 8 * (i + 1) + 1);
        cp_async_wait<RING - 2>();
        __syncwarp();
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
        const int n = i + RING - 1;
        if (n < GROUPS) cp_async16_pf(dst + 512 * (n % RING), src_of(w, tiled, b, warp, n, lane), 16);
        cp_async_commit();
    }
    if (acc == 0x9e3779b9u) sink[0] = acc; /* keeps the reads; never true for these bytes */
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&span[1], global_ns());
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
    int blocks[16], n_blocks = 0, reps = 15, free_occ = 0, work = 0, xload = 0;
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
        } else if (!strcmp(argv[i], "--xload")) {
            xload = 1;
        } else if (!strcmp(argv[i], "--free-occupancy")) {
            free_occ = 1;
        } else {
            fprintf(stderr, "usage: dram_pattern [--blocks N ...] [--reps R] [--free-occupancy] [--work W] [--xload]\n"
                            "unknown or incomplete argument: %s\n", argv[i]);
            return 2;
        }
    }
    if (!n_blocks) { /* M = 1 top-8 FC1 (one wave), M = 8 top-8 FC1 (waves) */
        blocks[0] = 384, blocks[1] = 1536, blocks[2] = 6144;
        n_blocks = 3;
    }
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
    uint4 *x = NULL; /* 8 token rows of K = 6144 bf16 (--xload) */
    if (xload) {
        CK(cudaMalloc((void **)&x, 8 * ROW_BYTES * 4));
        CK(cudaMemset(x, 0x3c, 8 * ROW_BYTES * 4));
    }
    CK(cudaMalloc((void **)&w, bytes));
    CK(cudaMalloc(&flush, FLUSH_BYTES));
    CK(cudaMalloc(&clean, FLUSH_BYTES));
    CK(cudaMalloc((void **)&sink, 16));
    CK(cudaMemset(w, 0x5a, bytes));
    CK(cudaMemset(clean, 0, FLUSH_BYTES));
    /* the decode kernel's residency: 4 blocks of 256 threads per SM (registers) */
    int pad = 0;
    if (!free_occ) {
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        pad = (int)(prop.sharedMemPerMultiprocessor / 4) - (int)sizeof(unsigned char[WARPS][RING][512]) - 2048;
        if (pad < 0) pad = 0;
        CK(cudaFuncSetAttribute(pattern_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pad));
    }
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
            pattern_kernel<<<1, WARPS * 32, pad>>>(w, 2, 0, NULL, sink, span);
            CK(cudaEventRecord(b, 0));
            CK(cudaEventSynchronize(b));
            if (r >= 0) CK(cudaEventElapsedTime(&t[r], a, b));
        }
        qsort(t, reps, sizeof *t, cmp_float);
        printf("one block, nothing copied: %.2f us (launch and event cost in every line)\n",
               t[reps / 2] * 1000.0);
    }
    printf("layout blocks blocks/SM MB us GB/s kernel_us kernel_GB/s (work %d per group and lane%s;"
           " kernel: first block start to last block end, %%globaltimer)\n", work,
           xload ? ", activations from L2 one group ahead" : "");
    for (int bi = 0; bi < n_blocks; bi++) {
        for (int tiled = 0; tiled < 2; tiled++) {
            for (int r = -2; r < reps; r++) {
                CK(cudaMemsetAsync(flush, r & 0xff, FLUSH_BYTES, 0));
                read_kernel<<<1024, 256>>>((const uint4 *)clean, FLUSH_BYTES / 16, sink);
                CK(cudaMemcpyAsync(span, span0, sizeof span0, cudaMemcpyHostToDevice, 0));
                CK(cudaEventRecord(a, 0));
                pattern_kernel<<<blocks[bi], WARPS * 32, pad>>>(w, tiled, work, x, sink, span);
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
            const double us = t[reps / 2] * 1000.0, mb = blocks[bi] * 16.0 * ROW_BYTES / 1e6;
            const double kus = ts[reps / 2] * 1000.0;
            printf("%s %d %d %.2f %.2f %.0f %.2f %.0f\n", tiled ? "tiled" : "rows", blocks[bi], per_sm,
                   mb, us, mb * 1e3 / us, kus, mb * 1e3 / kus);
        }
    }
    free(t), free(ts);
    cudaFree(span), cudaFree(w), cudaFree(flush), cudaFree(clean), cudaFree(sink), cudaFree(x);
    return 0;
}
