/*
 * moe_weights.h - one layer's MLP/MoE weights as views into the checkpoint's read-only
 * mappings (no copies except the small fp32 router), in checkpoint layout. The CPU reference
 * reads them directly; GPU backends convert them to their own layout at load.
 */
#ifndef FP4MOE_MOE_WEIGHTS_H
#define FP4MOE_MOE_WEIGHTS_H

#include <stdint.h>

#include "common.h"
#include "quant_scheme.h"

typedef struct fp4_linear {
    fp4_scheme scheme;
    int n, k;                /* out_features, in_features */
    const uint8_t *w;        /* nvfp4: [n, k/2] packed e2m1 (low nibble first)
                                mxfp8: [n, k] e4m3;  bf16: [n, k] bf16 as uint16 pairs */
    const uint8_t *scale;    /* nvfp4: [n, k/16] e4m3;  mxfp8: [n, k/32] ue8m0;  bf16: NULL */
    float global_scale;      /* nvfp4 decode scale (weight_scale_2 = 1/weight_global_scale) */
    float input_scale;       /* nvfp4-static activation decode scale; 0 when not declared */
} fp4_linear;

typedef struct fp4_moe_weights {
    int layer;
    int n_experts, hidden, inter;  /* E, H, I */
    float *router;                 /* [E, H] fp32, owned */
    float *router_bias;            /* [E] fp32 or NULL, owned */
    fp4_linear *gate, *up, *down;  /* [E] each, owned arrays: gate/up [I, H], down [H, I] */
    int has_shared;
    int shared_inter;
    fp4_linear sh_gate, sh_up, sh_down; /* [Is, H], [Is, H], [H, Is] */
} fp4_moe_weights;

typedef struct fp4_dense_weights {
    int layer, hidden, inter;
    fp4_linear gate, up, down;     /* [I, H], [I, H], [H, I] */
} fp4_dense_weights;

/* Dequantize rows [r0, r0+nr) of a linear exactly (DESIGN.md section 2) into out[nr, k]. */
void fp4_linear_dequant_rows(const fp4_linear *l, int r0, int nr, float *out);

void fp4_moe_weights_free(fp4_moe_weights *w);

#endif /* FP4MOE_MOE_WEIGHTS_H */
