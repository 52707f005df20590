/*
 * w4a16_decode.cuh - launchers of the decode-specialised MoE kernels (w4a16_decode.cu): few
 * tokens per expert, weights as the M operand of mma.sync m16n8k16 (swap AB), tokens as the
 * N = 8 operand. Same device weight layout as the MMA kernel (src/gpu_pack.h). C-callable.
 */
#ifndef FP4MOE_W4A16_DECODE_CUH
#define FP4MOE_W4A16_DECODE_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_DEC_TILE_T 8 /* tokens per slot (the mma N width) unless tile_t says 16 or 32 */

typedef enum fp4_dec_wfmt {
    FP4_DEC_W_NVFP4 = 0, /* wq: codes in 8-row tiles, ws [E][rows][K/16] (src/gpu_pack.h) */
    FP4_DEC_W_BF16       /* wb [E][rows][K] bf16 */
} fp4_dec_wfmt;

#ifdef __CUDACC__
#define FP4_DEC_HD __host__ __device__
#else
#define FP4_DEC_HD
#endif

#define FP4_DEC_MAX_EXPERTS 256

/* Activation layouts. NVFP4 weights read their activations "paired": within each 64-element
 * group, lane quad t of a warp finds its mma B fragments of the four k16 blocks (elements
 * 16j + 2t, +1 and 16j + 2t + 8, +9) in 32 contiguous bytes: element k of the group at
 * 16t + 8c + 2 (2 jj + h) + e for k = 32c + 16jj + 8h + 2t + e. BF16 weights read the natural
 * layout. */
static inline FP4_DEC_HD int fp4_dec_pair_pos(int k)
{
    int r = k & 63, c = r >> 5, jj = (r >> 4) & 1, h = (r >> 3) & 1, t = (r & 7) >> 1, e = r & 1;
    return (k & ~63) + 16 * t + 8 * c + 2 * (2 * jj + h) + e;
}

typedef struct fp4_dec_gemm_args {
    int wfmt;                   /* fp4_dec_wfmt; also the layout of a (and of out, gated) */
    int gated;                  /* 1: rows [0, n) gate, [n, 2n) up -> act(gate, up) bf16
                                   [padded rows, n]; 0: fp32 [.., n] */
    int act;                    /* gated: 0 silu(g) * u, 1 swigluoai */
    float limit, alpha;         /* swigluoai clamp (0: none) and alpha */
    int n, k;                   /* output columns, reduction length (k % 64 == 0) */
    int n_slots;                /* slots to launch (grid x); slots of expert -1 exit */
    const uint16_t *a;          /* bf16 activations [a_rows, k], layout by wfmt */
    int a_rows;
    const int32_t *tile_expert; /* [n_slots] expert per slot, -1 none; NULL: expert 0 and
                                   slot s covers rows s*8.. of a (identity) */
    const int32_t *row_src;     /* [n_slots * T] row of a per padded row (-1 none) or NULL:
                                   padded row r reads a[r] when r < a_rows */
    const int32_t *row_dst;     /* plain: [n_slots * T] output row (-1 skip) or NULL: padded
                                   row r writes out[r] when r < out_rows */
    const float *row_w;         /* plain: [n_slots * T] multiplier or NULL (1) */
    int out_rows;               /* identity-mapped output bound; gated: rows of out */
    const uint8_t *wq;          /* NVFP4 codes (src/gpu_pack.h) */
    const uint8_t *ws;          /* NVFP4 block scales, packed words (src/gpu_pack.h) */
    const uint16_t *wb;         /* BF16 weights */
    const float *gscale;        /* per expert global scale(s): [E][2] gated, [E] plain; NULL 1 */
    void *out;                  /* gated: bf16 [padded rows, n] (layout by wfmt); plain: fp32,
                                   or bf16 when out_bf16 */
    int out_bf16;               /* plain: 1 writes bf16 (rounded to nearest even) */
    int tiles_per_warp;         /* m16 weight tiles per warp sharing one B fragment: 2 (NVFP4
                                   only; halves activation re-reads), else 1 */
    int weights_first;          /* plain NVFP4 with programmatic dependent launch: 1 when the
                                   writer of the slot table (tile_expert, row_dst, row_w) has
                                   surely completed before this kernel can launch, e.g. the
                                   kernel before waited for it before it let this one launch
                                   (a decode FC1 does), or an earlier kernel of the chain did
                                   (the shared FC1 ahead of the shared FC2 ahead of the
                                   one-token FC2): the table and the weights are then read,
                                   and the first weight copies issued, before this kernel's
                                   wait for the activations. 0: wait first */
    int one_token;              /* plain NVFP4, 8-token slots, n_slots 1: every row of the
                                   table belongs to one token (M = 1) and the table has at
                                   most 8 slots (a_rows / 8); the warps of each block run the
                                   slots, one or more a slot over parts of K (as many as the 8
                                   warps allow), and the block writes out fp32 [n] = (out
                                   if accumulate) + the sum over slots, in slot order, of
                                   row_w x each row's product: FC2 and the combine in one;
                                   out_bf16 must be 0 */
    int accumulate;             /* one_token: add to out instead of overwriting it */
    int tile_t;                 /* tokens per slot: 8 (0 means 8), or 16 / 32 (NVFP4 only: one
                                   dequantized weight fragment feeds 2 / 4 n8 mma tiles, at
                                   32 only those that hold tokens; tiles_per_warp is taken
                                   as 2, and long K runs as 2 K slices that share staged
                                   activations); the rows above are [n_slots * tile_t] */
} fp4_dec_gemm_args;

