/*
 * model_config.c - read the MoE architecture from a Hugging Face config.json (DESIGN.md
 * sections 3, 4 and 7) into an fp4_arch, and build the tensor / module names of each family.
 *
 * Where the keys sit: with a "text_config" object the architecture keys are read from it
 * and tensor names carry the prefix "language_model."; model_type is the inner one, or the
 * outer one when text_config has none (MiniMax-M3 VL configs). Keys and fallbacks, first
 * present wins:
 *   hidden_size, num_hidden_layers                          required, positive integers
 *   dense MLP width     dense_intermediate_size | intermediate_size  (MiniMax-M3 puts the
 *                       per-expert width in intermediate_size and the dense one apart);
 *                       0 when no layer is dense
 *   routed experts      num_local_experts | n_routed_experts | num_experts  (absent: 0, dense)
 *   expert width        moe_intermediate_size | intermediate_size  (Mixtral, MiniMax-M3)
 *   shared expert       shared_intermediate_size | n_shared_experts * moe_intermediate_size | 0;
 *                       n_shared_experts 0 means none; n_shared_experts > 1 beside
 *                       shared_intermediate_size is refused (per-expert or total is not
 *                       settled); Qwen2-MoE's gated shared_expert_intermediate_size is refused
 *                       (its tensors are mlp.shared_expert + shared_expert_gate, not run here)
 *   num_experts_per_tok required with experts, <= experts
 *   hidden_act          "silu" | "swiglu" -> SILU, "swigluoai" -> SWIGLUOAI, required
 *   swiglu_limit        default 7.0 for swigluoai, 0 (no clamp) for silu; swiglu_alpha 1.702
 *   scoring_func        "sigmoid" | "softmax"; default softmax, sigmoid for model_type minimax*
 *   has_score_bias      use_routing_bias if given; else topk_method "noaux_tc" (DeepSeek-V3);
 *                       else sigmoid scoring with model_type minimax*
 *   norm_topk_prob      default 1 for sigmoid, 0 for softmax, except model_type mixtral: 1
 *                       (Mixtral renormalizes the top-k softmax weights and has no such key)
 *   routed_scaling_factor default 1.0
 *   grouped routing     n_group > 1 with topk_group < n_group is refused (not implemented)
 * A layer i is MoE when experts > 0 and every key present agrees: first_k_dense_replace k
 * (i >= k), moe_layer_freq (integer f: i % f == 0, DeepSeek; list: entry i != 0, MiniMax-M3),
 * mlp_layer_types (list: "sparse" / "dense"), mlp_only_layers (i not listed), and
 * decoder_sparse_step s ((i + 1) % s == 0, Qwen).
 * Naming: model_type starting with "minimax" -> FP4_NAMES_MINIMAX, else FP4_NAMES_MLP; the
 * key "fp4moe_expert_naming": "minimax" | "mlp" (read beside the architecture keys, then at
 * top level) overrides it. The MLP family spells the shared expert mlp.shared_experts
 * (DeepSeek); Qwen's singular mlp.shared_expert is not accepted.
 * Limits: hidden and every intermediate width must be multiples of 32 (MXFP8 blocks);
 * at most FP4_MAX_LAYERS layers.
 */
#include "model_config.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Context of one parse: the object holding the arch keys and how to name its keys. */
typedef struct cfg_ctx {
    const cJSON *root;  /* text_config or the whole config */
    const cJSON *outer; /* the whole config */
    const char *path;   /* file, for messages */
    const char *kp;     /* "text_config." or "" */
    fp4_err *e;
} cfg_ctx;

/* A short rendering of a JSON value for messages. */
static void render(const cJSON *v, char *buf, size_t len)
{
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    if (!s) {
        snprintf(buf, len, "%s", v ? "(unprintable)" : "nothing");
        return;
    }
    if (strlen(s) > 60)
        snprintf(buf, len, "%.57s...", s);
    else
        snprintf(buf, len, "%s", s);
    free(s);
}

