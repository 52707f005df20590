/*
 * moe_combine.cuh - launcher of the deterministic top-k combine (moe_combine.cu).
 */
#ifndef FP4MOE_MOE_COMBINE_CUH
#define FP4MOE_MOE_COMBINE_CUH

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[t, :] = (accumulate ? y[t, :] : 0) + sum over s < k, in slot order, of
 * pairs[t*k + s, :] (already weighted). y[m, h], pairs[m*k, h] fp32; h % 4 == 0. */
cudaError_t fp4_moe_combine(const float *pairs, int m, int k, int h, int accumulate, float *y,
                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_MOE_COMBINE_CUH */
