/*
 * test_model_config.c - fp4_arch_parse on config.json literals shaped like real families
 * (MiniMax-M3.1 with a text_config wrapper, Qwen3-MoE, Mixtral, DeepSeek-style) and on
 * malformed ones, plus the tensor-name helpers. Expected values are written out by hand.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_config.h"

#include "check.h"



#define CHECK_INT(got, want, what) \
    CHECK((got) == (want), "%s: got %d, want %d", what, (int)(got), (int)(want))
#define CHECK_FLT(got, want, what) \
    CHECK((got) == (float)(want), "%s: got %g, want %g", what, (double)(got), (double)(want))
#define CHECK_STR(got, want, what) \
    CHECK(strcmp((got), (want)) == 0, "%s: got \"%s\", want \"%s\"", what, got, want)

/* Parse json; returns the status, fills a and e. */
static fp4moe_status parse(const char *json, fp4_arch *a, fp4_err *e)
{
    cJSON *c = cJSON_Parse(json);
    fp4moe_status st;
    fp4_err_clear(e);
    if (!c) {
        printf("FAIL: test JSON does not parse: %.80s\n", json);
        n_fail++;
        return FP4MOE_ERR_INTERNAL;
    }
    st = fp4_arch_parse(c, "config.json", a, e);
    cJSON_Delete(c);
    return st;
}

static int parse_ok(const char *json, fp4_arch *a, const char *label)
{
    fp4_err e;
    fp4moe_status st = parse(json, a, &e);
    CHECK(st == FP4MOE_OK, "%s: expected OK, got %s: %s", label, fp4moe_status_string(st), e.msg);
    return st == FP4MOE_OK;
}

/* Expect status st and every NULL-terminated substring in the message. */
static void parse_err(const char *json, fp4moe_status st_want, const char *label, ...)
{
    fp4_arch a;
    fp4_err e;
    fp4moe_status st = parse(json, &a, &e);
    va_list ap;
    const char *s;
    CHECK(st == st_want, "%s: expected %s, got %s (%s)", label, fp4moe_status_string(st_want),
          fp4moe_status_string(st), e.msg);
    va_start(ap, label);
    while ((s = va_arg(ap, const char *)) != NULL)
        CHECK(strstr(e.msg, s) != NULL, "%s: message lacks \"%s\": %s", label, s, e.msg);
    va_end(ap);
}

/* A MiniMax-M3.1-Flash config.json (text_config wrapper; dense layers by a moe_layer_freq
 * list or by layer_key_json, which replaces it when given). */
static char *minimax_json(int n_layers, const char *layer_key_json, const char *extra)
{
    size_t cap = 8192 + (size_t)n_layers * 8;
    char *b = malloc(cap), *p = b;
    p += sprintf(p, "{\"model_type\": \"minimax_m3_vl\", \"architectures\": "
                 "[\"MiniMaxM3SparseForConditionalGeneration\"], \"quantization_config\": "
                 "{\"quant_method\": \"mxfp8\", \"moe_quant_algo\": \"NVFP4\"}, "
                 "\"text_config\": {\"hidden_size\": 6144, \"num_hidden_layers\": %d, "
                 "\"intermediate_size\": 3072, \"dense_intermediate_size\": 12288, "
                 "\"shared_intermediate_size\": 3072, \"n_shared_experts\": 1, "
                 "\"num_local_experts\": 128, \"num_experts_per_tok\": 8, "
                 "\"hidden_act\": \"swigluoai\", \"scoring_func\": \"sigmoid\", "
                 "\"use_routing_bias\": true, \"routed_scaling_factor\": 2.0, "
                 "\"swiglu_alpha\": 1.702, \"swiglu_limit\": 7.0, \"head_dim\": 128, "
                 "\"num_attention_heads\": 64, \"num_key_value_heads\": 4, "
                 "\"vocab_size\": 200064%s", n_layers, extra ? extra : "");
    if (layer_key_json) {
        p += sprintf(p, ", %s", layer_key_json);
    } else {
        p += sprintf(p, ", \"moe_layer_freq\": [");
        for (int i = 0; i < n_layers; i++)
            p += sprintf(p, "%s%d", i ? ", " : "", i >= 3);
        p += sprintf(p, "]");
    }
    sprintf(p, "}}");
    return b;
}