static fp4moe_status bad_key(cfg_ctx *c, const char *key, const char *expected, const cJSON *v)
{
    char found[80];
    if (!v)
        return fp4_fail(c->e, FP4MOE_ERR_FORMAT, "%s: key '%s%s': expected %s, found nothing "
                        "(key missing)", c->path, c->kp, key, expected);
    render(v, found, sizeof found);
    return fp4_fail(c->e, FP4MOE_ERR_FORMAT, "%s: key '%s%s': expected %s, found %s", c->path,
                    c->kp, key, expected, found);
}

static const cJSON *get(const cfg_ctx *c, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL; /* null reads as absent */
}

static int json_int(const cJSON *v, long min, int *out)
{
    double d;
    if (!cJSON_IsNumber(v))
        return 0;
    d = v->valuedouble;
    if (d != floor(d) || d < (double)min || d > (double)INT_MAX)
        return 0;
    *out = (int)d;
    return 1;
}

/* Integer key >= min. Returns 1 and sets *out if present, 0 if absent (out untouched),
 * -1 on a bad value (error filled). */
static int opt_int(cfg_ctx *c, const char *key, int min, int *out)
{
    const cJSON *v = get(c, key);
    if (!v)
        return 0;
    if (!json_int(v, min, out)) {
        bad_key(c, key, min > 0 ? "a positive integer" : "a non-negative integer", v);
        return -1;
    }
    return 1;
}

static int opt_float(cfg_ctx *c, const char *key, float *out)
{
    const cJSON *v = get(c, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0) {
        bad_key(c, key, "a non-negative number", v);
        return -1;
    }
    *out = (float)v->valuedouble;
    return 1;
}

/* Boolean key (true/false or 0/1). */
static int opt_bool(cfg_ctx *c, const char *key, int *out)
{
    const cJSON *v = get(c, key);
    if (!v)
        return 0;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        return 1;
    }
    if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)) {
        *out = v->valuedouble != 0;
        return 1;
    }
    bad_key(c, key, "true or false", v);
    return -1;
}

static int opt_string(cfg_ctx *c, const char *key, const char **out)
{
    const cJSON *v = get(c, key);
    if (!v)
        return 0;
    if (!cJSON_IsString(v)) {
        bad_key(c, key, "a string", v);
        return -1;
    }
    *out = v->valuestring;
    return 1;
}

/* First present key of a NULL-terminated list; *which names it. */
static int first_int(cfg_ctx *c, const char *const *keys, int min, int *out, const char **which)
{
    for (int i = 0; keys[i]; i++) {
        int r = opt_int(c, keys[i], min, out);
        if (r != 0) {
            *which = keys[i];
            return r;
        }
    }
    return 0;
}

/* Which layers are MoE (see the file head). */
static fp4moe_status parse_layer_kinds(cfg_ctx *c, fp4_arch *a)
{
    int k = 0, step = 1, freq = 1, r;
    const cJSON *v;
    if ((r = opt_int(c, "first_k_dense_replace", 0, &k)) < 0)
        return c->e->status;
    if ((r = opt_int(c, "decoder_sparse_step", 1, &step)) < 0)
        return c->e->status;
    for (int i = 0; i < a->n_layers; i++)
        a->is_moe[i] = a->n_experts > 0 && i >= k && (i + 1) % step == 0;

    v = get(c, "moe_layer_freq");
    if (v && cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) != a->n_layers)
            return bad_key(c, "moe_layer_freq", "a list with one 0/1 entry per layer", v);
        for (int i = 0; i < a->n_layers; i++) {
            int f;
            if (!json_int(cJSON_GetArrayItem(v, i), 0, &f) || f > 1)
                return bad_key(c, "moe_layer_freq", "a list with one 0/1 entry per layer", v);
            a->is_moe[i] &= (unsigned char)f;
        }
    } else if (v) {
        if (opt_int(c, "moe_layer_freq", 1, &freq) < 0)
            return c->e->status;
        for (int i = 0; i < a->n_layers; i++)
            a->is_moe[i] &= i % freq == 0;
    }

    v = get(c, "mlp_layer_types");
    if (v) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != a->n_layers)
            return bad_key(c, "mlp_layer_types", "a list with one \"dense\"/\"sparse\" per layer",
                           v);
        for (int i = 0; i < a->n_layers; i++) {
            const cJSON *t = cJSON_GetArrayItem(v, i);
            const char *s = cJSON_GetStringValue(t);
            if (!s || (strcmp(s, "dense") != 0 && strcmp(s, "sparse") != 0))
                return bad_key(c, "mlp_layer_types",
                               "a list with one \"dense\"/\"sparse\" per layer", v);
            if (strcmp(s, "dense") == 0)
                a->is_moe[i] = 0;
        }
    }

    v = get(c, "mlp_only_layers");
    if (v) {
        const cJSON *it;
        if (!cJSON_IsArray(v))
            return bad_key(c, "mlp_only_layers", "a list of layer indices", v);
        cJSON_ArrayForEach(it, v) {
            int i;
            if (!json_int(it, 0, &i) || i >= a->n_layers)
                return bad_key(c, "mlp_only_layers", "a list of layer indices below "
                               "num_hidden_layers", v);
            a->is_moe[i] = 0;
        }
    }
    return FP4MOE_OK;
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static fp4moe_status check_width(cfg_ctx *c, const char *key, int v)
{
    if (v % 32 != 0)
        return fp4_fail(c->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%s%s' = %d: expected a "
                        "multiple of 32 (MXFP8 / NVFP4 block sizes)", c->path, c->kp, key, v);
    return FP4MOE_OK;
}

