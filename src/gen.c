/*
 * gen.c - `fp4moe gen` (see gen.h). Weights are sigma * z with z a bounded near-normal draw
 * (sum of four uniforms, |z| <= 2*sqrt(3)), so each NVFP4 global decode scale is known before
 * the tensor is drawn: amax_bound / (6 * 448), as ModelOpt computes it from amax. Static input
 * scales assume activations with amax 8: 8 / (6 * 448). Every tensor has its own random stream
 * (seed and name), so the bytes do not depend on chunking or sharding.
 */
#include "gen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "model_config.h"
#include "safetensors.h"

#define Z_BOUND 3.4641016f /* 2*sqrt(3) */
#define ACT_AMAX 8.0f
#define ROW_CHUNK_BYTES (8u << 20)

static const fp4_preset presets[] = {
    /* name, hidden, layers, first_dense, dense_inter, experts, moe_inter, shared_inter, topk,
     * heads, kv_heads, head_dim, index_heads, vocab */
    {"tiny", 256, 4, 1, 512, 8, 128, 128, 2, 4, 1, 64, 1, 1024},
    {"minimax-m3.1-flash-tp8", 6144, 60, 3, 1536, 128, 384, 384, 8, 8, 1, 128, 1, 25008},
    {"minimax-m3.1-flash", 6144, 60, 3, 12288, 128, 3072, 3072, 8, 64, 4, 128, 8, 200064},
};

const fp4_preset *fp4_preset_find(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}

const char *fp4_preset_names(void)
{
    return "tiny, minimax-m3.1-flash-tp8, minimax-m3.1-flash";
}

/* ---- random streams ---------------------------------------------------------------------- */

typedef struct rng { uint64_t s; } rng;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static rng rng_for(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    rng r = {seed * 0x2545f4914f6cdd1dull ^ h};
    splitmix(&r.s);
    return r;
}

static float uniform(rng *r) /* [0, 1) */
{
    return (float)(splitmix(&r->s) >> 40) * (1.0f / 16777216.0f);
}