static void test_minimax(void)
{
    fp4_arch a;
    char buf[256], *j = minimax_json(60, NULL, NULL);
    if (parse_ok(j, &a, "minimax m3.1")) {
        CHECK_STR(a.model_type, "minimax_m3_vl", "model_type (outer)");
        CHECK_STR(a.prefix, "language_model.", "prefix");
        CHECK_INT(a.hidden, 6144, "hidden");
        CHECK_INT(a.n_layers, 60, "n_layers");
        CHECK_INT(a.dense_intermediate, 12288, "dense_intermediate");
        CHECK_INT(a.n_experts, 128, "n_experts");
        CHECK_INT(a.moe_intermediate, 3072, "moe_intermediate");
        CHECK_INT(a.shared_intermediate, 3072, "shared_intermediate");
        CHECK_INT(a.topk, 8, "topk");
        CHECK_INT(a.act, FP4_ACT_SWIGLUOAI, "act");
        CHECK_FLT(a.swiglu_limit, 7.0f, "swiglu_limit");
        CHECK_FLT(a.swiglu_alpha, 1.702f, "swiglu_alpha");
        CHECK_INT(a.scoring, FP4_SCORE_SIGMOID, "scoring");
        CHECK_INT(a.has_score_bias, 1, "has_score_bias");
        CHECK_INT(a.norm_topk, 1, "norm_topk");
        CHECK_FLT(a.routed_scaling, 2.0f, "routed_scaling");
        CHECK_INT(a.naming, FP4_NAMES_MINIMAX, "naming");
        for (int i = 0; i < 60; i++)
            CHECK_INT(a.is_moe[i], i >= 3, "is_moe (moe_layer_freq list)");

        CHECK(fp4_name_expert(&a, buf, sizeof buf, 3, 5, "gate", "weight_packed"), "fits");
        CHECK_STR(buf, "language_model.model.layers.3.block_sparse_moe.experts.5.w1.weight_packed",
                  "expert gate name");
        fp4_name_expert(&a, buf, sizeof buf, 59, 127, "up", "weight_scale");
        CHECK_STR(buf, "language_model.model.layers.59.block_sparse_moe.experts.127.w3.weight_scale",
                  "expert up name");
        fp4_name_expert(&a, buf, sizeof buf, 4, 0, "down", "weight_global_scale");
        CHECK_STR(buf, "language_model.model.layers.4.block_sparse_moe.experts.0.w2."
                  "weight_global_scale", "expert down name");
        fp4_name_shared(&a, buf, sizeof buf, 3, "gate", "weight");
        CHECK_STR(buf, "language_model.model.layers.3.block_sparse_moe.shared_experts.gate_proj."
                  "weight", "shared name");
        fp4_name_dense(&a, buf, sizeof buf, 0, "down", "weight_scale_inv");
        CHECK_STR(buf, "language_model.model.layers.0.mlp.down_proj.weight_scale_inv",
                  "dense name");
        fp4_name_router(&a, buf, sizeof buf, 7, "weight");
        CHECK_STR(buf, "language_model.model.layers.7.block_sparse_moe.gate.weight", "router");
        fp4_name_router(&a, buf, sizeof buf, 7, "bias");
        CHECK_STR(buf, "language_model.model.layers.7.block_sparse_moe.e_score_correction_bias",
                  "router bias");
        fp4_name_expert_module(&a, buf, sizeof buf, 3, 5, "gate");
        CHECK_STR(buf, "model.layers.3.block_sparse_moe.experts.5.w1", "expert module");
        fp4_name_shared_module(&a, buf, sizeof buf, 3, "up");
        CHECK_STR(buf, "model.layers.3.block_sparse_moe.shared_experts.up_proj", "shared module");
        fp4_name_dense_module(&a, buf, sizeof buf, 1, "gate");
        CHECK_STR(buf, "model.layers.1.mlp.gate_proj", "dense module");
        fp4_name_expert(&a, buf, sizeof buf, 3, 5, "gate", NULL);
        CHECK_STR(buf, "language_model.model.layers.3.block_sparse_moe.experts.5.w1",
                  "no suffix");
        CHECK(!fp4_name_expert(&a, buf, 20, 3, 5, "gate", "weight"), "too small buffer: 0");
        CHECK(!fp4_name_expert(&a, buf, sizeof buf, 3, 5, "w1", "weight"), "bad which: 0");
        CHECK(!fp4_name_router(&a, buf, sizeof buf, 3, "scale"), "bad router what: 0");
    }
    free(j);

    /* the same layer split spelled three other ways */
    {
        const char *alts[] = {"\"first_k_dense_replace\": 3", NULL, NULL};
        char types[2048], *p = types;
        p += sprintf(p, "\"mlp_layer_types\": [");
        for (int i = 0; i < 8; i++)
            p += sprintf(p, "%s\"%s\"", i ? ", " : "", i < 3 ? "dense" : "sparse");
        sprintf(p, "]");
        alts[1] = types;
        alts[2] = "\"first_k_dense_replace\": 3, \"mlp_layer_types\": [\"dense\", \"dense\", "
                  "\"dense\", \"sparse\", \"sparse\", \"sparse\", \"sparse\", \"dense\"]";
        for (int k = 0; k < 3; k++) {
            j = minimax_json(8, alts[k], NULL);
            if (parse_ok(j, &a, alts[k]))
                for (int i = 0; i < 8; i++)
                    CHECK(a.is_moe[i] == (i >= 3 && !(k == 2 && i == 7)),
                          "variant %d layer %d: is_moe %d", k, i, a.is_moe[i]);
            free(j);
        }
    }

    /* defaults: no scoring_func / use_routing_bias / swiglu keys -> minimax defaults */
    parse_ok("{\"model_type\": \"minimax_m3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
             "\"intermediate_size\": 32, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
             "\"hidden_act\": \"swigluoai\"}", &a, "minimax defaults");
    CHECK_INT(a.scoring, FP4_SCORE_SIGMOID, "minimax default scoring");
    CHECK_INT(a.has_score_bias, 1, "minimax default bias");
    CHECK_INT(a.norm_topk, 1, "minimax default norm");
    CHECK_FLT(a.swiglu_limit, 7.0f, "swigluoai default limit");
    CHECK_FLT(a.swiglu_alpha, 1.702f, "default alpha");
    CHECK_FLT(a.routed_scaling, 1.0f, "default scaling");
    CHECK_STR(a.prefix, "", "no wrapper: no prefix");
    CHECK_INT(a.shared_intermediate, 0, "no shared expert");
    /* every layer MoE: an intermediate_size that only sizes experts is not checked as dense */
    parse_ok("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 96, "
             "\"moe_intermediate_size\": 32, \"num_experts\": 4, \"num_experts_per_tok\": 1,"
             " \"hidden_act\": \"silu\"}", &a, "all-MoE ignores dense width");
    CHECK_INT(a.dense_intermediate, 0, "all-MoE dense width");

    /* explicit naming override */
    j = minimax_json(4, "\"first_k_dense_replace\": 1", ", \"fp4moe_expert_naming\": \"mlp\"");
    if (parse_ok(j, &a, "naming override mlp")) {
        CHECK_INT(a.naming, FP4_NAMES_MLP, "override to mlp");
        fp4_name_expert(&a, buf, sizeof buf, 1, 2, "down", "weight");
        CHECK_STR(buf, "language_model.model.layers.1.mlp.experts.2.down_proj.weight",
                  "mlp naming with prefix");
    }
    free(j);
    j = minimax_json(4, "\"first_k_dense_replace\": 1, \"fp4moe_expert_naming\": \"bogus\"",
                     NULL);
    parse_err(j, FP4MOE_ERR_FORMAT, "bad naming override",
              "'text_config.fp4moe_expert_naming'", "\"bogus\"", NULL);
    free(j);
}

