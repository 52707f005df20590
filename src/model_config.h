/*
 * model_config.h - the architecture read from config.json (with or without a "text_config"
 * wrapper): sizes, which layers are dense or MoE, router and activation constants, and the
 * tensor-name family of the experts. Every constant of the MoE computation comes from here.
 */
#ifndef FP4MOE_MODEL_CONFIG_H
#define FP4MOE_MODEL_CONFIG_H

#include <cjson/cJSON.h>

#include "common.h"

typedef enum fp4_act { FP4_ACT_SILU = 0, FP4_ACT_SWIGLUOAI } fp4_act;
typedef enum fp4_scoring { FP4_SCORE_SIGMOID = 0, FP4_SCORE_SOFTMAX } fp4_scoring;
typedef enum fp4_naming {
    FP4_NAMES_MINIMAX = 0, /* block_sparse_moe.experts.{j}.w1|w3|w2, block_sparse_moe.gate */
    FP4_NAMES_MLP          /* mlp.experts.{j}.{gate,up,down}_proj, mlp.gate */
} fp4_naming;

#define FP4_MAX_LAYERS 512

typedef struct fp4_arch {
    char model_type[64];      /* config "model_type" (inner one under text_config) */
    char prefix[32];          /* tensor-name prefix: "" or "language_model." (text_config) */
    int hidden;               /* hidden_size H */
    int n_layers;             /* num_hidden_layers */
    int dense_intermediate;   /* intermediate_size of dense MLP layers */
    int n_experts;            /* routed experts E */
    int moe_intermediate;     /* per-expert intermediate I */
    int shared_intermediate;  /* shared expert intermediate (0: no shared expert) */
    int topk;                 /* num_experts_per_tok */
    fp4_act act;              /* hidden_act: "silu" or "swigluoai" */
    float swiglu_limit;       /* swiglu_limit (0: no clamp) */
    float swiglu_alpha;       /* swiglu_alpha (1.702 default for swigluoai) */
    fp4_scoring scoring;      /* scoring_func: "sigmoid" or "softmax" */
    int has_score_bias;       /* router has e_score_correction_bias */
    int norm_topk;            /* norm_topk_prob: renormalize the chosen weights */
    float routed_scaling;     /* routed_scaling_factor (1.0 default) */
    fp4_naming naming;
    unsigned char is_moe[FP4_MAX_LAYERS]; /* per layer: 1 MoE, 0 dense */
} fp4_arch;

/* Parse config.json (already parsed to cJSON). path is for messages only. */
fp4moe_status fp4_arch_parse(const cJSON *config, const char *path, fp4_arch *out, fp4_err *e);

/* Tensor-name helpers: write the full name of a layer's tensor into buf (returns 0 if it did
 * not fit). which: "gate" (w1), "up" (w3), "down" (w2). suffix e.g. "weight_scale". */
int fp4_name_expert(const fp4_arch *a, char *buf, size_t len, int layer, int expert,
                    const char *which, const char *suffix);
int fp4_name_shared(const fp4_arch *a, char *buf, size_t len, int layer, const char *which,
                    const char *suffix);
int fp4_name_dense(const fp4_arch *a, char *buf, size_t len, int layer, const char *which,
                   const char *suffix);
int fp4_name_router(const fp4_arch *a, char *buf, size_t len, int layer, const char *what);
                    /* what: "weight" or "bias" (e_score_correction_bias) */
/* The linear-module prefix (no suffix) used for scheme lookup, e.g.
 * "model.layers.3.block_sparse_moe.experts.5.w1". */
int fp4_name_expert_module(const fp4_arch *a, char *buf, size_t len, int layer, int expert,
                           const char *which);
int fp4_name_shared_module(const fp4_arch *a, char *buf, size_t len, int layer,
                           const char *which);
int fp4_name_dense_module(const fp4_arch *a, char *buf, size_t len, int layer,
                          const char *which);

/* Layer index of a tensor name "...model.layers.{i}...." or -1 for non-layer tensors. */
int fp4_name_layer_index(const char *tensor_name);

#endif /* FP4MOE_MODEL_CONFIG_H */