static float znorm(rng *r)
{
    uint64_t v = splitmix(&r->s);
    float s = 0.0f;
    for (int i = 0; i < 4; i++)
        s += (float)((v >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return (s - 2.0f) * 1.7320508f;
}

/* ---- the tensor plan ----------------------------------------------------------------------- */

typedef enum gkind {
    G_NORM,      /* bf16 1 + small noise */
    G_BF16,      /* bf16 matrix sigma * z */
    G_F32,       /* f32 matrix sigma * z (router) */
    G_BIAS,      /* f32 vector, small */
    G_NV_W,      /* nvfp4 packed weight (quantizes the whole linear, caches scales) */
    G_NV_S,      /* its e4m3 block scales (from the cache) */
    G_NV_G,      /* global scale(s), F32 scalar or [2] when stacked; inverse for CT naming */
    G_NV_IN,     /* static input scale (inverse for CT naming) */
    G_MX_W,      /* mxfp8 weight (quantizes the whole linear, caches scales) */
    G_MX_S       /* its ue8m0 scales */
} gkind;

typedef struct gitem {
    char name[192];
    gkind kind;
    fp4_dtype dt;
    int ndim;
    int64_t shape[2];
    int n, k;            /* linear rows (all parts) and columns */
    int parts;           /* 2 when gate and up are stacked */
    float sigma[2];
    int inverse;         /* compressed-tensors: store 1/scale */
    uint64_t bytes;
    int shard;
} gitem;

typedef struct plan {
    gitem *items;
    int n, cap;
} plan;

static gitem *add(plan *p, fp4_err *e)
{
    if (p->n == p->cap) {
        int ncap = p->cap ? p->cap * 2 : 1024;
        gitem *ni = realloc(p->items, (size_t)ncap * sizeof *ni);
        if (!ni) {
            fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory planning tensors");
            return NULL;
        }
        p->items = ni;
        p->cap = ncap;
    }
    gitem *it = &p->items[p->n++];
    memset(it, 0, sizeof *it);
    it->parts = 1;
    return it;
}

static void set_shape(gitem *it, fp4_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    it->dt = dt;
    it->ndim = ndim;
    it->shape[0] = d0;
    it->shape[1] = d1;
    uint64_t numel = ndim == 0 ? 1 : ndim == 1 ? (uint64_t)d0 : (uint64_t)d0 * (uint64_t)d1;
    it->bytes = numel * fp4_dtype_size(dt);
}

typedef struct genctx {
    const fp4_gen_options *o;
    const fp4_preset *p;
    fp4_arch arch;
    int n_layers;
} genctx;

/* A linear module `base` (no suffix) of shape [n, k] in weight scheme w. */
static fp4moe_status plan_linear(genctx *g, plan *p, const char *base, int n, int k, fp4_wscheme w,
                                 fp4_ascheme a, int parts, const float *sigma, fp4_err *e)
{
    int ct = g->o->format == FP4_QF_COMPRESSED_TENSORS || g->o->format == FP4_QF_MINIMAX_M31;
    gitem *it;
    if (w == FP4_W_BF16) {
        if (!(it = add(p, e)))
            return e->status;
        snprintf(it->name, sizeof it->name, "%s.weight", base);
        it->kind = G_BF16;
        it->sigma[0] = sigma[0];
        set_shape(it, FP4_DT_BF16, 2, n, k);
        return FP4MOE_OK;
    }
    if (w == FP4_W_MXFP8) {
        int mm = g->o->format == FP4_QF_MINIMAX_M31;
        if (!(it = add(p, e)))
            return e->status;
        snprintf(it->name, sizeof it->name, "%s.weight", base);
        it->kind = G_MX_W;
        it->n = n;
        it->k = k;
        it->sigma[0] = sigma[0];
        set_shape(it, FP4_DT_F8_E4M3, 2, n, k);
        if (!(it = add(p, e)))
            return e->status;
        snprintf(it->name, sizeof it->name, "%s.%s", base, mm ? "weight_scale_inv" : "weight_scale");
        it->kind = G_MX_S;
        set_shape(it, FP4_DT_U8, 2, n, k / 32);
        return FP4MOE_OK;
    }
    /* nvfp4 */
    if (!(it = add(p, e)))
        return e->status;
    snprintf(it->name, sizeof it->name, "%s.%s", base, ct ? "weight_packed" : "weight");
    it->kind = G_NV_W;
    it->n = n;
    it->k = k;
    it->parts = parts;
    it->sigma[0] = sigma[0];
    it->sigma[1] = sigma[parts - 1];
    set_shape(it, FP4_DT_U8, 2, n, k / 2);
    if (!(it = add(p, e)))
        return e->status;
    snprintf(it->name, sizeof it->name, "%s.weight_scale", base);
    it->kind = G_NV_S;
    set_shape(it, FP4_DT_F8_E4M3, 2, n, k / 16);
    if (!(it = add(p, e)))
        return e->status;
    snprintf(it->name, sizeof it->name, "%s.%s", base, ct ? "weight_global_scale" : "weight_scale_2");
    it->kind = G_NV_G;
    it->parts = parts;
    it->sigma[0] = sigma[0];
    it->sigma[1] = sigma[parts - 1];
    it->inverse = ct;
    if (parts == 2)
        set_shape(it, FP4_DT_F32, 1, 2, 0);
    else
        set_shape(it, FP4_DT_F32, 0, 0, 0);
    if (a == FP4_A_NVFP4_STATIC) {
        if (!(it = add(p, e)))
            return e->status;
        snprintf(it->name, sizeof it->name, "%s.%s", base, ct ? "input_global_scale" : "input_scale");
        it->kind = G_NV_IN;
        it->inverse = ct;
        set_shape(it, FP4_DT_F32, 0, 0, 0);
    }
    return FP4MOE_OK;
}

static fp4_wscheme base_scheme(const genctx *g)
{
    return g->o->format == FP4_QF_COMPRESSED_TENSORS ? FP4_W_BF16 : FP4_W_MXFP8;
}

static fp4_ascheme fc_act(const genctx *g, int fc2)
{
    if (g->o->act == FP4_A_NVFP4_PER_TOKEN)
        return fc2 ? FP4_A_NONE : FP4_A_NVFP4_PER_TOKEN;
    return g->o->act;
}

static fp4moe_status plan_layer(genctx *g, plan *p, int L, fp4_err *e)
{
    const fp4_preset *ps = g->p;
    const fp4_arch *a = &g->arch;
    char base[192];
    fp4moe_status st;
    gitem *it;
    const char *pre = a->prefix;
    float s_attn[1] = {0.02f};
    const char *norms[] = {"input_layernorm", "post_attention_layernorm", "self_attn.q_norm",
                           "self_attn.k_norm", "self_attn.index_q_norm", "self_attn.index_k_norm"};
    int norm_dims[] = {ps->hidden, ps->hidden, ps->head_dim, ps->head_dim, ps->head_dim, ps->head_dim};
    for (int i = 0; i < 6; i++) {
        if (!(it = add(p, e)))
            return e->status;
        snprintf(it->name, sizeof it->name, "%smodel.layers.%d.%s.weight", pre, L, norms[i]);
        it->kind = G_NORM;
        set_shape(it, FP4_DT_BF16, 1, norm_dims[i], 0);
    }
    struct { const char *n; int rows, cols; } attn[] = {
        {"q_proj", ps->heads * ps->head_dim, ps->hidden},
        {"k_proj", ps->kv_heads * ps->head_dim, ps->hidden},
        {"v_proj", ps->kv_heads * ps->head_dim, ps->hidden},
        {"o_proj", ps->hidden, ps->heads * ps->head_dim},
        {"index_q_proj", ps->index_heads * ps->head_dim, ps->hidden},
        {"index_k_proj", ps->head_dim, ps->hidden},
    };
    for (int i = 0; i < 6; i++) {
        snprintf(base, sizeof base, "%smodel.layers.%d.self_attn.%s", pre, L, attn[i].n);
        if ((st = plan_linear(g, p, base, attn[i].rows, attn[i].cols, base_scheme(g), FP4_A_NONE, 1, s_attn, e)))
            return st;
    }
    static const char *which[3] = {"gate", "up", "down"};
    if (!a->is_moe[L]) {
        for (int w = 0; w < 3; w++) {
            fp4_name_dense(a, base, sizeof base, L, which[w], "x");
            base[strlen(base) - 2] = '\0';
            int rows = w == 2 ? ps->hidden : ps->dense_inter, cols = w == 2 ? ps->dense_inter : ps->hidden;
            if ((st = plan_linear(g, p, base, rows, cols, base_scheme(g), FP4_A_NONE, 1, s_attn, e)))
                return st;
        }
        return FP4MOE_OK;
    }
    if (!(it = add(p, e)))
        return e->status;
    fp4_name_router(a, it->name, sizeof it->name, L, "weight");
    it->kind = G_F32;
    it->sigma[0] = 0.05f;
    set_shape(it, FP4_DT_F32, 2, a->n_experts, a->hidden);
    if (!(it = add(p, e)))
        return e->status;
    fp4_name_router(a, it->name, sizeof it->name, L, "bias");
    it->kind = G_BIAS;
    set_shape(it, FP4_DT_F32, 1, a->n_experts, 0);
    int stacked = g->o->format == FP4_QF_MINIMAX_M31;
    rng er = rng_for(g->o->seed, "expert-sigmas");
    for (int j = 0; j < a->n_experts; j++) {
        /* Per-expert spread of magnitudes, so every expert has its own global scales. */
        float sg[2] = {0.02f * (0.6f + 0.8f * uniform(&er)), 0.02f * (0.6f + 0.8f * uniform(&er))};
        float sd[1] = {0.02f * (0.6f + 0.8f * uniform(&er))};
        int I = a->moe_intermediate, H = a->hidden;
        if (stacked) {
            fp4_name_expert(a, base, sizeof base, L, j, "gate", "x");
            base[strlen(base) - 2] = '\0';
            if ((st = plan_linear(g, p, base, 2 * I, H, FP4_W_NVFP4, fc_act(g, 0), 2, sg, e)))
                return st;
        } else {
            for (int w = 0; w < 2; w++) {
                fp4_name_expert(a, base, sizeof base, L, j, which[w], "x");
                base[strlen(base) - 2] = '\0';
                if ((st = plan_linear(g, p, base, I, H, FP4_W_NVFP4, fc_act(g, 0), 1, &sg[w], e)))
                    return st;
            }
        }
        fp4_name_expert(a, base, sizeof base, L, j, "down", "x");
        base[strlen(base) - 2] = '\0';
        if ((st = plan_linear(g, p, base, H, I, FP4_W_NVFP4, fc_act(g, 1), 1, sd, e)))
            return st;
    }
    if (a->shared_intermediate > 0)
        for (int w = 0; w < 3; w++) {
            fp4_name_shared(a, base, sizeof base, L, which[w], "x");
            base[strlen(base) - 2] = '\0';
            int rows = w == 2 ? a->hidden : a->shared_intermediate, cols = w == 2 ? a->shared_intermediate : a->hidden;
            if ((st = plan_linear(g, p, base, rows, cols, base_scheme(g), FP4_A_NONE, 1, s_attn, e)))
                return st;
        }
    return FP4MOE_OK;
}

/* ---- config and quantization metadata ---------------------------------------------------- */

static cJSON *arch_json(const genctx *g)
{
    const fp4_preset *p = g->p;
    cJSON *c = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString("MiniMaxM3ForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", "minimax_m3");
    cJSON_AddNumberToObject(c, "hidden_size", p->hidden);
    cJSON_AddNumberToObject(c, "num_hidden_layers", g->n_layers);
    cJSON_AddNumberToObject(c, "first_k_dense_replace", p->first_dense);
    cJSON_AddNumberToObject(c, "intermediate_size", p->dense_inter);
    cJSON_AddNumberToObject(c, "num_local_experts", p->n_experts);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", p->moe_inter);
    cJSON_AddNumberToObject(c, "shared_intermediate_size", p->shared_inter);
    cJSON_AddNumberToObject(c, "num_experts_per_tok", g->o->topk ? g->o->topk : p->topk);
    cJSON_AddStringToObject(c, "hidden_act", "swigluoai");
    cJSON_AddNumberToObject(c, "swiglu_limit", 7.0);
    cJSON_AddNumberToObject(c, "swiglu_alpha", 1.702);
    cJSON_AddStringToObject(c, "scoring_func", "sigmoid");
    cJSON_AddBoolToObject(c, "use_routing_bias", 1);
    cJSON_AddBoolToObject(c, "norm_topk_prob", 1);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", 2.0);
    cJSON_AddNumberToObject(c, "num_attention_heads", p->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", p->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", p->head_dim);
    cJSON_AddNumberToObject(c, "index_n_heads", p->index_heads);
    cJSON_AddNumberToObject(c, "index_head_dim", p->head_dim);
    cJSON_AddNumberToObject(c, "vocab_size", p->vocab);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
    cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");
    cJSON_AddBoolToObject(c, "tie_word_embeddings", 0);
    return c;
}

static const char *act_spelling(fp4_ascheme a)
{
    return a == FP4_A_NVFP4_PER_TOKEN ? "dynamic_per_token" : a == FP4_A_NVFP4_STATIC ? "static" : "none";
}

/* ModelOpt MIXED_PRECISION: one quantized_layers entry per quantized linear module. */
static cJSON *modelopt_quant(const genctx *g)
{
    const fp4_arch *a = &g->arch;
    char m[192];
    static const char *which[3] = {"gate", "up", "down"};
    static const char *attn[6] = {"q_proj", "k_proj", "v_proj", "o_proj", "index_q_proj", "index_k_proj"};
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_algo", "MIXED_PRECISION");
    cJSON_AddNullToObject(q, "kv_cache_quant_algo");
    cJSON *ex = cJSON_AddArrayToObject(q, "exclude_modules");
    cJSON_AddItemToArray(ex, cJSON_CreateString("lm_head"));
    cJSON_AddItemToArray(ex, cJSON_CreateString("*block_sparse_moe.gate"));
    cJSON *ql = cJSON_AddObjectToObject(q, "quantized_layers");
    for (int L = 0; L < g->n_layers; L++) {
        for (int i = 0; i < 6; i++) {
            snprintf(m, sizeof m, "model.layers.%d.self_attn.%s", L, attn[i]);
            cJSON *o = cJSON_AddObjectToObject(ql, m);
            cJSON_AddStringToObject(o, "quant_algo", "MXFP8");
        }
        for (int w = 0; w < 3; w++) {
            if (!a->is_moe[L]) {
                fp4_name_dense_module(a, m, sizeof m, L, which[w]);
                cJSON_AddStringToObject(cJSON_AddObjectToObject(ql, m), "quant_algo", "MXFP8");
                continue;
            }
            if (a->shared_intermediate > 0) {
                fp4_name_shared_module(a, m, sizeof m, L, which[w]);
                cJSON_AddStringToObject(cJSON_AddObjectToObject(ql, m), "quant_algo", "MXFP8");
            }
            fp4_ascheme act = fc_act(g, w == 2);
            for (int j = 0; j < a->n_experts; j++) {
                fp4_name_expert_module(a, m, sizeof m, L, j, which[w]);
                cJSON *o = cJSON_AddObjectToObject(ql, m);
                cJSON_AddStringToObject(o, "quant_algo", act == FP4_A_NONE ? "W4A16_NVFP4" : "NVFP4");
                cJSON_AddNumberToObject(o, "group_size", 16);
                if (act == FP4_A_NVFP4_PER_TOKEN)
                    cJSON_AddStringToObject(o, "activation_scheme", act_spelling(act));
            }
        }
    }
    return q;
}

static cJSON *ct_group(const char *target, fp4_ascheme act)
{
    cJSON *grp = cJSON_CreateObject();
    cJSON *t = cJSON_AddArrayToObject(grp, "targets");
    cJSON_AddItemToArray(t, cJSON_CreateString(target));
    cJSON *w = cJSON_AddObjectToObject(grp, "weights");
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "type", "float");
    cJSON_AddStringToObject(w, "strategy", "tensor_group");
    cJSON_AddNumberToObject(w, "group_size", 16);
    cJSON_AddBoolToObject(w, "symmetric", 1);
    cJSON_AddBoolToObject(w, "dynamic", 0);
    if (act == FP4_A_NONE) {
        cJSON_AddNullToObject(grp, "input_activations");
    } else {
        cJSON *ia = cJSON_AddObjectToObject(grp, "input_activations");
        cJSON_AddNumberToObject(ia, "num_bits", 4);
        cJSON_AddStringToObject(ia, "type", "float");
        cJSON_AddStringToObject(ia, "strategy", act == FP4_A_NVFP4_PER_TOKEN ? "token" : "tensor_group");
        cJSON_AddNumberToObject(ia, "group_size", 16);
        cJSON_AddBoolToObject(ia, "dynamic", act == FP4_A_NVFP4_PER_TOKEN);
        cJSON_AddBoolToObject(ia, "symmetric", 1);
    }
    cJSON_AddStringToObject(grp, "format", "nvfp4-pack-quantized");
    return grp;
}

static cJSON *ct_quant(const genctx *g)
{
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(q, "format", "nvfp4-pack-quantized");
    cJSON_AddStringToObject(q, "quantization_status", "compressed");
    cJSON *cg = cJSON_AddObjectToObject(q, "config_groups");
    cJSON_AddItemToObject(cg, "group_0", ct_group("re:.*experts\\.[0-9]+\\.(w1|w3)$", fc_act(g, 0)));
    cJSON_AddItemToObject(cg, "group_1", ct_group("re:.*experts\\.[0-9]+\\.w2$", fc_act(g, 1)));
    cJSON *ig = cJSON_AddArrayToObject(q, "ignore");
    cJSON_AddItemToArray(ig, cJSON_CreateString("lm_head"));
    return q;
}

static cJSON *minimax_quant(const genctx *g)
{
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "quant_method", "mxfp8");
    cJSON *bs = cJSON_AddArrayToObject(q, "weight_block_size");
    cJSON_AddItemToArray(bs, cJSON_CreateNumber(1));
    cJSON_AddItemToArray(bs, cJSON_CreateNumber(32));
    cJSON_AddStringToObject(q, "moe_quant_algo", "NVFP4");
    cJSON_AddStringToObject(q, "moe_quant_format", "nvfp4-pack-quantized");
    if (g->o->act == FP4_A_NVFP4_PER_TOKEN)
        cJSON_AddStringToObject(q, "moe_fc1_activation_scheme", act_spelling(FP4_A_NVFP4_PER_TOKEN));
    else if (g->o->act == FP4_A_NVFP4_STATIC)
        cJSON_AddStringToObject(q, "moe_activation_scheme", act_spelling(FP4_A_NVFP4_STATIC));
    cJSON *nc = cJSON_AddArrayToObject(q, "modules_to_not_convert");
    cJSON_AddItemToArray(nc, cJSON_CreateString("lm_head"));
    return q;
}

