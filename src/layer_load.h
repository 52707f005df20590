/*
 * layer_load.h - bind one layer's MLP/MoE tensors from an open checkpoint into
 * fp4_moe_weights / fp4_dense_weights views, checking every dtype and shape against the
 * config and the layer's quantization scheme. Both tensor spellings are accepted:
 * ModelOpt (weight, weight_scale, weight_scale_2, input_scale) and compressed-tensors
 * (weight_packed, weight_scale, weight_global_scale, input_global_scale: the last two stored
 * as inverses); MXFP8 scales as weight_scale or weight_scale_inv; MiniMax-M3.1 experts with
 * gate and up stacked in w1 ([2I, H/2], two global scales) or separate w1/w3.
 */
#ifndef FP4MOE_LAYER_LOAD_H
#define FP4MOE_LAYER_LOAD_H

#include "checkpoint.h"
#include "moe_weights.h"

fp4moe_status fp4_load_moe_weights(fp4_ckpt *c, int layer, fp4_moe_weights *out, fp4_err *e);
fp4moe_status fp4_load_dense_weights(fp4_ckpt *c, int layer, fp4_dense_weights *out, fp4_err *e);

/* The declared schemes of a MoE layer's routed experts: FC1 (gate/up) and FC2 (down) of
 * expert 0 (the loader checks every expert agrees). */
fp4moe_status fp4_layer_expert_schemes(fp4_ckpt *c, int layer, fp4_scheme *fc1, fp4_scheme *fc2,
                                       fp4_err *e);

#endif /* FP4MOE_LAYER_LOAD_H */
