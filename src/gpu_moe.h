/*
 * gpu_moe.h - the GPU W4A16 MoE pipeline (host side, C11): load-time conversion of a layer's
 * weights to the kernels' layout, workspace query, and the forward pass (routing, grouping by
 * expert, FC1 with FP4->BF16 dequantization in registers on BF16 tensor cores, activation,
 * FC2, weighted combine plus shared expert). One stream, no host synchronisation inside the
 * forward, capturable in a CUDA graph; the caller owns the workspace.
 * Compiled on every machine; without a CUDA device the calls return FP4MOE_ERR_NOT_SUPPORTED.
 */
#ifndef FP4MOE_GPU_MOE_H
#define FP4MOE_GPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "model_config.h"
#include "moe_weights.h"

/* Kernel families of the pipeline. All of them run from the one device layout that
 * fp4_gpu_moe_create builds; which one runs for a call is decided by the oracle
 * (fp4_oracle_kernel), never here. */
typedef enum fp4_gpu_kernel {
    FP4_GPU_K_MMA = 0,  /* portable SM80+: mma.sync m16n8k16 BF16 tiles of 64 tokens, FP4
                           dequantized in registers */
    FP4_GPU_K_DECODE,   /* portable SM80+: few tokens per expert; weights are the mma M
                           operand (swap AB), 8-token slots, split K (w4a16_decode.cu) */
    FP4_GPU_K_SM90_WGMMA, /* sm_90a only: the MMA pipeline with its routed GEMMs on wgmma,
                           weights dequantized into A registers (sm90_w4a16_wgmma.cu); a
                           bf16 shared expert stays on mma.sync */
    FP4_GPU_K_COUNT
} fp4_gpu_kernel;

const char *fp4_gpu_kernel_name(fp4_gpu_kernel k); /* "mma", "decode", "sm90-wgmma" */

/* Number of CUDA devices (0 when none or no driver) and compute capability of device 0. */
int fp4_gpu_device_count(void);
int fp4_gpu_device_cc(int *major, int *minor); /* returns 0 when no device */

/* The router [n] fp32 as the tensor-core router reads it: planes [3][n] bf16 (hi, mid, lo),
 * hi and mid truncated, so that hi + mid + lo == router[i] exactly (24 significant bits =
 * 8 + 8 + at most 8; exact for |router[i]| >= 2^-110, where the last part keeps every bit).
 * Non-finite values: hi alone (mid = lo = 0). Host code, in every build. */
void fp4_gpu_router_split(const float *router, size_t n, uint16_t *planes);

typedef struct fp4_gpu_moe fp4_gpu_moe;

fp4moe_status fp4_gpu_moe_create(const fp4_arch *a, const fp4_moe_weights *w,
                                 fp4_gpu_moe **out, fp4_err *e);
void fp4_gpu_moe_destroy(fp4_gpu_moe *g);

/* The same, from the architecture alone (no device, no weights): for the oracle's backend
 * descriptors and inspect. 0 in a build without CUDA. */
size_t fp4_gpu_moe_workspace_for(const fp4_arch *a, int max_tokens);

/* Bytes of device workspace forward needs for up to max_tokens tokens, any kernel. */
size_t fp4_gpu_moe_workspace_size(const fp4_gpu_moe *g, int max_tokens);

/* For measuring the decode slot rule (bench --dec-slot-tokens): forwards above the fused
 * small-M router sizes (M > 32) use decode slots of t = 8, 16 or 32 tokens instead of the
 * rule's width; 0 restores the rule. Call before fp4_gpu_moe_workspace_size. Returns 0, or -1
 * for another t or a build without CUDA. */
int fp4_gpu_moe_set_dec_slot_tokens(fp4_gpu_moe *g, int t);

/* Device pointers: x_bf16[M, H] bf16, y[M, H] fp32, topk_ids[M, k] int32 and topk_w[M, k]
 * fp32 (both may be NULL). stream is a cudaStream_t. Asynchronous: no host sync. */
fp4moe_status fp4_gpu_moe_forward(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const void *x_bf16,
                                  int m, float *y,
                                  int32_t *topk_ids, float *topk_w, void *workspace,
                                  size_t workspace_bytes, void *stream, fp4_err *e);

/* Only the prologue of fp4_gpu_moe_forward with the same arguments: routing and grouping
 * (every launch before FC1), the part an engine that routes on its own, and the peer
 * benchmark, leave out. For bench, which reports the forward with and without it. */
fp4moe_status fp4_gpu_moe_prologue(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const void *x_bf16,
                                   int m, int32_t *topk_ids, float *topk_w, void *workspace,
                                   size_t workspace_bytes, void *stream, fp4_err *e);

/* Host convenience for tools and tests: x[M, H] fp32 on the host (rounded to bf16), y and
 * optional ids/weights on the host. Allocates, runs, synchronises. */
fp4moe_status fp4_gpu_moe_forward_host(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const float *x,
                                       int m, float *y,
                                       int32_t *topk_ids, float *topk_w, fp4_err *e);

#endif /* FP4MOE_GPU_MOE_H */