static fp4moe_status write_json(const char *dir, const char *name, cJSON *j, fp4_err *e)
{
    char path[4096];
    if (!fp4_path_join(path, sizeof path, dir, name))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "path too long: '%s'", dir);
    char *text = cJSON_Print(j);
    if (!text)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory printing %s", name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        return fp4_fail(e, FP4MOE_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    }
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(text);
    if (!ok)
        return fp4_fail(e, FP4MOE_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    return FP4MOE_OK;
}

/* ---- drawing and writing tensors ----------------------------------------------------------- */

typedef struct cache {
    uint8_t *a, *b;      /* nvfp4: packed, scales;  mxfp8: codes, scales */
    size_t na, nb;
    float *rows;         /* row-chunk scratch */
    size_t rows_cap;
} cache;

static fp4moe_status ensure(uint8_t **p, size_t *have, size_t need, fp4_err *e)
{
    if (*have >= need)
        return FP4MOE_OK;
    uint8_t *np = realloc(*p, need);
    if (!np)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory (%zu bytes) generating a tensor", need);
    *p = np;
    *have = need;
    return FP4MOE_OK;
}

static float nv_global(float sigma)
{
    return Z_BOUND * sigma / (6.0f * 448.0f);
}

static fp4moe_status put_floats_as(fp4_st_writer *w, const float *x, size_t n, fp4_dtype dt,
                                   uint8_t *tmp, fp4_err *e)
{
    if (dt == FP4_DT_F32)
        return fp4_st_writer_put(w, x, n * 4, e);
    for (size_t i = 0; i < n; i++) {
        uint16_t b = fp4moe_bf16_from_float(x[i]);
        memcpy(tmp + 2 * i, &b, 2);
    }
    return fp4_st_writer_put(w, tmp, n * 2, e);
}

