/*
 * w4a16_mma_gemm.cuh - launchers of the grouped MoE GEMM on mma.sync BF16 tensor cores
 * (w4a16_mma_gemm.cu): NVFP4 weights dequantized in registers, or BF16 weights. C-callable.
 */
#ifndef FP4MOE_W4A16_MMA_GEMM_CUH
#define FP4MOE_W4A16_MMA_GEMM_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_MMA_TILE_M 64   /* token rows per tile: the grouping's segment padding */
#define FP4_MMA_TILE_K 64   /* K must be a multiple of this */
#define FP4_MMA_GATED_N 64  /* gated: I columns per tile (I must be a multiple) */
#define FP4_MMA_PLAIN_N 128 /* plain: output columns per tile (N a multiple of 64) */

typedef enum fp4_mma_wfmt {
    FP4_MMA_W_NVFP4 = 0, /* wq: codes in 8-row tiles, ws [E][rows][K/16] (src/gpu_pack.h) */
    FP4_MMA_W_BF16       /* wb [E][rows][K] bf16 */
} fp4_mma_wfmt;

typedef struct fp4_mma_gemm_args {
    int wfmt;                   /* fp4_mma_wfmt */
    int gated;                  /* 1: weight rows [0, n) gate and [n, 2n) up; output
                                   act(gate, up) as bf16 [rows, n]. 0: fp32 (or bf16,
                                   out_bf16) [.., n] */
    int act;                    /* gated: 0 silu(g) * u, 1 swigluoai */
    float limit, alpha;         /* swigluoai clamp (0: none) and alpha */
    int n, k;                   /* output columns, reduction length */
    int n_tiles_m;              /* tile slots (grid x) */
    const uint16_t *a;          /* bf16 activations [a_rows, k] */
    int a_rows;                 /* rows of a (bound for the identity row mapping) */
    const int32_t *tile_expert; /* [n_tiles_m] expert of each slot, -1: none. NULL: one
                                   expert (0), tile s covers rows s*64.. of a directly */
    const int32_t *row_src;     /* [n_tiles_m * 64] row of a per padded row (-1: zero) or
                                   NULL: padded row r reads a[r] when r < a_rows */
    const int32_t *row_dst;     /* plain: [n_tiles_m * 64] output row (-1: skip) or NULL:
                                   padded row r writes out[r] when r < out_rows */
    const float *row_w;         /* plain (and gated with fold): [n_tiles_m * 64] multiplier,
                                   or NULL (1) */
    int out_rows;               /* identity-mapped output bound */
    const uint8_t *wq;          /* NVFP4 codes (src/gpu_pack.h) */
    const uint8_t *ws;          /* NVFP4 block scales, packed words (src/gpu_pack.h) */
    const uint16_t *wb;         /* BF16 weights */
    const float *gscale;        /* NVFP4: per expert fp32 global scale(s), [E][2] (gate, up)
                                   when gated, [E] when plain. NULL: 1 */
    void *out;                  /* gated: bf16 [.., n]; plain: fp32 [.., n], or bf16 when
                                   out_bf16 */
    int out_bf16;               /* plain: 1 writes bf16 (rounded to nearest even) */
    int rows_per_expert;        /* average token rows per expert of the launch, 0: unknown
                                   (a hint: sm90-wgmma picks its FC2 variant by it) */
    int fold;                   /* sm90-wgmma only (fp4_mma_gemm refuses it): the plain
                                   launch's per-row multiplier moved into the gated one.
                                   Gated: output row r times row_w[r] x fold_gscale[expert] x
                                   2^7 (NULL: 1) before its rounding to bf16. Plain: a's rows
                                   carry it, so neither row_w nor gscale is applied (and the
                                   kernel's 2^-7 not undone: see sm90_w4a16_wgmma.cuh) */
    const float *fold_gscale;   /* gated with fold: the plain launch's per-expert [E] global
                                   scale. NULL: 1 */
    int32_t *handoff;           /* sm90-wgmma only (fp4_mma_gemm refuses it): the FC1 -> FC2
                                   hand-off's unit counters, zeroed by the grouping
                                   (moe_group.cuh unit_done); NULL: none. Contract in
                                   sm90_w4a16_wgmma.cuh */
} fp4_mma_gemm_args;

/* One-time setup (dynamic shared-memory limits). Call before the first launch. */
cudaError_t fp4_mma_gemm_init(void);

/* Checks k % 64, n % 64, pointers; returns cudaErrorInvalidValue when they fail. */
cudaError_t fp4_mma_gemm(const fp4_mma_gemm_args *args, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_W4A16_MMA_GEMM_CUH */
