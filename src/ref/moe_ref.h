/*
 * moe_ref.h - the CPU reference forward of one MLP/MoE block (DESIGN.md section 4) on exactly
 * dequantized weights, and its A4 emulation mode: FC1/FC2 inputs quantized to NVFP4 as each
 * linear's activation scheme declares (static input_scale, or per token t_m = amax/(448*6)).
 */
#ifndef FP4MOE_MOE_REF_H
#define FP4MOE_MOE_REF_H

#include <stdint.h>

#include "../common.h"
#include "../model_config.h"
#include "../moe_weights.h"

typedef struct fp4_ref_opts {
    int emulate_a4;  /* 1: quantize linear inputs per their declared activation scheme */
    int fp64;        /* 1: accumulate dot products in double (tests) */
} fp4_ref_opts;

/* Router only: ids[M, k] (chosen experts, by descending selection score) and weights[M, k]
 * (renormalized if the config says so, times routed_scaling). Ties break to the lower id. */
void fp4_ref_route(const fp4_arch *a, const float *router, const float *bias, const float *x,
                   int m, int32_t *ids, float *weights);

/* y[M, H] = sum_k w_k * expert_k(x) + shared(x). ids/weights may be NULL. */
fp4moe_status fp4_ref_moe_forward(const fp4_arch *a, const fp4_moe_weights *w, const float *x,
                                  int m, const fp4_ref_opts *o, float *y, int32_t *ids,
                                  float *weights, fp4_err *e);

/* Dense MLP: y[M, H] = down(act(gate x, up x)). */
fp4moe_status fp4_ref_dense_forward(const fp4_arch *a, const fp4_dense_weights *w,
                                    const float *x, int m, const fp4_ref_opts *o, float *y,
                                    fp4_err *e);

/* The activation of DESIGN.md section 4, on one (gate, up) pair. */
float fp4_ref_act(const fp4_arch *a, float g, float u);

#endif /* FP4MOE_MOE_REF_H */