static const char *qwen3 =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
    "\"hidden_size\": 2048, \"num_hidden_layers\": 48, \"intermediate_size\": 6144, "
    "\"moe_intermediate_size\": 768, \"num_experts\": 128, \"num_experts_per_tok\": 8, "
    "\"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], "
    "\"hidden_act\": \"silu\", \"num_attention_heads\": 32, \"num_key_value_heads\": 4, "
    "\"vocab_size\": 151936, \"router_aux_loss_coef\": 0.001}";

static void test_qwen3(void)
{
    fp4_arch a;
    char buf[256];
    if (parse_ok(qwen3, &a, "qwen3-moe")) {
        CHECK_STR(a.model_type, "qwen3_moe", "model_type");
        CHECK_STR(a.prefix, "", "prefix");
        CHECK_INT(a.hidden, 2048, "hidden");
        CHECK_INT(a.n_layers, 48, "n_layers");
        CHECK_INT(a.dense_intermediate, 0, "dense (no dense layer: 0)");
        CHECK_INT(a.n_experts, 128, "experts");
        CHECK_INT(a.moe_intermediate, 768, "moe_intermediate");
        CHECK_INT(a.shared_intermediate, 0, "shared");
        CHECK_INT(a.topk, 8, "topk");
        CHECK_INT(a.act, FP4_ACT_SILU, "act");
        CHECK_FLT(a.swiglu_limit, 0.0f, "silu: no clamp");
        CHECK_INT(a.scoring, FP4_SCORE_SOFTMAX, "scoring");
        CHECK_INT(a.has_score_bias, 0, "bias");
        CHECK_INT(a.norm_topk, 1, "norm_topk (given)");
        CHECK_INT(a.naming, FP4_NAMES_MLP, "naming");
        for (int i = 0; i < 48; i++)
            CHECK_INT(a.is_moe[i], 1, "all MoE");
        fp4_name_expert(&a, buf, sizeof buf, 1, 7, "gate", "weight");
        CHECK_STR(buf, "model.layers.1.mlp.experts.7.gate_proj.weight", "qwen expert");
        fp4_name_shared(&a, buf, sizeof buf, 1, "up", "weight");
        CHECK_STR(buf, "model.layers.1.mlp.shared_experts.up_proj.weight", "qwen shared");
        fp4_name_router(&a, buf, sizeof buf, 1, "weight");
        CHECK_STR(buf, "model.layers.1.mlp.gate.weight", "qwen router");
        fp4_name_router(&a, buf, sizeof buf, 1, "bias");
        CHECK_STR(buf, "model.layers.1.mlp.gate.e_score_correction_bias", "qwen router bias");
        fp4_name_expert_module(&a, buf, sizeof buf, 2, 3, "down");
        CHECK_STR(buf, "model.layers.2.mlp.experts.3.down_proj", "qwen module");
    }
    /* decoder_sparse_step 2 and mlp_only_layers [0, 5]: MoE iff odd and not listed */
    if (parse_ok("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"num_hidden_layers\": 8,"
                 " \"intermediate_size\": 128, \"moe_intermediate_size\": 32, \"num_experts\": 4,"
                 " \"num_experts_per_tok\": 4, \"decoder_sparse_step\": 2, \"mlp_only_layers\": "
                 "[0, 5], \"hidden_act\": \"silu\"}", &a, "qwen sparse step")) {
        static const int want[8] = {0, 1, 0, 1, 0, 0, 0, 1};
        for (int i = 0; i < 8; i++)
            CHECK(a.is_moe[i] == want[i], "sparse step layer %d: got %d want %d", i, a.is_moe[i],
                  want[i]);
        CHECK_INT(a.norm_topk, 0, "softmax default: no renorm");
        CHECK_INT(a.dense_intermediate, 128, "dense width with dense layers");
    }
}