/* Slots that can hold work for m*k pairs over E experts with slots of tile_t tokens: the
 * grid bound. */
static inline int fp4_dec_active_slots(int m, int k, int n_experts, int tile_t)
{
    long long p = (long long)m * k;
    return (int)((p + tile_t - 1) / tile_t + (p < n_experts ? p : n_experts));
}

/* Prologue of a decode forward, one launch: groups the m*k pairs of ids / w by expert into
 * slots of tile_t (8, 16 or 32) tokens (same outputs as fp4_moe_group with tile_m = tile_t,
 * n_slots = fp4_moe_group_slots(m, k, E, tile_t, 1)) and, when xp is not NULL, writes x [m, h]
 * (bf16, natural) into xp [m, h] in the paired layout. */
cudaError_t fp4_dec_prep(const int32_t *ids, const float *w, int m, int k, int n_experts,
                         int n_slots, int tile_t, int32_t *tile_expert, int32_t *row_src, int32_t *row_dst,
                         float *row_w, const uint16_t *x, int h, uint16_t *xp,
                         cudaStream_t stream);

/* Small-M router + prologue, two launches (no per-token pass over the router matrix):
 * logits [m, E] by E x ceil(m / 8) blocks that each read one router row once (and write xp,
 * the paired x), then one block: scores and top-k exactly as fp4_moe_route (ties to the
 * lower id), ids / w [m, k], and the grouping of fp4_dec_prep (the rows of one expert in
 * token order, deterministic). logits is fp32 [m, E]
 * scratch. Needs m <= FP4_DEC_ROUTE_MAX_M, h % 64 == 0, h <= FP4_DEC_ROUTE_MAX_H. */
#define FP4_DEC_ROUTE_MAX_M 64
#define FP4_DEC_ROUTE_MAX_H 8192
cudaError_t fp4_dec_route_prep(const uint16_t *x, const float *router, const float *bias,
                               int m, int h, int n_experts, int k, int scoring, int norm_topk,
                               float scaling, float *logits, int32_t *ids, float *w,
                               int n_slots, int32_t *tile_expert, int32_t *row_src,
                               int32_t *row_dst, float *row_w, uint16_t *xp,
                               cudaStream_t stream);

/* Checks k % 64, n % 16, pointers (NVFP4: wq 16-byte, ws 4-byte aligned); returns
 * cudaErrorInvalidValue when they fail. */
cudaError_t fp4_dec_gemm(const fp4_dec_gemm_args *args, cudaStream_t stream);

/* One-time setup per device (shared-memory limits of the kernels that stage activations).
 * Call before the first fp4_dec_gemm. */
cudaError_t fp4_dec_gemm_init(void);

/* The bound of the launcher's rule for 8-token slots of long K: staged activations over 2 K
 * slices (KS 2) instead of 8 (KS 8) from this many blocks per SM of the KS 2 grid on (12).
 * Tests lower it to run the staged kernel on small shapes; returns the previous bound. Not
 * thread-safe: set it before any forward. */
int fp4_dec_set_ks2_per_sm(int per_sm);

/* Scale chunks (on by default): K-split launches whose K slices are 16-byte aligned in the
 * scale array copy a row's block scales 4 groups at a time instead of one group at a time;
 * the output is the same bit for bit. 0 turns them off (tests compare both); returns the
 * previous setting. Not thread-safe: set it before any forward. */
int fp4_dec_set_scale_chunks(int on);
/* 1 when the last fp4_dec_gemm call launched a kernel with scale chunks (0 when it refused its
 * arguments): tests check that the switch reached one. With several host threads, some
 * thread's last. */
int fp4_dec_last_scale_chunks(void);

/* The shallow weight ring of the KS 8 kernels: with one tile a warp, the one-token FC2
 * included, 2 groups in flight per warp instead of 7 (the launcher's rule: one-wave grids
 * with 24 or more weight-streaming warps per SM); with two tiles a warp, 2 groups instead of
 * 3 (the rule: always).
 * force: 0 the rule, 1 every launch that has the shallow form, 2 none; returns the previous
 * setting. The output is the same bit for bit (tests compare them). Not thread-safe: set it
 * before any forward. fp4_dec_last_shallow: 1 when the last fp4_dec_gemm call launched the
 * shallow form (with several host threads, some thread's last). */
int fp4_dec_set_shallow_ring(int force);
int fp4_dec_last_shallow(void);

/* Unrolled K loops (on by default): the RT 2 kernels of KS 1 and 8 whose warps each run 6 or
 * 12 groups of K (FC2 K = 384 at KS 1, FC1 K = 6144 and FC2 K = 3072 at KS 8) are compiled
 * with that count as a constant. The output is the same bit for bit (tests compare both). 0
 * turns them off; returns the previous setting. Not thread-safe: set it before any forward.
 * fp4_dec_last_ng: the constant of the last fp4_dec_gemm call's kernel (6 or 12; 0 none). */
int fp4_dec_set_ng(int on);
int fp4_dec_last_ng(void);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_W4A16_DECODE_CUH */
