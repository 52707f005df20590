/*
 * layer_load.c - see layer_load.h. Views only: the returned linears point into the
 * checkpoint's read-only mappings; the router (any float dtype on disk) is converted to fp32.
 */
#include "layer_load.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *shape_str(const fp4_st_tensor *t, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < t->ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

/* The tensor base.suffix if present (*out NULL when absent and optional). */
static fp4moe_status get_opt(fp4_ckpt *c, const char *base, const char *suffix,
                             const fp4_st_tensor **out, fp4_err *e)
{
    char name[512];
    snprintf(name, sizeof name, "%s.%s", base, suffix);
    *out = NULL;
    if (fp4_ckpt_find(c, name) < 0)
        return FP4MOE_OK;
    return fp4_ckpt_get(c, name, out, e);
}

static fp4moe_status expect(const fp4_st_tensor *t, const char *what, fp4_dtype dt1, fp4_dtype dt2,
                            int64_t d0, int64_t d1, fp4_err *e)
{
    char sb[128];
    if (t->dtype != dt1 && t->dtype != dt2)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s' (%s): expected dtype %s%s%s, found %s", t->name,
                        what, fp4_dtype_name(dt1), dt2 != dt1 ? " or " : "",
                        dt2 != dt1 ? fp4_dtype_name(dt2) : "", fp4_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] != d0 || t->shape[1] != d1)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s' (%s): expected shape [%lld, %lld], found %s",
                        t->name, what, (long long)d0, (long long)d1, shape_str(t, sb, sizeof sb));
    return FP4MOE_OK;
}

/* A float scalar (or element idx of a small vector) of dtype F32/BF16/F16. */
/* Element i of an F32 or BF16 tensor (dtype checked by the caller). */
static void read_scalar_any(const fp4_st_tensor *t, size_t i, float *out)
{
    if (t->dtype == FP4_DT_F32) {
        memcpy(out, t->data + 4 * i, 4);
    } else {
        uint16_t b;
        memcpy(&b, t->data + 2 * i, 2);
        *out = fp4moe_bf16_to_float(b);
    }
}

/* Element idx of a small F32/BF16 tensor that must hold exactly count elements. */
static fp4moe_status read_scalar(const fp4_st_tensor *t, int idx, int count, float *out, fp4_err *e)
{
    if (t->numel != (size_t)count)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s': expected %d element%s, found %zu", t->name,
                        count, count > 1 ? "s" : "", t->numel);
    if (t->dtype != FP4_DT_F32 && t->dtype != FP4_DT_BF16)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s': expected dtype F32, found %s", t->name,
                        fp4_dtype_name(t->dtype));
    read_scalar_any(t, (size_t)idx, out);
    return FP4MOE_OK;
}

static fp4moe_status global_scale(fp4_ckpt *c, const char *base, const char *direct,
                                  const char *inverse, int idx, int count, float *out, fp4_err *e)
{
    const fp4_st_tensor *t;
    fp4moe_status st = get_opt(c, base, direct, &t, e);
    int inv = 0;
    if (st == FP4MOE_OK && !t) {
        st = get_opt(c, base, inverse, &t, e);
        inv = 1;
    }
    if (st != FP4MOE_OK)
        return st;
    if (!t)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s.%s' (or '%s.%s') is expected by the quantization scheme but missing from '%s'",
                        base, direct, base, inverse, c->dir);
    float v;
    if ((st = read_scalar(t, idx, count, &v, e)) != FP4MOE_OK)
        return st;
    if (inv)
        v = 1.0f / v;
    if (!isfinite(v) || v <= 0.0f)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s': expected a positive finite scale, found %g%s",
                        t->name, (double)v, inv ? " (after inverting the stored global scale)" : "");
    *out = v;
    return FP4MOE_OK;
}

/* Bind rows [row0, row0+n) of the linear stored under tensor base `base`, whose full row
 * count is n_total; `part`/`parts` select which global scale of a stacked tensor applies. */