static fp4moe_status parse_routing(cfg_ctx *c, fp4_arch *a)
{
    const char *s = NULL;
    int minimax = starts_with(a->model_type, "minimax"), r, n_group = 1, topk_group = 0;
    int bias = 0;

    a->scoring = minimax ? FP4_SCORE_SIGMOID : FP4_SCORE_SOFTMAX;
    if ((r = opt_string(c, "scoring_func", &s)) < 0)
        return c->e->status;
    if (r) {
        if (strcmp(s, "sigmoid") == 0)
            a->scoring = FP4_SCORE_SIGMOID;
        else if (strcmp(s, "softmax") == 0)
            a->scoring = FP4_SCORE_SOFTMAX;
        else
            return fp4_fail(c->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%sscoring_func' = \"%s\": "
                            "not supported (expected \"sigmoid\" or \"softmax\")", c->path,
                            c->kp, s);
    }

    a->has_score_bias = a->scoring == FP4_SCORE_SIGMOID && minimax;
    if ((r = opt_string(c, "topk_method", &s)) < 0)
        return c->e->status;
    if (r && strcmp(s, "noaux_tc") == 0)
        a->has_score_bias = 1;
    if ((r = opt_bool(c, "use_routing_bias", &bias)) < 0)
        return c->e->status;
    if (r)
        a->has_score_bias = bias;

    a->norm_topk = a->scoring == FP4_SCORE_SIGMOID || strcmp(a->model_type, "mixtral") == 0;
    if (opt_bool(c, "norm_topk_prob", &a->norm_topk) < 0)
        return c->e->status;

    a->routed_scaling = 1.0f;
    if ((r = opt_float(c, "routed_scaling_factor", &a->routed_scaling)) < 0)
        return c->e->status;
    if (r && a->routed_scaling == 0.0f)
        return bad_key(c, "routed_scaling_factor", "a positive number",
                       get(c, "routed_scaling_factor"));

    if (opt_int(c, "n_group", 1, &n_group) < 0 || opt_int(c, "topk_group", 1, &topk_group) < 0)
        return c->e->status;
    if (n_group > 1 && topk_group < n_group)
        return fp4_fail(c->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: keys '%sn_group' = %d, '%stopk_group'"
                        " = %d: grouped top-k routing is not supported", c->path, c->kp,
                        n_group, c->kp, topk_group);
    return FP4MOE_OK;
}

