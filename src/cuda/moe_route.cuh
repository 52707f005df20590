/*
 * moe_route.cuh - launcher of the MoE router kernel (moe_route.cu). C-callable.
 */
#ifndef FP4MOE_MOE_ROUTE_CUH
#define FP4MOE_MOE_ROUTE_CUH

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_ROUTE_MAX_EXPERTS 256

/* One-time setup (raises the dynamic shared-memory limit for hidden sizes up to 16384). */
cudaError_t fp4_moe_route_init(void);

/* Per token t < m: logits = router[E, H] . x[t] (bf16 x, fp32 math); p = sigmoid or softmax
 * (scoring 0/1); top-k by p + bias (bias may be NULL), ties to the lower id, ids in
 * descending selection order; w = p (renormalized over the k chosen if norm_topk) * scaling.
 * ids[m, k], w[m, k]. Needs E <= 256, 1 <= k <= E, h % 4 == 0, h <= 16384. */
cudaError_t fp4_moe_route(const uint16_t *x, const float *router, const float *bias, int m,
                          int h, int n_experts, int k, int scoring, int norm_topk,
                          float scaling, int32_t *ids, float *w, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_MOE_ROUTE_CUH */