static fp4moe_status bind_linear(fp4_ckpt *c, const char *module, const char *base, int n,
                                 int k, int row0, int n_total, int part, int parts,
                                 fp4_linear *l, fp4_err *e)
{
    const fp4_st_tensor *w, *s;
    fp4moe_status st;
    memset(l, 0, sizeof *l);
    l->scheme = fp4_quant_scheme_for(c->quant, module);
    l->n = n;
    l->k = k;
    switch (l->scheme.w) {
    case FP4_W_NVFP4:
        if (k % 16)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': in_features %d is not a multiple of the NVFP4 group 16", base, k);
        if ((st = get_opt(c, base, "weight_packed", &w, e)) != FP4MOE_OK)
            return st;
        if (!w && (st = get_opt(c, base, "weight", &w, e)) != FP4MOE_OK)
            return st;
        if (!w)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s.weight' (or '.weight_packed') is expected by config.json (nvfp4) but missing from '%s'",
                            base, c->dir);
        if ((st = expect(w, "packed e2m1", FP4_DT_U8, FP4_DT_U8, n_total, k / 2, e)) != FP4MOE_OK)
            return st;
        if ((st = get_opt(c, base, "weight_scale", &s, e)) != FP4MOE_OK)
            return st;
        if (!s)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s.weight_scale' is expected by config.json (nvfp4) but missing from '%s'", base, c->dir);
        if ((st = expect(s, "e4m3 block scales", FP4_DT_F8_E4M3, FP4_DT_U8, n_total, k / 16, e)) != FP4MOE_OK)
            return st;
        l->w = w->data + (size_t)row0 * (size_t)(k / 2);
        l->scale = s->data + (size_t)row0 * (size_t)(k / 16);
        if ((st = global_scale(c, base, "weight_scale_2", "weight_global_scale", part, parts,
                               &l->global_scale, e)) != FP4MOE_OK)
            return st;
        if (l->scheme.a == FP4_A_NVFP4_STATIC &&
            (st = global_scale(c, base, "input_scale", "input_global_scale", 0, 1, &l->input_scale, e)) != FP4MOE_OK)
            return st;
        return FP4MOE_OK;
    case FP4_W_MXFP8:
        if (k % 32)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': in_features %d is not a multiple of the MXFP8 group 32", base, k);
        if ((st = get_opt(c, base, "weight", &w, e)) != FP4MOE_OK)
            return st;
        if (!w)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s.weight' is expected by config.json (mxfp8) but missing from '%s'", base, c->dir);
        if ((st = expect(w, "e4m3", FP4_DT_F8_E4M3, FP4_DT_U8, n_total, k, e)) != FP4MOE_OK)
            return st;
        if ((st = get_opt(c, base, "weight_scale_inv", &s, e)) != FP4MOE_OK)
            return st;
        if (!s && (st = get_opt(c, base, "weight_scale", &s, e)) != FP4MOE_OK)
            return st;
        if (!s)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s.weight_scale' (or '.weight_scale_inv') is expected by config.json (mxfp8) but missing from '%s'",
                            base, c->dir);
        if ((st = expect(s, "ue8m0 block scales", FP4_DT_U8, FP4_DT_F8_E8M0, n_total, k / 32, e)) != FP4MOE_OK)
            return st;
        l->w = w->data + (size_t)row0 * (size_t)k;
        l->scale = s->data + (size_t)row0 * (size_t)(k / 32);
        l->global_scale = 1.0f;
        return FP4MOE_OK;
    case FP4_W_BF16:
        if ((st = get_opt(c, base, "weight", &w, e)) != FP4MOE_OK)
            return st;
        if (!w)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s.weight' is expected by config.json (bf16) but missing from '%s'", base, c->dir);
        if ((st = expect(w, "bf16", FP4_DT_BF16, FP4_DT_BF16, n_total, k, e)) != FP4MOE_OK)
            return st;
        l->w = w->data + (size_t)row0 * (size_t)k * 2;
        l->global_scale = 1.0f;
        return FP4MOE_OK;
    }
    return fp4_fail(e, FP4MOE_ERR_INTERNAL, "'%s': unknown weight scheme", base);
}

static void strip_suffix(char *name, const char *suffix)
{
    size_t n = strlen(name), m = strlen(suffix);
    if (n > m && strcmp(name + n - m, suffix) == 0)
        name[n - m] = '\0';
}