static fp4moe_status draw_item(const genctx *g, const gitem *it, fp4_st_writer *w, cache *c,
                               fp4_err *e)
{
    fp4moe_status st;
    rng r = rng_for(g->o->seed, it->name);
    if (it->kind == G_NV_S || it->kind == G_MX_S) /* scales cached by the weight before */
        return fp4_st_writer_put(w, c->b, it->bytes, e);
    if (it->kind == G_NV_G) {
        float v[2];
        for (int p = 0; p < it->parts; p++) {
            v[p] = nv_global(it->sigma[p]);
            if (it->inverse)
                v[p] = 1.0f / v[p];
        }
        return fp4_st_writer_put(w, v, 4 * (size_t)it->parts, e);
    }
    if (it->kind == G_NV_IN) {
        float v = ACT_AMAX / (6.0f * 448.0f);
        if (it->inverse)
            v = 1.0f / v;
        return fp4_st_writer_put(w, &v, 4, e);
    }
    int64_t rows = it->ndim == 2 ? it->shape[0] : 1;
    int64_t cols = it->ndim == 2 ? it->shape[1] : it->ndim == 1 ? it->shape[0] : 1;
    if (it->kind == G_NV_W || it->kind == G_MX_W)
        cols = it->k;
    size_t chunk_rows = ROW_CHUNK_BYTES / (4 * (size_t)cols);
    if (chunk_rows < 1)
        chunk_rows = 1;
    size_t need = chunk_rows * (size_t)cols * 4;
    if (c->rows_cap < need) {
        float *nr = realloc(c->rows, need);
        if (!nr)
            return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory generating '%s'", it->name);
        c->rows = nr;
        c->rows_cap = need;
    }
    if (it->kind == G_NV_W && ((st = ensure(&c->a, &c->na, it->bytes, e)) ||
                               (st = ensure(&c->b, &c->nb, (size_t)it->n * (size_t)it->k / 16, e))))
        return st;
    if (it->kind == G_MX_W && ((st = ensure(&c->a, &c->na, it->bytes, e)) ||
                               (st = ensure(&c->b, &c->nb, (size_t)it->n * (size_t)it->k / 32, e))))
        return st;
    uint8_t *tmp = NULL;
    size_t tmp_n = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += (int64_t)chunk_rows) {
        int64_t nr = rows - r0 < (int64_t)chunk_rows ? rows - r0 : (int64_t)chunk_rows;
        size_t n = (size_t)nr * (size_t)cols;
        float *x = c->rows;
        for (size_t i = 0; i < n; i++) {
            switch (it->kind) {
            case G_NORM: x[i] = 1.0f + 0.01f * znorm(&r); break;
            case G_BIAS: x[i] = 0.01f * znorm(&r); break;
            case G_NV_W: {
                int part = it->parts == 2 && (r0 + (int64_t)(i / (size_t)cols)) >= it->n / 2;
                x[i] = it->sigma[part] * znorm(&r);
                break;
            }
            default: x[i] = it->sigma[0] * znorm(&r); break;
            }
        }
        switch (it->kind) {
        case G_NV_W:
            for (int64_t rr = 0; rr < nr; rr++) {
                int64_t row = r0 + rr;
                int part = it->parts == 2 && row >= it->n / 2;
                fp4moe_nvfp4_quantize(x + (size_t)rr * (size_t)cols, (size_t)cols, nv_global(it->sigma[part]),
                                      c->a + (size_t)row * (size_t)cols / 2, c->b + (size_t)row * (size_t)cols / 16);
            }
            break;
        case G_MX_W:
            fp4moe_mxfp8_quantize(x, n, c->a + (size_t)r0 * (size_t)cols, c->b + (size_t)r0 * (size_t)cols / 32);
            break;
        default:
            if ((st = ensure(&tmp, &tmp_n, n * 2, e)) ||
                (st = put_floats_as(w, x, n, it->dt, tmp, e))) {
                free(tmp);
                return st;
            }
        }
    }
    free(tmp);
    if (it->kind == G_NV_W || it->kind == G_MX_W)
        return fp4_st_writer_put(w, c->a, it->bytes, e);
    return FP4MOE_OK;
}

