/*
 * w4a16_mma_gemm.cu - the grouped MoE GEMM of FC1 and FC2 (DESIGN.md sections 2 and 4) on
 * BF16 tensor cores through mma.sync.aligned.m16n8k16 (sm_80 and sm_90 alike).
 * NVFP4 weights (packed at load, src/gpu_pack.h): e2m1 codes and their block scale are turned
 * into BF16 in registers (exact: the product needs at most 6 significant bits), multiplied
 * with BF16 activations,
 * accumulated in fp32; the per-expert fp32 global scale is applied to the accumulator.
 * BF16 weights (shared experts converted from mxfp8/bf16 at load) take the same main loop
 * with ldmatrix B fragments.
 * Tile: 64 padded token rows x 128 weight rows x 64 K, 4 warps; warp w owns weight rows
 * [16w, 16w+16) and [64+16w, 64+16w+16) for all 64 rows (4 m16 x 4 n8 accumulators).
 * Gated mode puts the gate and up rows of the same 64 intermediate columns in one tile, so
 * the activation runs in the epilogue and FC1 writes bf16 a[row, I]. Plain mode (FC2)
 * multiplies by the global scale and the pair's routing weight and writes fp32 rows.
 * 3-stage cp.async pipeline, 16-byte copies (4-byte for scales), zero fill for padding.
 * Grid: (tile slots, column tiles); slots of no expert exit at once (fixed grid from M).
 * Launched as a programmatic dependent of the kernel before it (device_util.cuh).
 * Limits: K % 64 == 0; gated n % 64 == 0; plain n % 64 == 0 (partial 128 tiles masked).
 */
#include <cuda_bf16.h>
#include <string.h>

#include "w4a16_mma_gemm.cuh"
#include "device_util.cuh"
#include "gpu_pack.h"

#define BM FP4_MMA_TILE_M
#define BK FP4_MMA_TILE_K
#if BK != 64
#error "a K tile must be one 64-element group of the tiled codes (gpu_pack.h)"
#endif
#define BW 128               /* weight rows per tile */
#define NST 3                /* pipeline stages */
#define THREADS 128
#define APAD 72              /* bf16 per shared A / B row (64 + 8: ldmatrix conflict-free) */
#define A_BYTES (BM * APAD * 2)
#define WQ_BYTES (BW * BK / 2)
#define WS_BYTES (BW * BK / 16)
#define WB_BYTES (BW * APAD * 2)
#define STAGE_FP4 (A_BYTES + WQ_BYTES + WS_BYTES)
#define STAGE_BF16 (A_BYTES + WB_BYTES)

/* Nibble pair p of a packed code word (e2m1_pair: value * 2^-126) times a bf16x2 scale ->
 * bf16x2: multiply by 2^126 (0x7e80) and then by the scale, both exact. */
static __device__ __forceinline__ uint32_t e2m1_pair_scaled(uint32_t word, int p, uint32_t scale2)
{
    return bf16x2_mul(bf16x2_mul(e2m1_pair(word, p), 0x7e807e80u), scale2);
}

/* The whole tile; wfmt is a literal at each call site so each kernel is specialised. */
static __device__ __forceinline__ void mma_gemm_tile(const fp4_mma_gemm_args &p, const int wfmt)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int slot = blockIdx.x, ntile = blockIdx.y;
    int expert = 0;
    if (p.tile_expert) {
        expert = p.tile_expert[slot];
        if (expert < 0) return;
    } else if (slot * BM >= p.a_rows) {
        return;
    }
    const int prow0 = slot * BM, k = p.k, n = p.n, nk = k / BK;
    const int stage_bytes = wfmt == FP4_MMA_W_NVFP4 ? STAGE_FP4 : STAGE_BF16;
    const int n_wrows = p.gated ? 2 * n : n;

    /* A: 4 chunks of 16 bytes per thread: rows (tid >> 3) + 16 i, chunk (tid & 7). */
    const uint16_t *a_ptr[4];
    int a_ok[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int prow = prow0 + (tid >> 3) + 16 * i;
        int src = p.row_src ? p.row_src[prow] : (prow < p.a_rows ? prow : -1);
        a_ok[i] = src >= 0;
        a_ptr[i] = p.a + (size_t)(src >= 0 ? src : 0) * k + (tid & 7) * 8;
    }
    /* Weight row of tile row r, or -1 past n (plain mode only). */