/* The linear `which` of expert j (j < 0: shared expert; layer dense: dense MLP). */
static fp4moe_status bind_named(fp4_ckpt *c, int layer, int j, int dense, const char *which,
                                int n, int k, fp4_linear *l, fp4_err *e)
{
    const fp4_arch *a = &c->arch;
    char base[512], module[512];
    if (dense) {
        fp4_name_dense(a, base, sizeof base, layer, which, "x");
        fp4_name_dense_module(a, module, sizeof module, layer, which);
    } else if (j < 0) {
        fp4_name_shared(a, base, sizeof base, layer, which, "x");
        fp4_name_shared_module(a, module, sizeof module, layer, which);
    } else {
        fp4_name_expert(a, base, sizeof base, layer, j, which, "x");
        fp4_name_expert_module(a, module, sizeof module, layer, j, which);
    }
    strip_suffix(base, ".x");
    /* Stacked gate/up (MiniMax-M3.1 runtime form): w1 holds [2I, H/2], there is no w3. */
    if (!dense && j >= 0 && strcmp(which, "down") != 0) {
        char gate_base[512], gate_module[512], up_probe[512];
        fp4_name_expert(a, gate_base, sizeof gate_base, layer, j, "gate", "x");
        strip_suffix(gate_base, ".x");
        fp4_name_expert_module(a, gate_module, sizeof gate_module, layer, j, "gate");
        fp4_name_expert(a, up_probe, sizeof up_probe, layer, j, "up", "weight_packed");
        int up_present = fp4_ckpt_find(c, up_probe) >= 0;
        fp4_name_expert(a, up_probe, sizeof up_probe, layer, j, "up", "weight");
        up_present |= fp4_ckpt_find(c, up_probe) >= 0;
        if (!up_present) {
            int up = strcmp(which, "up") == 0;
            fp4moe_status st = bind_linear(c, gate_module, gate_base, n, k, up ? n : 0, 2 * n, up, 2, l, e);
            if (st != FP4MOE_OK)
                return fp4_err_prefix(e, "layer %d expert %d (no separate up projection, so w1 must stack gate and up)", layer, j);
            return FP4MOE_OK;
        }
    }
    return bind_linear(c, module, base, n, k, 0, n, 0, 1, l, e);
}

static fp4moe_status read_router(fp4_ckpt *c, int layer, fp4_moe_weights *w, fp4_err *e)
{
    const fp4_arch *a = &c->arch;
    char name[512], sb[128];
    const fp4_st_tensor *t;
    fp4moe_status st;
    fp4_name_router(a, name, sizeof name, layer, "weight");
    if ((st = fp4_ckpt_get(c, name, &t, e)) != FP4MOE_OK)
        return st;
    if (t->ndim != 2 || t->shape[0] != a->n_experts || t->shape[1] != a->hidden)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s' (router): expected shape [%d, %d], found %s", name,
                        a->n_experts, a->hidden, shape_str(t, sb, sizeof sb));
    if (t->dtype != FP4_DT_F32 && t->dtype != FP4_DT_BF16)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s' (router): expected dtype F32 or BF16, found %s", name,
                        fp4_dtype_name(t->dtype));
    size_t n = (size_t)a->n_experts * (size_t)a->hidden;
    w->router = malloc(n * sizeof(float));
    if (!w->router)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory for router of layer %d", layer);
    for (size_t i = 0; i < n; i++)
        read_scalar_any(t, i, &w->router[i]);
    if (!a->has_score_bias)
        return FP4MOE_OK;
    fp4_name_router(a, name, sizeof name, layer, "bias");
    if ((st = fp4_ckpt_get(c, name, &t, e)) != FP4MOE_OK)
        return st;
    if (t->numel != (size_t)a->n_experts || (t->dtype != FP4_DT_F32 && t->dtype != FP4_DT_BF16))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s' (router bias): expected %d F32 or BF16 values, found %zu %s",
                        name, a->n_experts, t->numel, fp4_dtype_name(t->dtype));
    w->router_bias = malloc((size_t)a->n_experts * sizeof(float));
    if (!w->router_bias)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory for router bias of layer %d", layer);
    for (int i = 0; i < a->n_experts; i++)
        read_scalar_any(t, (size_t)i, &w->router_bias[i]);
    return FP4MOE_OK;
}