static fp4moe_status parse_activation(cfg_ctx *c, fp4_arch *a)
{
    const char *s = NULL;
    int r = opt_string(c, "hidden_act", &s);
    if (r < 0)
        return c->e->status;
    if (r == 0)
        return bad_key(c, "hidden_act", "\"silu\" or \"swigluoai\"", NULL);
    if (strcmp(s, "silu") == 0 || strcmp(s, "swiglu") == 0)
        a->act = FP4_ACT_SILU;
    else if (strcmp(s, "swigluoai") == 0)
        a->act = FP4_ACT_SWIGLUOAI;
    else
        return fp4_fail(c->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%shidden_act' = \"%s\": not "
                        "supported (expected \"silu\", \"swiglu\" or \"swigluoai\")", c->path,
                        c->kp, s);
    a->swiglu_limit = a->act == FP4_ACT_SWIGLUOAI ? 7.0f : 0.0f;
    a->swiglu_alpha = 1.702f;
    if (opt_float(c, "swiglu_limit", &a->swiglu_limit) < 0 ||
        opt_float(c, "swiglu_alpha", &a->swiglu_alpha) < 0)
        return c->e->status;
    return FP4MOE_OK;
}

static fp4moe_status parse_naming(cfg_ctx *c, fp4_arch *a)
{
    const cJSON *v = get(c, "fp4moe_expert_naming");
    const char *kp = c->kp;
    a->naming = starts_with(a->model_type, "minimax") ? FP4_NAMES_MINIMAX : FP4_NAMES_MLP;
    if (!v && c->root != c->outer) {
        v = cJSON_GetObjectItemCaseSensitive(c->outer, "fp4moe_expert_naming");
        kp = "";
    }
    if (!v)
        return FP4MOE_OK;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "minimax") == 0)
        a->naming = FP4_NAMES_MINIMAX;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "mlp") == 0)
        a->naming = FP4_NAMES_MLP;
    else {
        cfg_ctx c2 = *c;
        c2.kp = kp;
        return bad_key(&c2, "fp4moe_expert_naming", "\"minimax\" or \"mlp\"", v);
    }
    return FP4MOE_OK;
}

static fp4moe_status parse_sizes(cfg_ctx *c, fp4_arch *a)
{
    static const char *const k_hidden[] = {"hidden_size", NULL};
    static const char *const k_layers[] = {"num_hidden_layers", NULL};
    static const char *const k_dense[] = {"dense_intermediate_size", "intermediate_size", NULL};
    static const char *const k_experts[] = {"num_local_experts", "n_routed_experts",
                                            "num_experts", NULL};
    static const char *const k_moe[] = {"moe_intermediate_size", "intermediate_size", NULL};
    const char *kh = NULL, *kd = NULL, *km = NULL, *ke = NULL;
    int r, n_shared = -1, any_dense = 0, any_moe = 0, qwen_shared = 0;

    if ((r = first_int(c, k_hidden, 1, &a->hidden, &kh)) <= 0)
        return r < 0 ? c->e->status : bad_key(c, "hidden_size", "a positive integer", NULL);
    if ((r = first_int(c, k_layers, 1, &a->n_layers, &kh)) <= 0)
        return r < 0 ? c->e->status : bad_key(c, "num_hidden_layers", "a positive integer", NULL);
    if (a->n_layers > FP4_MAX_LAYERS)
        return fp4_fail(c->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%snum_hidden_layers' = %d: at "
                        "most %d layers are supported", c->path, c->kp, a->n_layers,
                        FP4_MAX_LAYERS);
    if (first_int(c, k_experts, 0, &a->n_experts, &ke) < 0)
        return c->e->status;
    if (parse_layer_kinds(c, a) != FP4MOE_OK)
        return c->e->status;
    for (int i = 0; i < a->n_layers; i++) {
        any_moe |= a->is_moe[i];
        any_dense |= !a->is_moe[i];
    }

    if ((r = first_int(c, k_dense, 1, &a->dense_intermediate, &kd)) < 0)
        return c->e->status;
    if (r == 0 && any_dense)
        return bad_key(c, "intermediate_size", "a positive integer (the model has dense MLP "
                       "layers)", NULL);
    if (!any_dense)
        a->dense_intermediate = 0; /* Mixtral's intermediate_size is the expert width */
    if (!any_moe)
        return FP4MOE_OK;

    if ((r = first_int(c, k_moe, 1, &a->moe_intermediate, &km)) <= 0)
        return r < 0 ? c->e->status
                     : bad_key(c, "moe_intermediate_size", "a positive integer", NULL);
    if ((r = opt_int(c, "num_experts_per_tok", 1, &a->topk)) <= 0)
        return r < 0 ? c->e->status
                     : bad_key(c, "num_experts_per_tok", "a positive integer", NULL);
    if (a->topk > a->n_experts)
        return fp4_fail(c->e, FP4MOE_ERR_FORMAT, "%s: key '%snum_experts_per_tok' = %d exceeds "
                        "the %d routed experts of key '%s%s'", c->path, c->kp, a->topk,
                        a->n_experts, c->kp, ke);

    if (opt_int(c, "n_shared_experts", 0, &n_shared) < 0 ||
        opt_int(c, "shared_expert_intermediate_size", 0, &qwen_shared) < 0)
        return c->e->status;
    if (qwen_shared > 0)
        return fp4_fail(c->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%sshared_expert_intermediate_"
                        "size' = %d: the gated Qwen-style shared expert (mlp.shared_expert, "
                        "shared_expert_gate) is not supported", c->path, c->kp, qwen_shared);
    if ((r = opt_int(c, "shared_intermediate_size", 0, &a->shared_intermediate)) < 0)
        return c->e->status;
    if (r && n_shared > 1 && a->shared_intermediate > 0)
        return fp4_fail(c->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: keys '%sshared_intermediate_size' = "
                        "%d and '%sn_shared_experts' = %d: more than one shared expert with its "
                        "own width is ambiguous and not supported", c->path, c->kp,
                        a->shared_intermediate, c->kp, n_shared);
    if (!r)
        a->shared_intermediate = n_shared > 0 ? n_shared * a->moe_intermediate : 0;
    if (n_shared == 0)
        a->shared_intermediate = 0;

    if (check_width(c, km, a->moe_intermediate) != FP4MOE_OK)
        return c->e->status;
    if (a->shared_intermediate > 0 &&
        check_width(c, r ? "shared_intermediate_size" : "n_shared_experts * "
                    "moe_intermediate_size", a->shared_intermediate) != FP4MOE_OK)
        return c->e->status;
    return FP4MOE_OK;
}