#define WROW(r) (p.gated ? ((r) < 64 ? ntile * 64 + (r) : n + ntile * 64 + (r) - 64) \
                         : (ntile * BW + (r) < n ? ntile * BW + (r) : -1))

    const uint8_t *wq_ptr[2] = {0, 0}, *ws_ptr = 0;
    int wq_ok[2] = {0, 0}, ws_ok = 0;
    const uint16_t *wb_ptr[8];
    int wb_ok[8];
    if (wfmt == FP4_MMA_W_NVFP4) {
        const uint8_t *ws_e = p.ws + (size_t)expert * n_wrows * (k / 16);
#pragma unroll
        for (int i = 0; i < 2; i++) { /* chunk c = tid + 128 i: row c >> 1, half c & 1 */
            int c = tid + THREADS * i, wr = WROW(c >> 1);
            wq_ok[i] = wr >= 0;
            wq_ptr[i] = p.wq + fp4_wq_row((size_t)expert * n_wrows + (wr >= 0 ? wr : 0), k) +
                        (c & 1) * 16; /* the tiled codes (gpu_pack.h) */
        }
        int wr = WROW(tid);
        ws_ok = wr >= 0;
        ws_ptr = ws_e + (size_t)(wr >= 0 ? wr : 0) * (k / 16);
    } else {
        const uint16_t *wb_e = p.wb + (size_t)expert * n_wrows * k;
#pragma unroll
        for (int i = 0; i < 8; i++) { /* chunk c = tid + 128 i: row c >> 3, part c & 7 */
            int c = tid + THREADS * i, wr = WROW(c >> 3);
            wb_ok[i] = wr >= 0;
            wb_ptr[i] = wb_e + (size_t)(wr >= 0 ? wr : 0) * k + (c & 7) * 8;
        }
    }
#undef WROW

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    /* Issue the copies of k-tile kt into stage st. */
#define LOAD_STAGE(st, kt)                                                                   \
    do {                                                                                     \
        unsigned char *sb = smem + (st) * stage_bytes;                                       \
        _Pragma("unroll") for (int i = 0; i < 4; i++)                                        \
            cp_async16(smem_u32(sb + ((tid >> 3) + 16 * i) * APAD * 2 + (tid & 7) * 16),    \
                       a_ptr[i] + (kt) * BK, a_ok[i] ? 16 : 0);                              \
        if (wfmt == FP4_MMA_W_NVFP4) {                                                       \
            _Pragma("unroll") for (int i = 0; i < 2; i++) {                                  \
                int c = tid + THREADS * i;                                                   \
                cp_async16(smem_u32(sb + A_BYTES + c * 16), wq_ptr[i] + (kt) * FP4_WQ_TILE,  \
                           wq_ok[i] ? 16 : 0);                                               \
            }                                                                                \
            cp_async4(smem_u32(sb + A_BYTES + WQ_BYTES + tid * 4),                           \
                      ws_ptr + (kt) * (BK / 16), ws_ok ? 4 : 0);                             \
        } else {                                                                             \
            _Pragma("unroll") for (int i = 0; i < 8; i++) {                                  \
                int c = tid + THREADS * i;                                                   \
                cp_async16(smem_u32(sb + A_BYTES + (c >> 3) * APAD * 2 + (c & 7) * 16),      \
                           wb_ptr[i] + (kt) * BK, wb_ok[i] ? 16 : 0);                        \
            }                                                                                \
        }                                                                                    \
    } while (0)

#pragma unroll
    for (int s = 0; s < NST - 1; s++) {
        if (s < nk) LOAD_STAGE(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<NST - 2>();
        __syncthreads();
        {
            int nt = kt + NST - 1;
            if (nt < nk) LOAD_STAGE(nt % NST, nt);
            cp_async_commit();
        }
        const unsigned char *sb = smem + (kt % NST) * stage_bytes;
        const uint16_t *sa = (const uint16_t *)sb;

        uint2 wq[4];
        uint32_t sc[4];
        if (wfmt == FP4_MMA_W_NVFP4) {
#pragma unroll
            for (int q = 0; q < 4; q++) { /* n8 tile q: rows (q>>1)*64 + 16 warp + (q&1)*8 */
                int r = (q >> 1) * 64 + warp * 16 + (q & 1) * 8 + (lane >> 2);
                wq[q] = *(const uint2 *)(sb + A_BYTES + r * 32 + (lane & 3) * 8);
                sc[q] = *(const uint32_t *)(sb + A_BYTES + WQ_BYTES + r * 4);
            }
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t af[4][4];
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
                ldmatrix_x4(af[mt], smem_u32(sa + (mt * 16 + (lane & 15)) * APAD + kk * 16 + (lane >> 4) * 8));
            uint32_t b0[4], b1[4];
            if (wfmt == FP4_MMA_W_NVFP4) {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    uint32_t word = kk < 2 ? wq[q].x : wq[q].y; /* blocks 2v, 2v + 1 */
                    uint32_t se, so;
                    fp4_scale_eo<0>(sc[q], se, so);
                    uint32_t s2 = fp4_scale_half(kk & 1 ? so : se, kk >> 1);
                    b0[q] = e2m1_pair_scaled(word, 2 * (kk & 1), s2);     /* k 2t, 2t + 1 */
                    b1[q] = e2m1_pair_scaled(word, 2 * (kk & 1) + 1, s2); /* k 2t + 8, + 9 */
                }
            } else {
                const uint16_t *sw = (const uint16_t *)(sb + A_BYTES);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t r[4];
                    int row = h * 64 + warp * 16 + (lane >> 4) * 8 + (lane & 7);
                    ldmatrix_x4(r, smem_u32(sw + row * APAD + kk * 16 + ((lane >> 3) & 1) * 8));
                    b0[2 * h] = r[0];
                    b1[2 * h] = r[1];
                    b0[2 * h + 1] = r[2];
                    b1[2 * h + 1] = r[3];
                }
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int q = 0; q < 4; q++) mma_bf16(acc[mt][q], af[mt], b0[q], b1[q]);
        }
    }
