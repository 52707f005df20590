/*
 * moe_combine.cuh - launcher of the deterministic top-k combine (moe_combine.cu).
 */
#ifndef FP4MOE_MOE_COMBINE_CUH
#define FP4MOE_MOE_COMBINE_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[t, :] = (accumulate ? y[t, :] : 0) + sum over s < k, in slot order and in fp32, of
 * pairs[t*k + s, :] (already weighted). y[m, h] fp32, pairs[m*k, h] bf16; h % 8 == 0, both
 * 16-byte aligned (cudaErrorInvalidValue otherwise). */
cudaError_t fp4_moe_combine(const uint16_t *pairs, int m, int k, int h, int accumulate,
                            float *y, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_MOE_COMBINE_CUH */
