/*
 * route_logits_sm90.cuh - launcher of the router's logits kernel on wgmma (route_logits_sm90.cu,
 * sm_90a only). moe_route.cu decides when it serves. C-callable.
 */
#ifndef FP4MOE_ROUTE_LOGITS_SM90_CUH
#define FP4MOE_ROUTE_LOGITS_SM90_CUH

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_RW_TOKENS 256  /* tokens per block */
#define FP4_RW_EXPERTS 128 /* experts per block */

/* One-time setup for the current device: cudaErrorInvalidDeviceFunction where it is not
 * compute capability 9.0 or the binary lacks sm_90a code; the launcher refuses until this
 * succeeded. */
cudaError_t fp4_route_logits_sm90_init(void);

/* 1 after a successful init on the current device. */
int fp4_route_logits_sm90_ready(void);

/* part[q][t][e] (q < split, t < m, e < E) = the sum over K tiles [nk q / split,
 * nk (q + 1) / split) of nk = h / 64 of router[e] . x[t] from the three planes [3][E, h].
 * Needs h % 64 == 0, 1 <= split <= h / 64, x and planes 16-byte aligned. */
cudaError_t fp4_route_logits_sm90(const uint16_t *x, const uint16_t *planes, int m, int h,
                                  int n_experts, int split, float *part, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_ROUTE_LOGITS_SM90_CUH */
