/*
 * sm90_w4a16_wgmma.cuh - launcher of the Hopper (sm_90a) grouped MoE GEMM on wgmma
 * (sm90_w4a16_wgmma.cu). Same contract as fp4_mma_gemm (w4a16_mma_gemm.cuh): the same
 * fp4_mma_gemm_args, the same load-time NVFP4 layout (src/gpu_pack.h), the same grouping
 * tables of 64-row tile slots, the same outputs. NVFP4 weights only (BF16 weights: use
 * fp4_mma_gemm). C-callable.
 * Its own, beside that contract: args.fold (fp4_mma_gemm refuses it). A gated launch with fold
 * multiplies output row r by row_w[r] x fold_gscale[expert] x 2^7 before rounding it to bf16;
 * a plain launch with fold over those rows (row_src NULL: the same padded row space) applies
 * neither row_w nor gscale nor its 2^7 (its dequantized weights are w x s x 2^-7), so that
 * its stores multiply nothing. The pair computes FC2(h x w) where the two without fold compute
 * FC2(h) x w: equal but for the rounding of h to bf16.
 * And args.handoff, the FC1 -> FC2 hand-off: a pair of launches, gated then plain, over the
 * same slots (n_tiles_m), one right after the other on a stream, the plain one's k the gated
 * one's n, both with the same zeroed counters (moe_group.cuh unit_done). Each CTA of the gated
 * launch adds 1 to the counter of its unit (slots 2u, 2u + 1) once its output rows are
 * stored (release); a CTA of the plain launch's unit v waits (acquire) until the counters of
 * v and v - 1 (an expert's tail in slot 2v may be FC1 unit v - 1's) count every gated CTA of
 * their unit (k / 64) instead of waiting for the whole gated grid, so with programmatic
 * dependent launch FC2 runs in the SM slots that FC1's last wave leaves idle. No deadlock:
 * the plain grid starts only once every gated CTA has started (each triggers after its
 * wait). The plain grid's last CTA still waits for the gated grid before it exits, so the
 * plain grid completes after the gated one (the next grouping zeroes the counters).
 */
#ifndef FP4MOE_SM90_W4A16_WGMMA_CUH
#define FP4MOE_SM90_W4A16_WGMMA_CUH

#include <cuda_runtime_api.h>

#include "w4a16_mma_gemm.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* One-time setup for the current device: checks that it is compute capability 9.0 and that
 * the sm_90a kernels are in the binary (cudaErrorInvalidDeviceFunction otherwise), raises the
 * dynamic shared-memory limit. fp4_sm90_wgmma_gemm refuses to launch until this succeeded. */
cudaError_t fp4_sm90_wgmma_gemm_init(void);

/* Should this kernel serve the call? 1 for NVFP4 weights with k % 64 == 0 and n % 64 == 0
 * after a successful init; 0 otherwise (fall back to fp4_mma_gemm). */
int fp4_sm90_wgmma_gemm_serves(const fp4_mma_gemm_args *args);

/* cudaErrorInvalidDeviceFunction before a successful init (not sm_90), cudaErrorNotSupported
 * for BF16 weights, cudaErrorInvalidValue for bad shapes / pointers (a, out 16-byte aligned). */
cudaError_t fp4_sm90_wgmma_gemm(const fp4_mma_gemm_args *args, cudaStream_t stream);

/* Scale chunks (on by default): the gated kernel's bodies below 128 tokens copy their block
 * scales 16 bytes a row per 4 K tiles where k % 256 == 0 and ws is 16-byte aligned, instead
 * of 4 bytes per K tile (the DEEP form's 128-token body always does); the output is the same
 * bit for bit. 0 turns them off (tests compare both); returns the previous setting. Not
 * thread-safe: set it before any forward. */
int fp4_sm90_wgmma_set_scale_chunks(int on);
/* The resident-token FC2 kernels (k <= FP4_WG_RES_K, bf16 out, fold) with their K loop
 * unrolled where k == 384 and n % 128 == 0 (on by default); the output is the same bit for
 * bit. 0 turns it off (tests compare both); returns the previous setting. Not thread-safe. */
int fp4_sm90_wgmma_set_k_unroll(int on);
/* The launcher's size bounds, in rows per expert (args.rows_per_expert: m top-k / E rounded
 * up), here so that the tests that count which form ran use the same numbers. Plain (FC2)
 * with k <= FP4_WG_RES_K: the token tile resident (wg_res) up to FP4_WG_RES_ROWS, with its
 * 16- and 24-token bodies up to FP4_WG_RES_SMALL; the resident kernel's BIG form above
 * FP4_WG_BIG_ROWS; column strips between, if any. Plain with longer k: column strips up to
 * FP4_WG_STRIP_ROWS, the one-tile kernel above. Gated (FC1): the DEEP form above
 * FP4_WG_DEEP_ROWS where k % 256 == 0. */
#define FP4_WG_RES_K 384
#define FP4_WG_RES_ROWS 48
#define FP4_WG_RES_SMALL 24
#define FP4_WG_BIG_ROWS 48
#define FP4_WG_STRIP_ROWS 84
#define FP4_WG_DEEP_ROWS 88
/* What the last fp4_sm90_wgmma_gemm call launched (0 when it refused its arguments): the gated
 * kernel's bodies below 128 tokens with scale chunks, the DEEP form, a resident-token FC2
 * kernel with its K loop unrolled. Tests check that a switch or a rule reached the kernel they
 * mean; with several host threads, some thread's last. */
#define FP4_WG_RAN_SC 1
#define FP4_WG_RAN_DEEP 2
#define FP4_WG_RAN_NK 4
int fp4_sm90_wgmma_last_launch(void);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_SM90_W4A16_WGMMA_CUH */
