/*
 * quant_scheme.h - every quantization-metadata shape of DESIGN.md section 3 (ModelOpt
 * hf_quant_config.json or config.json quantization_config with quant_method "modelopt";
 * compressed-tensors config_groups; the MiniMax-M3.1 mxfp8 + moe NVFP4 form) normalized to
 * one scheme per linear layer: a weight scheme and an activation scheme.
 */
#ifndef FP4MOE_QUANT_SCHEME_H
#define FP4MOE_QUANT_SCHEME_H

#include <cjson/cJSON.h>

#include "common.h"

typedef enum fp4_wscheme { FP4_W_BF16 = 0, FP4_W_NVFP4, FP4_W_MXFP8 } fp4_wscheme;
typedef enum fp4_ascheme {
    FP4_A_NONE = 0,        /* A16: activations stay 16-bit */
    FP4_A_NVFP4_STATIC,    /* A4, per-tensor static input_scale */
    FP4_A_NVFP4_PER_TOKEN  /* A4, dynamic per-token scale t_m = amax/(448*6) */
} fp4_ascheme;

typedef struct fp4_scheme {
    fp4_wscheme w;
    fp4_ascheme a;
} fp4_scheme;

typedef enum fp4_qformat {
    FP4_QF_NONE = 0,        /* unquantized checkpoint */
    FP4_QF_MODELOPT,
    FP4_QF_COMPRESSED_TENSORS,
    FP4_QF_MINIMAX_M31
} fp4_qformat;

const char *fp4_wscheme_name(fp4_wscheme w);   /* "nvfp4", "mxfp8", "bf16" */
const char *fp4_ascheme_name(fp4_ascheme a);   /* "none", "nvfp4-static", "nvfp4-per-token" */
const char *fp4_qformat_name(fp4_qformat f);   /* "none", "modelopt", "compressed-tensors",
                                                  "minimax-m31" */

typedef struct fp4_quant fp4_quant; /* opaque: the normalized rules */

/* config: parsed config.json (the whole file; quantization_config may sit at top level or
 * under text_config). hf_quant: parsed hf_quant_config.json or NULL. dir: for messages. */
fp4moe_status fp4_quant_parse(const cJSON *config, const cJSON *hf_quant, const char *dir,
                              fp4_quant **out, fp4_err *e);
void fp4_quant_destroy(fp4_quant *q);
fp4_qformat fp4_quant_format(const fp4_quant *q);

/* The scheme of one linear module, named without suffix and without any "language_model."
 * prefix, e.g. "model.layers.3.block_sparse_moe.experts.5.w1" or "lm_head". */
fp4_scheme fp4_quant_scheme_for(const fp4_quant *q, const char *module);

#endif /* FP4MOE_QUANT_SCHEME_H */