fp4moe_status fp4_arch_parse(const cJSON *config, const char *path, fp4_arch *out, fp4_err *e)
{
    cfg_ctx c = {config, config, path ? path : "config.json", "", e};
    const cJSON *tc, *mt;
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(config))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "%s: expected a JSON object at top level", c.path);
    tc = cJSON_GetObjectItemCaseSensitive(config, "text_config");
    if (tc && !cJSON_IsNull(tc)) {
        if (!cJSON_IsObject(tc))
            return bad_key(&c, "text_config", "an object", tc);
        c.root = tc;
        c.kp = "text_config.";
        snprintf(out->prefix, sizeof out->prefix, "language_model.");
    }

    mt = get(&c, "model_type");
    if (!mt && c.root != config)
        mt = cJSON_GetObjectItemCaseSensitive(config, "model_type");
    if (mt && !cJSON_IsNull(mt)) {
        if (!cJSON_IsString(mt) || strlen(mt->valuestring) >= sizeof out->model_type)
            return bad_key(&c, "model_type", "a string of at most 63 characters", mt);
        snprintf(out->model_type, sizeof out->model_type, "%s", mt->valuestring);
    }

    if (parse_sizes(&c, out) != FP4MOE_OK || parse_activation(&c, out) != FP4MOE_OK ||
        parse_routing(&c, out) != FP4MOE_OK || parse_naming(&c, out) != FP4MOE_OK)
        return e->status;
    if (check_width(&c, "hidden_size", out->hidden) != FP4MOE_OK)
        return e->status;
    if (out->dense_intermediate > 0 &&
        check_width(&c, get(&c, "dense_intermediate_size") ? "dense_intermediate_size"
                                                           : "intermediate_size",
                    out->dense_intermediate) != FP4MOE_OK)
        return e->status;
    return FP4MOE_OK;
}

/* ---- names ---------------------------------------------------------------------------- */

static int fits(int n, size_t len) { return n >= 0 && (size_t)n < len; }