static fp4moe_status plan_model(genctx *g, plan *p, fp4_err *e)
{
    const fp4_preset *ps = g->p;
    const char *pre = g->arch.prefix;
    gitem *it;
    fp4moe_status st;
    float s_emb[1] = {0.02f};
    if (!(it = add(p, e)))
        return e->status;
    snprintf(it->name, sizeof it->name, "%smodel.embed_tokens.weight", pre);
    it->kind = G_BF16;
    it->sigma[0] = s_emb[0];
    set_shape(it, FP4_DT_BF16, 2, ps->vocab, ps->hidden);
    for (int L = 0; L < g->n_layers; L++)
        if ((st = plan_layer(g, p, L, e)))
            return st;
    if (!(it = add(p, e)))
        return e->status;
    snprintf(it->name, sizeof it->name, "%smodel.norm.weight", pre);
    it->kind = G_NORM;
    set_shape(it, FP4_DT_BF16, 1, ps->hidden, 0);
    if (!(it = add(p, e)))
        return e->status;
    snprintf(it->name, sizeof it->name, "%slm_head.weight", pre);
    it->kind = G_BF16;
    it->sigma[0] = s_emb[0];
    set_shape(it, FP4_DT_BF16, 2, ps->vocab, ps->hidden);
    return FP4MOE_OK;
}