static void test_mixtral_deepseek(void)
{
    fp4_arch a;
    if (parse_ok("{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", "
                 "\"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32,"
                 " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"hidden_act\": \"silu\","
                 " \"router_aux_loss_coef\": 0.02, \"vocab_size\": 32000}", &a, "mixtral")) {
        CHECK_INT(a.moe_intermediate, 14336, "mixtral moe_intermediate falls back");
        CHECK_INT(a.dense_intermediate, 0, "mixtral has no dense layer");
        CHECK_INT(a.n_experts, 8, "experts");
        CHECK_INT(a.topk, 2, "topk");
        CHECK_INT(a.scoring, FP4_SCORE_SOFTMAX, "softmax");
        CHECK_INT(a.norm_topk, 1, "mixtral renormalizes");
        CHECK_INT(a.has_score_bias, 0, "no bias");
        CHECK_INT(a.shared_intermediate, 0, "no shared");
        CHECK_INT(a.naming, FP4_NAMES_MLP, "naming");
        CHECK_INT(a.is_moe[0] && a.is_moe[31], 1, "all MoE");
    }
    if (parse_ok("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 2048, \"num_hidden_layers\":"
                 " 4, \"intermediate_size\": 10944, \"moe_intermediate_size\": 1408, "
                 "\"n_routed_experts\": 64, \"n_shared_experts\": 2, \"num_experts_per_tok\": 6,"
                 " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"scoring_func\": "
                 "\"sigmoid\", \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1,"
                 " \"norm_topk_prob\": false, \"routed_scaling_factor\": 2.5, "
                 "\"hidden_act\": \"silu\"}", &a, "deepseek")) {
        CHECK_INT(a.n_experts, 64, "n_routed_experts");
        CHECK_INT(a.shared_intermediate, 2 * 1408, "n_shared * moe_intermediate");
        CHECK_INT(a.has_score_bias, 1, "noaux_tc bias");
        CHECK_INT(a.norm_topk, 0, "norm given false");
        CHECK_FLT(a.routed_scaling, 2.5f, "scaling");
        CHECK_INT(a.is_moe[0], 0, "layer 0 dense");
        CHECK_INT(a.is_moe[1] && a.is_moe[3], 1, "layers 1.. MoE");
    }
    /* a dense model (no experts) parses with every layer dense */
    if (parse_ok("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 96, "
                 "\"hidden_act\": \"silu\"}", &a, "dense"))
        CHECK_INT(a.is_moe[0] + a.is_moe[1], 0, "dense model");
}

