/*
 * moe_route.cuh - launcher of the MoE router (moe_route.cu): a tensor-core logits pass plus
 * a warp-per-token top-k, two launches, grids fixed by m. C-callable.
 */
#ifndef FP4MOE_MOE_ROUTE_CUH
#define FP4MOE_MOE_ROUTE_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_ROUTE_MAX_EXPERTS 256

/* One-time setup (raises the dynamic shared-memory limit of the logits kernels; the wgmma
 * one only on sm_90). */
cudaError_t fp4_moe_route_init(void);

/* 1 when fp4_moe_route computes m tokens' logits (hidden size h) with the wgmma kernel
 * (route_logits_sm90.cuh) on the current device, 0 with the mma.sync one. */
int fp4_moe_route_uses_wgmma(int m, int h);

/* Device scratch fp4_moe_route needs for m tokens and E experts (partial logits): a bound
 * that never decreases with m, min(32 m, max(m, 32768 / ceil(E / 64))) * E floats. */
size_t fp4_moe_route_scratch_bytes(int m, int n_experts);

/* Per token t < m: logits = router[E, H] . x[t] (bf16 x; planes: the router as three bf16
 * planes [3][E, H], fp4_gpu_router_split in gpu_moe.h; fp32
 * accumulation on the tensor cores); p = sigmoid or softmax (scoring 0/1); top-k by p + bias
 * (bias may be NULL), ties to the lower id, ids in descending selection order; w = p
 * (renormalized over the k chosen if norm_topk) * scaling. ids[m, k], w[m, k].
 * scratch: scratch_bytes >= fp4_moe_route_scratch_bytes(m, E), dead after the call's
 * kernels. Needs E <= 256, 1 <= k <= E, h % 32 == 0, h <= 16384, x and planes 16-byte
 * aligned. */
cudaError_t fp4_moe_route(const uint16_t *x, const uint16_t *planes, const float *bias, int m,
                          int h, int n_experts, int k, int scoring, int norm_topk,
                          float scaling, void *scratch, size_t scratch_bytes, int32_t *ids,
                          float *w, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_MOE_ROUTE_CUH */