static void shard_name(char *buf, size_t len, int s, int n)
{
    if (n == 1)
        snprintf(buf, len, "model.safetensors");
    else
        snprintf(buf, len, "model-%05d-of-%05d.safetensors", s + 1, n);
}

static fp4moe_status write_shards(genctx *g, plan *p, const char *tmpdir, int n_shards, fp4_err *e)
{
    fp4moe_status st = FP4MOE_OK;
    cache c = {0};
    fp4_st_desc *descs = malloc((size_t)p->n * sizeof *descs);
    if (!descs)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    const char *meta[2] = {"format", "pt"};
    int i0 = 0;
    for (int s = 0; s < n_shards && st == FP4MOE_OK; s++) {
        int i1 = i0;
        while (i1 < p->n && p->items[i1].shard == s) {
            fp4_st_desc *d = &descs[i1 - i0];
            memset(d, 0, sizeof *d);
            d->name = p->items[i1].name;
            d->dtype = p->items[i1].dt;
            d->ndim = p->items[i1].ndim;
            d->shape[0] = p->items[i1].shape[0];
            d->shape[1] = p->items[i1].shape[1];
            i1++;
        }
        char name[64], path[4096];
        shard_name(name, sizeof name, s, n_shards);
        if (!fp4_path_join(path, sizeof path, tmpdir, name)) {
            st = fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "path too long: '%s'", tmpdir);
            break;
        }
        fp4_st_writer *w = NULL;
        if ((st = fp4_st_writer_begin(path, descs, i1 - i0, meta, 1, &w, e)))
            break;
        for (int i = i0; i < i1 && st == FP4MOE_OK; i++)
            st = draw_item(g, &p->items[i], w, &c, e);
        if (st == FP4MOE_OK)
            st = fp4_st_writer_finish(w, e);
        else
            fp4_st_writer_abort(w);
        if (st == FP4MOE_OK && g->o->progress)
            g->o->progress(g->o->progress_ctx, s + 1, n_shards);
        i0 = i1;
    }
    free(descs);
    free(c.a);
    free(c.b);
    free(c.rows);
    return st;
}