#undef LOAD_STAGE
    asm volatile("cp.async.wait_group 0;\n" ::);

    /* Epilogue. acc[mt][q][c]: row mt*16 + lane/4 (+8 for c >= 2), column within the n8
     * tile 2*(lane&3) + (c&1). */
    const int g = lane >> 2, t2 = (lane & 3) * 2;
    if (p.gated) {
        float gs_g = 1.f, gs_u = 1.f;
        if (p.gscale) {
            gs_g = p.gscale[2 * expert];
            gs_u = p.gscale[2 * expert + 1];
        }
        uint16_t *out = (uint16_t *)p.out;
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                int prow = prow0 + mt * 16 + g + hr * 8;
                if (prow >= p.out_rows) continue;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int col = ntile * 64 + warp * 16 + q * 8 + t2;
                    float v0 = act_fn(p.act, p.limit, p.alpha, acc[mt][q][2 * hr] * gs_g,
                                      acc[mt][q + 2][2 * hr] * gs_u);
                    float v1 = act_fn(p.act, p.limit, p.alpha, acc[mt][q][2 * hr + 1] * gs_g,
                                      acc[mt][q + 2][2 * hr + 1] * gs_u);
                    *(uint32_t *)(out + (size_t)prow * n + col) = pack_bf16x2(v0, v1);
                }
            }
    } else {
        const float gs = p.gscale ? p.gscale[expert] : 1.f;
        float *out = (float *)p.out;
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                int prow = prow0 + mt * 16 + g + hr * 8;
                int dst = p.row_dst ? p.row_dst[prow] : (prow < p.out_rows ? prow : -1);
                if (dst < 0) continue;
                float f = gs * (p.row_w ? p.row_w[prow] : 1.f);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int col = ntile * BW + (q >> 1) * 64 + warp * 16 + (q & 1) * 8 + t2;
                    if (col >= n) continue;
                    const float v0 = acc[mt][q][2 * hr] * f, v1 = acc[mt][q][2 * hr + 1] * f;
                    if (p.out_bf16)
                        *(uint32_t *)((uint16_t *)p.out + (size_t)dst * n + col) =
                            pack_bf16x2(v0, v1);
                    else *(float2 *)(out + (size_t)dst * n + col) = make_float2(v0, v1);
                }
            }
    }
}

__global__ void __launch_bounds__(THREADS) fp4_w4a16_mma_kernel(const fp4_mma_gemm_args p)
{
    fp4_pdl_wait();
    fp4_pdl_trigger();
    mma_gemm_tile(p, FP4_MMA_W_NVFP4);
}

__global__ void __launch_bounds__(THREADS) fp4_w16a16_mma_kernel(const fp4_mma_gemm_args p)
{
    fp4_pdl_wait();
    fp4_pdl_trigger();
    mma_gemm_tile(p, FP4_MMA_W_BF16);
}

extern "C" cudaError_t fp4_mma_gemm_init(void)
{
    cudaError_t err = cudaFuncSetAttribute(fp4_w4a16_mma_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           NST * STAGE_FP4);
    if (err != cudaSuccess) return err;
    return cudaFuncSetAttribute(fp4_w16a16_mma_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, NST * STAGE_BF16);
}

extern "C" cudaError_t fp4_mma_gemm(const fp4_mma_gemm_args *p, cudaStream_t stream)
{
    if (!p || !p->a || !p->out || p->k < BK || p->k % BK || p->n < 64 || p->n % 64 ||
        p->n_tiles_m < 1 || p->n_tiles_m > 0x7fffffff / BM || (!p->tile_expert && p->row_dst) ||
        p->fold || p->handoff) /* sm90-wgmma's contract only */
        return cudaErrorInvalidValue;
    if (p->wfmt == FP4_MMA_W_NVFP4 ? (!p->wq || !p->ws) : (p->wfmt != FP4_MMA_W_BF16 || !p->wb))
        return cudaErrorInvalidValue;
    unsigned ny = p->gated ? (unsigned)(p->n / 64) : (unsigned)((p->n + BW - 1) / BW);
    if (ny > 65535) return cudaErrorInvalidValue;
    dim3 grid((unsigned)p->n_tiles_m, ny);
    const int nv = p->wfmt == FP4_MMA_W_NVFP4;
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg =
        fp4_pdl_config(grid, dim3(THREADS), nv ? NST * STAGE_FP4 : NST * STAGE_BF16, stream, at);
    return cudaLaunchKernelEx(&cfg, nv ? fp4_w4a16_mma_kernel : fp4_w16a16_mma_kernel, *p);
}