static void test_malformed(void)
{
    fp4_arch a;
    fp4_err e;
    char *j;
    /* the exact message style */
    parse("{\"text_config\": {\"hidden_size\": \"abc\", \"num_hidden_layers\": 2}}", &a, &e);
    CHECK_STR(e.msg, "config.json: key 'text_config.hidden_size': expected a positive integer, "
              "found \"abc\"", "exact message");
    CHECK_INT(e.status, FP4MOE_ERR_FORMAT, "status");

    parse_err("{\"num_hidden_layers\": 2}", FP4MOE_ERR_FORMAT, "missing hidden",
              "'hidden_size'", "missing", NULL);
    parse_err("{\"hidden_size\": 64.5, \"num_hidden_layers\": 2}", FP4MOE_ERR_FORMAT,
              "fractional hidden", "'hidden_size'", "64.5", NULL);
    parse_err("{\"hidden_size\": 0, \"num_hidden_layers\": 2}", FP4MOE_ERR_FORMAT, "zero hidden",
              "'hidden_size'", "positive", NULL);
    parse_err("{\"hidden_size\": -64, \"num_hidden_layers\": 2}", FP4MOE_ERR_FORMAT,
              "negative hidden", "'hidden_size'", "-64", NULL);
    parse_err("{\"hidden_size\": 64}", FP4MOE_ERR_FORMAT, "missing layers",
              "'num_hidden_layers'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 513, \"intermediate_size\": 64, "
              "\"hidden_act\": \"silu\"}", FP4MOE_ERR_NOT_SUPPORTED, "too many layers", "513",
              "512", NULL);
    parse_err("{\"hidden_size\": 100, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"hidden_act\": \"silu\"}", FP4MOE_ERR_NOT_SUPPORTED, "hidden % 32",
              "'hidden_size' = 100", "multiple of 32", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 48, "
              "\"hidden_act\": \"silu\"}", FP4MOE_ERR_NOT_SUPPORTED, "dense % 32",
              "'intermediate_size' = 48", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 40, "
              "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_act\": \"silu\"}",
              FP4MOE_ERR_NOT_SUPPORTED, "moe % 32", "'moe_intermediate_size' = 40", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"num_experts\": 4, \"num_experts_per_tok\": 5, \"hidden_act\": \"silu\"}",
              FP4MOE_ERR_FORMAT, "topk > experts", "'num_experts_per_tok' = 5",
              "'num_experts'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"num_experts\": 4, \"hidden_act\": \"silu\"}", FP4MOE_ERR_FORMAT, "topk missing",
              "'num_experts_per_tok'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_experts\": 4, "
              "\"num_experts_per_tok\": 2, \"hidden_act\": \"silu\"}", FP4MOE_ERR_FORMAT,
              "expert width missing", "'moe_intermediate_size'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"hidden_act\": \"silu\"}",
              FP4MOE_ERR_FORMAT, "dense width missing", "'intermediate_size'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"hidden_act\": \"gelu\"}", FP4MOE_ERR_NOT_SUPPORTED, "gelu", "'hidden_act'",
              "\"gelu\"", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64}",
              FP4MOE_ERR_FORMAT, "act missing", "'hidden_act'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"hidden_act\": \"silu\", \"scoring_func\": \"tanh\"}", FP4MOE_ERR_NOT_SUPPORTED,
              "scoring", "'scoring_func'", "\"tanh\"", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"hidden_act\": \"silu\", \"use_routing_bias\": \"yes\"}", FP4MOE_ERR_FORMAT,
              "bias bool", "'use_routing_bias'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"hidden_act\": \"silu\", \"swiglu_limit\": \"7\"}", FP4MOE_ERR_FORMAT,
              "limit type", "'swiglu_limit'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 32, "
              "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_act\": \"silu\", "
              "\"mlp_only_layers\": [0, 9]}", FP4MOE_ERR_FORMAT, "mlp_only out of range",
              "'mlp_only_layers'", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 32, "
              "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_act\": \"silu\", "
              "\"shared_expert_intermediate_size\": 64}", FP4MOE_ERR_NOT_SUPPORTED,
              "qwen2 gated shared", "shared_expert_intermediate_size", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 32, "
              "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"hidden_act\": \"silu\", "
              "\"n_group\": 4, \"topk_group\": 2}", FP4MOE_ERR_NOT_SUPPORTED, "grouped topk",
              "'n_group' = 4", NULL);
    parse_err("[1, 2]", FP4MOE_ERR_FORMAT, "not an object", "config.json", NULL);
    parse_err("{\"text_config\": \"x\"}", FP4MOE_ERR_FORMAT, "text_config not object",
              "'text_config'", NULL);
    j = minimax_json(6, "\"moe_layer_freq\": [0, 1, 1]", NULL);
    parse_err(j, FP4MOE_ERR_FORMAT, "moe_layer_freq length", "'text_config.moe_layer_freq'",
              NULL);
    free(j);
    j = minimax_json(4, "\"mlp_layer_types\": [\"dense\", \"moe\", \"sparse\", \"sparse\"]",
                     NULL);
    parse_err(j, FP4MOE_ERR_FORMAT, "mlp_layer_types value", "'text_config.mlp_layer_types'",
              NULL);
    free(j);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 32, "
              "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"hidden_act\": \"silu\", "
              "\"n_shared_experts\": 2, \"shared_intermediate_size\": 64}",
              FP4MOE_ERR_NOT_SUPPORTED, "two shared experts with a width",
              "'n_shared_experts' = 2", NULL);
    parse_err("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"intermediate_size\": 64, "
              "\"hidden_act\": \"silu\", \"routed_scaling_factor\": 0}", FP4MOE_ERR_FORMAT,
              "zero scaling", "'routed_scaling_factor'", NULL);
}

static void test_layer_index(void)
{
    static const struct { const char *name; int want; } cases[] = {
        {"language_model.model.layers.12.mlp.gate.weight", 12},
        {"model.layers.0.input_layernorm.weight", 0},
        {"model.layers.7", 7},
        {"model.embed_tokens.weight", -1},
        {"lm_head.weight", -1},
        {"model.layers.x.mlp", -1},
        {"model.layers.3x.mlp", -1},
        {"mymodel.layers.3.mlp", -1},
        {"model.layers.99999999999.mlp", -1},
        {"model.norm.weight", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = fp4_name_layer_index(cases[i].name);
        CHECK(got == cases[i].want, "layer index of \"%s\": got %d want %d", cases[i].name, got,
              cases[i].want);
    }
}

int main(void)
{
    test_minimax();
    test_qwen3();
    test_mixtral_deepseek();
    test_malformed();
    test_layer_index();
    return check_done();
}