static void remove_tree(const char *dir, int n_shards)
{
    char path[4096], name[64];
    static const char *files[] = {"config.json", "hf_quant_config.json", "model.safetensors.index.json"};
    for (int s = 0; s < n_shards; s++) {
        shard_name(name, sizeof name, s, n_shards);
        if (fp4_path_join(path, sizeof path, dir, name)) {
            unlink(path);
            strncat(path, ".tmp", sizeof path - strlen(path) - 1);
            unlink(path);
        }
    }
    for (int i = 0; i < 3; i++)
        if (fp4_path_join(path, sizeof path, dir, files[i]))
            unlink(path);
    rmdir(dir);
}

fp4moe_status fp4_gen(const fp4_gen_options *o, fp4_err *e)
{
    genctx g = {.o = o};
    plan p = {0};
    cJSON *config = NULL, *quant = NULL, *index = NULL;
    fp4moe_status st;
    char tmpdir[4096];
    int n_shards = 0, made_dir = 0;
    struct stat sb;

    if (!o->dir || !o->dir[0])
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "gen: expected an output directory");
    if (!(g.p = fp4_preset_find(o->preset ? o->preset : "")))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "--preset '%s': expected one of %s",
                        o->preset ? o->preset : "", fp4_preset_names());
    if (o->format != FP4_QF_MODELOPT && o->format != FP4_QF_COMPRESSED_TENSORS && o->format != FP4_QF_MINIMAX_M31)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "--format: expected modelopt, compressed-tensors or minimax-m31");
    if (o->layers < 0 || o->layers > g.p->n_layers)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "--layers %d: expected 1..%d for preset '%s'", o->layers,
                        g.p->n_layers, g.p->name);
    if (o->topk < 0 || o->topk > g.p->n_experts)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "--topk %d: expected 1..%d for preset '%s'", o->topk,
                        g.p->n_experts, g.p->name);
    if (stat(o->dir, &sb) == 0)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "'%s' already exists; gen writes a new directory and never overwrites (remove it first)",
                        o->dir);
    g.n_layers = o->layers ? o->layers : g.p->n_layers;

    /* The config is written first as JSON and parsed back, so gen names tensors exactly as
     * the loader will look for them. */
    cJSON *inner = arch_json(&g);
    if (o->format == FP4_QF_MINIMAX_M31) {
        config = cJSON_CreateObject();
        cJSON_AddStringToObject(config, "model_type", "minimax_m3_vl");
        cJSON *archs = cJSON_AddArrayToObject(config, "architectures");
        cJSON_AddItemToArray(archs, cJSON_CreateString("MiniMaxM3ForConditionalGeneration"));
        cJSON_AddItemToObject(config, "text_config", inner);
    } else {
        config = inner;
    }
    if ((st = fp4_arch_parse(config, "generated config.json", &g.arch, e)))
        goto out;
    switch (o->format) {
    case FP4_QF_MODELOPT:
        quant = cJSON_CreateObject();
        cJSON *prod = cJSON_AddObjectToObject(quant, "producer");
        cJSON_AddStringToObject(prod, "name", "modelopt");
        cJSON_AddStringToObject(prod, "version", "fp4moe-gen " FP4MOE_VERSION);
        cJSON_AddItemToObject(quant, "quantization", modelopt_quant(&g));
        break;
    case FP4_QF_COMPRESSED_TENSORS:
        cJSON_AddItemToObject(config, "quantization_config", ct_quant(&g));
        break;
    default:
        cJSON_AddItemToObject(config, "quantization_config", minimax_quant(&g));
        break;
    }

    if ((st = plan_model(&g, &p, e)))
        goto out;
    uint64_t shard_size = o->shard_size ? o->shard_size : 5000000000ull, in_shard = 0, total = 0;
    for (int i = 0; i < p.n; i++) {
        if (in_shard > 0 && in_shard + p.items[i].bytes > shard_size) {
            n_shards++;
            in_shard = 0;
        }
        p.items[i].shard = n_shards;
        in_shard += p.items[i].bytes;
        total += p.items[i].bytes;
    }
    n_shards++;

    int n = snprintf(tmpdir, sizeof tmpdir, "%s.partial-%ld", o->dir, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmpdir - 64) {
        st = fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "path too long: '%s'", o->dir);
        goto out;
    }
    if (mkdir(tmpdir, 0755) != 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "cannot create '%s': %s", tmpdir, strerror(errno));
        goto out;
    }
    made_dir = 1;
    if ((st = write_shards(&g, &p, tmpdir, n_shards, e)))
        goto out;
    if (n_shards > 1) {
        index = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        cJSON *wm = cJSON_AddObjectToObject(index, "weight_map");
        char name[64];
        for (int i = 0; i < p.n; i++) {
            shard_name(name, sizeof name, p.items[i].shard, n_shards);
            cJSON_AddStringToObject(wm, p.items[i].name, name);
        }
        if ((st = write_json(tmpdir, "model.safetensors.index.json", index, e)))
            goto out;
    }
    if (quant && (st = write_json(tmpdir, "hf_quant_config.json", quant, e)))
        goto out;
    if (o->format == FP4_QF_MODELOPT) {
        /* ModelOpt exports repeat the metadata in config.json. */
        cJSON *qc = cJSON_Duplicate(cJSON_GetObjectItem(quant, "quantization"), 1);
        cJSON_AddStringToObject(qc, "quant_method", "modelopt");
        cJSON_AddItemToObject(config, "quantization_config", qc);
    }
    if ((st = write_json(tmpdir, "config.json", config, e)))
        goto out;
    if (rename(tmpdir, o->dir) != 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "cannot rename '%s' to '%s': %s", tmpdir, o->dir, strerror(errno));
        goto out;
    }
    made_dir = 0;
out:
    if (made_dir)
        remove_tree(tmpdir, n_shards);
    free(p.items);
    cJSON_Delete(config);
    cJSON_Delete(quant);
    cJSON_Delete(index);
    return st;
}