fp4moe_status fp4_load_moe_weights(fp4_ckpt *c, int layer, fp4_moe_weights *w, fp4_err *e)
{
    const fp4_arch *a = &c->arch;
    fp4moe_status st;
    memset(w, 0, sizeof *w);
    if (layer < 0 || layer >= c->n_layers || !a->is_moe[layer])
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "layer %d is not a MoE layer of '%s' (%d layers open)",
                        layer, c->dir, c->n_layers);
    w->layer = layer;
    w->n_experts = a->n_experts;
    w->hidden = a->hidden;
    w->inter = a->moe_intermediate;
    size_t ne = (size_t)a->n_experts;
    w->gate = calloc(ne, sizeof *w->gate);
    w->up = calloc(ne, sizeof *w->up);
    w->down = calloc(ne, sizeof *w->down);
    if (!w->gate || !w->up || !w->down) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory for layer %d", layer);
        goto fail;
    }
    if ((st = read_router(c, layer, w, e)) != FP4MOE_OK)
        goto fail;
    for (int j = 0; j < a->n_experts; j++) {
        if ((st = bind_named(c, layer, j, 0, "gate", w->inter, w->hidden, &w->gate[j], e)) ||
            (st = bind_named(c, layer, j, 0, "up", w->inter, w->hidden, &w->up[j], e)) ||
            (st = bind_named(c, layer, j, 0, "down", w->hidden, w->inter, &w->down[j], e)))
            goto fail;
        if (memcmp(&w->gate[j].scheme, &w->gate[0].scheme, sizeof(fp4_scheme)) ||
            memcmp(&w->up[j].scheme, &w->gate[0].scheme, sizeof(fp4_scheme)) ||
            memcmp(&w->down[j].scheme, &w->down[0].scheme, sizeof(fp4_scheme))) {
            st = fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED,
                          "layer %d: expert %d's quantization schemes (gate %s/%s, up %s/%s, down %s/%s) differ from expert 0's (FC1 %s/%s, FC2 %s/%s); mixed schemes within one layer are not supported",
                          layer, j, fp4_wscheme_name(w->gate[j].scheme.w), fp4_ascheme_name(w->gate[j].scheme.a),
                          fp4_wscheme_name(w->up[j].scheme.w), fp4_ascheme_name(w->up[j].scheme.a),
                          fp4_wscheme_name(w->down[j].scheme.w), fp4_ascheme_name(w->down[j].scheme.a),
                          fp4_wscheme_name(w->gate[0].scheme.w), fp4_ascheme_name(w->gate[0].scheme.a),
                          fp4_wscheme_name(w->down[0].scheme.w), fp4_ascheme_name(w->down[0].scheme.a));
            goto fail;
        }
    }
    if (a->shared_intermediate > 0) {
        w->has_shared = 1;
        w->shared_inter = a->shared_intermediate;
        if ((st = bind_named(c, layer, -1, 0, "gate", w->shared_inter, w->hidden, &w->sh_gate, e)) ||
            (st = bind_named(c, layer, -1, 0, "up", w->shared_inter, w->hidden, &w->sh_up, e)) ||
            (st = bind_named(c, layer, -1, 0, "down", w->hidden, w->shared_inter, &w->sh_down, e)))
            goto fail;
    }
    return FP4MOE_OK;
fail:
    fp4_moe_weights_free(w);
    return st;
}

fp4moe_status fp4_load_dense_weights(fp4_ckpt *c, int layer, fp4_dense_weights *w, fp4_err *e)
{
    const fp4_arch *a = &c->arch;
    fp4moe_status st;
    memset(w, 0, sizeof *w);
    if (layer < 0 || layer >= c->n_layers || a->is_moe[layer])
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "layer %d is not a dense layer of '%s' (%d layers open)",
                        layer, c->dir, c->n_layers);
    w->layer = layer;
    w->hidden = a->hidden;
    w->inter = a->dense_intermediate;
    if ((st = bind_named(c, layer, 0, 1, "gate", w->inter, w->hidden, &w->gate, e)) ||
        (st = bind_named(c, layer, 0, 1, "up", w->inter, w->hidden, &w->up, e)) ||
        (st = bind_named(c, layer, 0, 1, "down", w->hidden, w->inter, &w->down, e)))
        return st;
    return FP4MOE_OK;
}

fp4moe_status fp4_layer_expert_schemes(fp4_ckpt *c, int layer, fp4_scheme *fc1, fp4_scheme *fc2,
                                       fp4_err *e)
{
    char module[512];
    const fp4_arch *a = &c->arch;
    if (layer < 0 || layer >= c->n_layers || !a->is_moe[layer])
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "layer %d is not a MoE layer", layer);
    fp4_name_expert_module(a, module, sizeof module, layer, 0, "gate");
    *fc1 = fp4_quant_scheme_for(c->quant, module);
    fp4_name_expert_module(a, module, sizeof module, layer, 0, "down");
    *fc2 = fp4_quant_scheme_for(c->quant, module);
    return FP4MOE_OK;
}