/* Projection spelling of which ("gate", "up", "down") in a family; NULL if unknown. */
static const char *proj_name(const char *which, int minimax_expert)
{
    static const char *const whiches[] = {"gate", "up", "down"};
    static const char *const mm[] = {"w1", "w3", "w2"};
    static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
    if (!which)
        return NULL;
    for (int i = 0; i < 3; i++)
        if (strcmp(which, whiches[i]) == 0)
            return minimax_expert ? mm[i] : mlp[i];
    return NULL;
}

/* prefix + body + ("." suffix if suffix non-empty). */
static int finish(char *buf, size_t len, const char *prefix, const char *body, const char *suffix)
{
    int has = suffix && suffix[0];
    return fits(snprintf(buf, len, "%s%s%s%s", prefix, body, has ? "." : "", has ? suffix : ""),
                len);
}

static const char *moe_block(const fp4_arch *a)
{
    return a->naming == FP4_NAMES_MINIMAX ? "block_sparse_moe" : "mlp";
}

int fp4_name_expert_module(const fp4_arch *a, char *buf, size_t len, int layer, int expert,
                           const char *which)
{
    const char *p = proj_name(which, a->naming == FP4_NAMES_MINIMAX);
    if (!p || layer < 0 || expert < 0)
        return 0;
    return fits(snprintf(buf, len, "model.layers.%d.%s.experts.%d.%s", layer, moe_block(a),
                         expert, p), len);
}

int fp4_name_shared_module(const fp4_arch *a, char *buf, size_t len, int layer,
                           const char *which)
{
    const char *p = proj_name(which, 0);
    if (!p || layer < 0)
        return 0;
    return fits(snprintf(buf, len, "model.layers.%d.%s.shared_experts.%s", layer, moe_block(a),
                         p), len);
}

int fp4_name_dense_module(const fp4_arch *a, char *buf, size_t len, int layer,
                          const char *which)
{
    const char *p = proj_name(which, 0);
    (void)a;
    if (!p || layer < 0)
        return 0;
    return fits(snprintf(buf, len, "model.layers.%d.mlp.%s", layer, p), len);
}

int fp4_name_expert(const fp4_arch *a, char *buf, size_t len, int layer, int expert,
                    const char *which, const char *suffix)
{
    char m[256];
    return fp4_name_expert_module(a, m, sizeof m, layer, expert, which) &&
           finish(buf, len, a->prefix, m, suffix);
}

int fp4_name_shared(const fp4_arch *a, char *buf, size_t len, int layer, const char *which,
                    const char *suffix)
{
    char m[256];
    return fp4_name_shared_module(a, m, sizeof m, layer, which) &&
           finish(buf, len, a->prefix, m, suffix);
}

int fp4_name_dense(const fp4_arch *a, char *buf, size_t len, int layer, const char *which,
                   const char *suffix)
{
    char m[256];
    return fp4_name_dense_module(a, m, sizeof m, layer, which) &&
           finish(buf, len, a->prefix, m, suffix);
}

int fp4_name_router(const fp4_arch *a, char *buf, size_t len, int layer, const char *what)
{
    const char *tail;
    if (!what || layer < 0)
        return 0;
    if (strcmp(what, "weight") == 0)
        tail = "gate.weight";
    else if (strcmp(what, "bias") == 0)
        tail = a->naming == FP4_NAMES_MINIMAX ? "e_score_correction_bias"
                                              : "gate.e_score_correction_bias";
    else
        return 0;
    return fits(snprintf(buf, len, "%smodel.layers.%d.%s.%s", a->prefix, layer, moe_block(a),
                         tail), len);
}

int fp4_name_layer_index(const char *tensor_name)
{
    static const char key[] = "model.layers.";
    const char *p = tensor_name;
    while (p && (p = strstr(p, key)) != NULL) {
        const char *d = p + sizeof key - 1;
        long v = 0;
        int nd = 0;
        /* "model.layers." must start the name or follow a '.' (not "mymodel.layers.") */
        int at_boundary = p == tensor_name || p[-1] == '.';
        while (isdigit((unsigned char)d[nd]) && nd < 9) {
            v = v * 10 + (d[nd] - '0');
            nd++;
        }
        if (at_boundary && nd > 0 && (d[nd] == '.' || d[nd] == '\0'))
            return (int)v;
        p += 1;
    }
    return -1;
}
