/*
 * test_moe_ref.c - the CPU reference MoE/MLP forward (src/ref/moe_ref.c) and the exact
 * dequantization of src/moe_weights.c against an independent naive float64 implementation
 * written here: its own bit-level decoding of e2m1/e4m3/ue8m0/bf16, its own NVFP4 activation
 * quantizer (DESIGN.md section 2: scale = e4m3(amax/6/global), q = e2m1_rne(x/(scale*global))),
 * its own router (sorting by score, ties to the lower id) and activations.
 * Metric (DESIGN.md section 6): ||out - ref|| / ||ref|| over the whole output; fp32 mode
 * < 1e-5; fp64 mode < 1e-12 against the reference rounded to fp32 (the output is fp32, so
 * this demands that every element is the fp32 of the double-precision result).
 * Layers are small random ones built in memory (H=256, E=8, I=128 unless said otherwise).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/moe_ref.h"

#include "check.h"



/* ---- random numbers ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rnd_unit(void) { return (double)(rnd_u64() >> 11) / 9007199254740992.0; }

static double rnd_normal(void)
{
    double u1 = rnd_unit(), u2 = rnd_unit();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- the test's own codecs (bit arithmetic, not the library's) ----------------------------- */

static double t_e2m1(unsigned c)
{
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

static double t_e4m3(unsigned c) /* float8_e4m3fn: bias 7, no inf; 0x7f/0xff NaN */
{
    unsigned s = c >> 7, ex = (c >> 3) & 15, man = c & 7;
    double v;
    if (ex == 15 && man == 7)
        return NAN;
    v = ex == 0 ? ldexp(man / 8.0, -6) : ldexp(1.0 + man / 8.0, (int)ex - 7);
    return s ? -v : v;
}

static double t_ue8m0(unsigned c) { return ldexp(1.0, (int)c - 127); }

static double t_bf16(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Nearest code by scan; a tie goes to the even code (= round half to even). */
static unsigned t_e4m3_enc(double v) /* v >= 0; saturates at 448 */
{
    if (v >= 448.0)
        return 0x7e;
    unsigned best = 0;
    for (unsigned c = 1; c <= 0x7e; c++) {
        double d = fabs(t_e4m3(c) - v), db = fabs(t_e4m3(best) - v);
        if (d < db || (d == db && !(c & 1)))
            best = c;
    }
    return best;
}

static unsigned t_e2m1_enc(double v) /* saturates at +-6 */
{
    unsigned best = 0;
    double a = fabs(v);
    for (unsigned c = 1; c < 8; c++) {
        double d = fabs(t_e2m1(c) - a), db = fabs(t_e2m1(best) - a);
        if (d < db || (d == db && !(c & 1)))
            best = c;
    }
    return (v < 0 ? 8u : 0u) | best;
}

/* NVFP4 round trip of one row with global decode scale gs, in fp32 arithmetic as the format
 * is specified; returns the exact values e2m1 * e4m3 * gs in double. */
static void t_nvfp4_roundtrip(const float *x, int k, float gs, double *out)
{
    for (int b = 0; b < k / 16; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 16; i++)
            amax = fmaxf(amax, fabsf(x[b * 16 + i]));
        double s = t_e4m3(t_e4m3_enc(amax / 6.0f / gs));
        float scale = (float)s * gs;
        for (int i = 0; i < 16; i++)
            out[b * 16 + i] = scale == 0.0f ? 0.0 : t_e2m1(t_e2m1_enc(x[b * 16 + i] / scale)) *
                                                     s * (double)gs;
    }
}

/* ---- layers built in memory -------------------------------------------------------------- */

static void make_linear(fp4_linear *l, fp4_wscheme ws, int n, int k)
{
    memset(l, 0, sizeof *l);
    l->scheme.w = ws;
    l->n = n;
    l->k = k;
    if (ws == FP4_W_NVFP4) {
        uint8_t *w = malloc((size_t)n * k / 2), *s = malloc((size_t)n * k / 16);
        for (size_t i = 0; i < (size_t)n * k / 2; i++)
            w[i] = (uint8_t)rnd_u64();
        for (size_t i = 0; i < (size_t)n * k / 16; i++)
            s[i] = (uint8_t)(0x30 + rnd_u64() % 17);
        l->w = w;
        l->scale = s;
        l->global_scale = (float)(1e-2 * (0.5 + rnd_unit()));
    } else if (ws == FP4_W_MXFP8) {
        uint8_t *w = malloc((size_t)n * k), *s = malloc((size_t)n * k / 32);
        for (size_t i = 0; i < (size_t)n * k; i++) {
            uint8_t c = (uint8_t)(rnd_u64() % 0x60); /* |v| < 2, no NaN */
            w[i] = (uint8_t)(c | (rnd_u64() & 0x80));
        }
        for (size_t i = 0; i < (size_t)n * k / 32; i++)
            s[i] = (uint8_t)(120 + rnd_u64() % 3); /* 2^-7 .. 2^-5 */
        l->w = w;
        l->scale = s;
    } else {
        uint8_t *w = malloc((size_t)n * k * 2);
        for (size_t i = 0; i < (size_t)n * k; i++) {
            float f = (float)(rnd_normal() * 0.05);
            uint32_t bits;
            memcpy(&bits, &f, 4);
            w[2 * i] = (uint8_t)(bits >> 16);
            w[2 * i + 1] = (uint8_t)(bits >> 24);
        }
        l->w = w;
    }
}

static void free_linear(fp4_linear *l)
{
    free((void *)l->w);
    free((void *)l->scale);
}

/* Exact weights in double. */
static double *ref_dequant(const fp4_linear *l)
{
    size_t n = (size_t)l->n, k = (size_t)l->k;
    double *o = malloc(n * k * sizeof *o);
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < k; j++) {
            double v;
            if (l->scheme.w == FP4_W_NVFP4) {
                uint8_t b = l->w[r * k / 2 + j / 2];
                v = t_e2m1((j & 1) ? b >> 4 : b & 15) * t_e4m3(l->scale[r * k / 16 + j / 16]) *
                    l->global_scale;
            } else if (l->scheme.w == FP4_W_MXFP8) {
                v = t_e4m3(l->w[r * k + j]) * t_ue8m0(l->scale[r * k / 32 + j / 32]);
            } else {
                v = t_bf16((uint16_t)(l->w[2 * (r * k + j)] | (l->w[2 * (r * k + j) + 1] << 8)));
            }
            o[r * k + j] = v;
        }
    return o;
}

typedef struct layer_spec {
    int H, E, I, Is, topk;    /* Is 0: no shared expert */
    fp4_act act;
    float limit;
    fp4_scoring scoring;
    int has_bias, norm_topk;
    float scaling;
    fp4_wscheme shared_w;
} layer_spec;

static void make_arch(fp4_arch *a, const layer_spec *s)
{
    memset(a, 0, sizeof *a);
    a->hidden = s->H;
    a->n_experts = s->E;
    a->moe_intermediate = s->I;
    a->shared_intermediate = s->Is;
    a->topk = s->topk;
    a->act = s->act;
    a->swiglu_limit = s->limit;
    a->swiglu_alpha = 1.702f;
    a->scoring = s->scoring;
    a->has_score_bias = s->has_bias;
    a->norm_topk = s->norm_topk;
    a->routed_scaling = s->scaling;
}

static void make_moe(fp4_moe_weights *w, const layer_spec *s)
{
    memset(w, 0, sizeof *w);
    w->layer = 7;
    w->n_experts = s->E;
    w->hidden = s->H;
    w->inter = s->I;
    w->router = malloc((size_t)s->E * s->H * sizeof(float));
    for (size_t i = 0; i < (size_t)s->E * s->H; i++)
        w->router[i] = (float)(rnd_normal() * 0.1);
    if (s->has_bias) {
        w->router_bias = malloc((size_t)s->E * sizeof(float));
        for (int e = 0; e < s->E; e++)
            w->router_bias[e] = (float)(rnd_normal() * 0.05);
    }
    w->gate = malloc((size_t)s->E * sizeof *w->gate);
    w->up = malloc((size_t)s->E * sizeof *w->up);
    w->down = malloc((size_t)s->E * sizeof *w->down);
    for (int e = 0; e < s->E; e++) {
        make_linear(&w->gate[e], FP4_W_NVFP4, s->I, s->H);
        make_linear(&w->up[e], FP4_W_NVFP4, s->I, s->H);
        make_linear(&w->down[e], FP4_W_NVFP4, s->H, s->I);
    }
    if (s->Is) {
        w->has_shared = 1;
        w->shared_inter = s->Is;
        make_linear(&w->sh_gate, s->shared_w, s->Is, s->H);
        make_linear(&w->sh_up, s->shared_w, s->Is, s->H);
        make_linear(&w->sh_down, s->shared_w, s->H, s->Is);
    }
}

static void free_moe(fp4_moe_weights *w)
{
    for (int e = 0; e < w->n_experts && w->gate; e++) {
        free_linear(&w->gate[e]);
        free_linear(&w->up[e]);
        free_linear(&w->down[e]);
    }
    if (w->has_shared) {
        free_linear(&w->sh_gate);
        free_linear(&w->sh_up);
        free_linear(&w->sh_down);
    }
    fp4_moe_weights_free(w); /* the library frees router, bias and the three arrays */
    CHECK(!w->router && !w->router_bias && !w->gate && !w->up && !w->down,
          "fp4_moe_weights_free left a pointer set");
}

/* Set every linear of the layer to activation scheme as with static input scales
 * (inputs ~ N(0,1) for FC1, small activations for FC2). */
static void set_ascheme(fp4_linear *l, fp4_ascheme as, int is_down)
{
    l->scheme.a = as;
    l->input_scale = as == FP4_A_NVFP4_STATIC
                         ? (float)((is_down ? 0.05 : 2.5) * (0.8 + 0.4 * rnd_unit()) / 2688.0)
                         : 0.0f;
}

static void set_moe_ascheme(fp4_moe_weights *w, fp4_ascheme fc1, fp4_ascheme fc2)
{
    for (int e = 0; e < w->n_experts; e++) {
        set_ascheme(&w->gate[e], fc1, 0);
        set_ascheme(&w->up[e], fc1, 0);
        set_ascheme(&w->down[e], fc2, 1);
    }
    if (w->has_shared) {
        set_ascheme(&w->sh_gate, fc1, 0);
        set_ascheme(&w->sh_up, fc1, 0);
        set_ascheme(&w->sh_down, fc2, 1);
    }
}

/* ---- the naive float64 reference ---------------------------------------------------------- */

static double ref_act(const layer_spec *s, double g, double u)
{
    if (s->act == FP4_ACT_SILU)
        return g * (1.0 / (1.0 + exp(-g))) * u;
    if (s->limit > 0) {
        g = fmin(g, s->limit);
        u = fmax(-(double)s->limit, fmin(u, (double)s->limit));
    }
    return (u + 1.0) * g * (1.0 / (1.0 + exp(-1.702f * g)));
}

/* What linear l sees of input row in[k] (emulated A4 when emulate). */
static void ref_input(const fp4_linear *l, int emulate, const double *in, int k, double *out)
{
    if (!emulate || l->scheme.a == FP4_A_NONE) {
        memcpy(out, in, (size_t)k * sizeof *out);
        return;
    }
    float *xf = malloc((size_t)k * sizeof *xf);
    float amax = 0.0f;
    for (int j = 0; j < k; j++) {
        xf[j] = (float)in[j];
        amax = fmaxf(amax, fabsf(xf[j]));
    }
    float gs = l->scheme.a == FP4_A_NVFP4_STATIC ? l->input_scale : amax / (448.0f * 6.0f);
    if (amax == 0.0f)
        memset(out, 0, (size_t)k * sizeof *out);
    else
        t_nvfp4_roundtrip(xf, k, gs, out);
    free(xf);
}

static void ref_matvec(const double *W, int n, int k, const double *x, double *y)
{
    for (int r = 0; r < n; r++) {
        double acc = 0.0;
        for (int j = 0; j < k; j++)
            acc += W[(size_t)r * k + j] * x[j];
        y[r] = acc;
    }
}

/* y[H] += wt * down(act(gate x, up x)) */
static void ref_ffn(const layer_spec *s, const fp4_linear *g, const fp4_linear *u,
                    const fp4_linear *d, int emulate, const float *x, double wt, double *y)
{
    int H = g->k, I = g->n;
    double *Wg = ref_dequant(g), *Wu = ref_dequant(u), *Wd = ref_dequant(d);
    double *xd = malloc((size_t)H * sizeof *xd), *xi = malloc((size_t)H * sizeof *xi);
    double *gv = malloc((size_t)I * sizeof *gv), *uv = malloc((size_t)I * sizeof *uv);
    double *ai = malloc((size_t)I * sizeof *ai), *yo = malloc((size_t)H * sizeof *yo);
    for (int h = 0; h < H; h++)
        xd[h] = x[h];
    ref_input(g, emulate, xd, H, xi);
    ref_matvec(Wg, I, H, xi, gv);
    ref_input(u, emulate, xd, H, xi);
    ref_matvec(Wu, I, H, xi, uv);
    for (int i = 0; i < I; i++)
        gv[i] = ref_act(s, gv[i], uv[i]);
    ref_input(d, emulate, gv, I, ai);
    ref_matvec(Wd, H, I, ai, yo);
    for (int h = 0; h < H; h++)
        y[h] += wt * yo[h];
    free(Wg), free(Wu), free(Wd), free(xd), free(xi), free(gv), free(uv), free(ai), free(yo);
}

static const double *g_sel; /* for qsort: selection scores of the token being routed */

static int cmp_sel(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    if (g_sel[a] != g_sel[b])
        return g_sel[a] > g_sel[b] ? -1 : 1;
    return a - b;
}

static void ref_route(const layer_spec *s, const fp4_moe_weights *w, const float *x, int m,
                      int32_t *ids, double *wts)
{
    int E = s->E, H = s->H, k = s->topk;
    double *p = malloc((size_t)E * sizeof *p), *sel = malloc((size_t)E * sizeof *sel);
    int *order = malloc((size_t)E * sizeof *order);
    for (int t = 0; t < m; t++) {
        double z = 0.0, mx = -INFINITY;
        for (int e = 0; e < E; e++) {
            double l = 0.0;
            for (int h = 0; h < H; h++)
                l += (double)w->router[(size_t)e * H + h] * x[(size_t)t * H + h];
            p[e] = l;
            mx = fmax(mx, l);
        }
        for (int e = 0; e < E; e++) {
            p[e] = s->scoring == FP4_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-p[e])) : exp(p[e] - mx);
            z += p[e];
        }
        for (int e = 0; e < E; e++) {
            if (s->scoring == FP4_SCORE_SOFTMAX)
                p[e] /= z;
            sel[e] = p[e] + (s->has_bias ? w->router_bias[e] : 0.0);
            order[e] = e;
        }
        g_sel = sel;
        qsort(order, (size_t)E, sizeof *order, cmp_sel);
        double sum = 0.0;
        for (int j = 0; j < k; j++)
            sum += p[order[j]];
        for (int j = 0; j < k; j++) {
            ids[(size_t)t * k + j] = order[j];
            wts[(size_t)t * k + j] = p[order[j]] / (s->norm_topk ? sum : 1.0) * s->scaling;
        }
    }
    free(p), free(sel), free(order);
}

static void ref_moe(const layer_spec *s, const fp4_moe_weights *w, const float *x, int m,
                    int emulate, double *y, int32_t *ids, double *wts)
{
    ref_route(s, w, x, m, ids, wts);
    memset(y, 0, (size_t)m * s->H * sizeof *y);
    for (int t = 0; t < m; t++) {
        for (int j = 0; j < s->topk; j++) {
            int e = ids[(size_t)t * s->topk + j];
            ref_ffn(s, &w->gate[e], &w->up[e], &w->down[e], emulate, x + (size_t)t * s->H,
                    wts[(size_t)t * s->topk + j], y + (size_t)t * s->H);
        }
        if (w->has_shared)
            ref_ffn(s, &w->sh_gate, &w->sh_up, &w->sh_down, emulate, x + (size_t)t * s->H, 1.0,
                    y + (size_t)t * s->H);
    }
}

/* ---- comparisons ------------------------------------------------------------------------- */

/* ||out - ref|| / ||ref||; with fp64, against ref rounded to fp32. NaN anywhere -> inf. */
static double rel_err(const float *out, const double *ref, size_t n, int fp64)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i]))
            return INFINITY;
        double r = fp64 ? (double)(float)ref[i] : ref[i];
        num += (out[i] - r) * (out[i] - r);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_diff_f(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static float *make_x(int m, int H)
{
    float *x = malloc((size_t)m * H * sizeof *x);
    for (size_t i = 0; i < (size_t)m * H; i++)
        x[i] = (float)rnd_normal();
    return x;
}

static void poison(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

/* Run the library in fp32 and fp64 mode against the reference; check routing too. Returns
 * the fp32 output (caller frees) when keep is set. */
static float *check_moe(const char *name, const layer_spec *s, fp4_moe_weights *w,
                        const float *x, int m, int emulate, int keep)
{
    fp4_arch a;
    make_arch(&a, s);
    size_t mh = (size_t)m * s->H, mk = (size_t)m * s->topk;
    double *yr = malloc(mh * sizeof *yr), *wr = malloc(mk * sizeof *wr);
    int32_t *ir = malloc(mk * sizeof *ir), *ids = malloc(mk * sizeof *ids);
    float *y = malloc(mh * sizeof *y), *wts = malloc(mk * sizeof *wts), *keep_y = NULL;
    ref_moe(s, w, x, m, emulate, yr, ir, wr);
    for (int fp64 = 0; fp64 <= 1; fp64++) {
        fp4_ref_opts o = {emulate, fp64};
        fp4_err e = {0};
        poison(y, mh);
        poison(wts, mk);
        memset(ids, 0xff, mk * sizeof *ids);
        fp4moe_status st = fp4_ref_moe_forward(&a, w, x, m, &o, y, ids, wts, &e);
        CHECK(st == FP4MOE_OK, "%s fp%d emulate=%d: status %d (%s)", name, fp64 ? 64 : 32,
              emulate, st, e.msg);
        int id_bad = 0, w_bad = 0;
        for (size_t i = 0; i < mk; i++) {
            id_bad += ids[i] != ir[i];
            w_bad += !(fabs(wts[i] - wr[i]) <= 1e-6 * fabs(wr[i]) + 1e-7);
        }
        CHECK(!id_bad, "%s fp%d: %d of %zu routed ids differ from the reference", name,
              fp64 ? 64 : 32, id_bad, mk);
        CHECK(!w_bad, "%s fp%d: %d of %zu routing weights differ from the reference", name,
              fp64 ? 64 : 32, w_bad, mk);
        double err = rel_err(y, yr, mh, fp64), tol = fp64 ? 1e-12 : 1e-5;
        CHECK(err < tol, "%s fp%d emulate=%d M=%d H=%d E=%d I=%d Is=%d topk=%d: rel err %.3g "
              ">= %.0e", name, fp64 ? 64 : 32, emulate, m, s->H, s->E, s->I, s->Is, s->topk,
              err, tol);
        if (!fp64 && keep) {
            keep_y = malloc(mh * sizeof *keep_y);
            memcpy(keep_y, y, mh * sizeof *keep_y);
        }
    }
    /* the public router alone */
    fp4_ref_route(&a, w->router, w->router_bias, x, m, ids, wts);
    int bad = 0;
    for (size_t i = 0; i < mk; i++)
        bad += ids[i] != ir[i] || !(fabs(wts[i] - wr[i]) <= 1e-6 * fabs(wr[i]) + 1e-7);
    CHECK(!bad, "%s: fp4_ref_route differs from the reference in %d of %zu slots", name, bad,
          mk);
    free(yr), free(wr), free(ir), free(ids), free(y), free(wts);
    return keep_y;
}

static const layer_spec BASE = {256, 8, 128, 128, 2, FP4_ACT_SWIGLUOAI, 7.0f,
                                FP4_SCORE_SIGMOID, 1, 1, 2.0f, FP4_W_MXFP8};

/* ---- cases ------------------------------------------------------------------------------ */

static void test_dequant_rows(void)
{
    const fp4_wscheme ws[3] = {FP4_W_NVFP4, FP4_W_MXFP8, FP4_W_BF16};
    for (int i = 0; i < 3; i++) {
        fp4_linear l;
        make_linear(&l, ws[i], 24, 64);
        double *ref = ref_dequant(&l);
        float out[5 * 64];
        fp4_linear_dequant_rows(&l, 3, 5, out);
        int bad = 0;
        for (int j = 0; j < 5 * 64; j++)
            bad += memcmp(&out[j], &(float){(float)ref[3 * 64 + j]}, 4) != 0;
        CHECK(!bad, "dequant_rows scheme %d rows [3,8) of [24,64]: %d values not exact", ws[i],
              bad);
        free(ref);
        free_linear(&l);
    }
}

static void test_act(void)
{
    layer_spec s = BASE;
    fp4_arch a;
    struct { fp4_act act; float lim, g, u; } c[] = {
        {FP4_ACT_SILU, 0, 1.0f, 2.0f},       {FP4_ACT_SILU, 7, -3.0f, 0.5f},
        {FP4_ACT_SWIGLUOAI, 7, 10.f, -10.f}, {FP4_ACT_SWIGLUOAI, 7, -8.f, 3.f},
        {FP4_ACT_SWIGLUOAI, 0, 10.f, -10.f}, {FP4_ACT_SWIGLUOAI, 0.5f, 0.75f, 0.25f}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        s.act = c[i].act;
        s.limit = c[i].lim;
        make_arch(&a, &s);
        double r = ref_act(&s, c[i].g, c[i].u);
        float v = fp4_ref_act(&a, c[i].g, c[i].u);
        CHECK(fabs(v - r) <= 1e-6 * fabs(r) + 1e-7, "act %d limit %g g=%g u=%g: %.9g, expected "
              "%.9g", c[i].act, c[i].lim, c[i].g, c[i].u, v, r);
    }
    /* spot values: swigluoai clamps g to 7 and u to -7 */
    s.act = FP4_ACT_SWIGLUOAI;
    s.limit = 7.0f;
    make_arch(&a, &s);
    double want = (-7.0 + 1.0) * 7.0 / (1.0 + exp(-1.702f * 7.0));
    CHECK(fabs(fp4_ref_act(&a, 10.f, -10.f) - want) < 1e-5, "swigluoai(10,-10) limit 7: %.9g, "
          "expected %.9g", fp4_ref_act(&a, 10.f, -10.f), want);
}

static void run_case(const char *name, layer_spec s, int m, int force_expert)
{
    fp4_moe_weights w;
    make_moe(&w, &s);
    if (force_expert >= 0)
        w.router_bias[force_expert] = 50.0f;
    float *x = make_x(m, s.H);
    check_moe(name, &s, &w, x, m, 0, 0);
    if (force_expert >= 0) {
        fp4_arch a;
        make_arch(&a, &s);
        int32_t *ids = malloc((size_t)m * s.topk * sizeof *ids);
        float *wts = malloc((size_t)m * s.topk * sizeof *wts);
        fp4_ref_route(&a, w.router, w.router_bias, x, m, ids, wts);
        int off = 0;
        for (int t = 0; t < m; t++)
            off += ids[(size_t)t * s.topk] != force_expert;
        CHECK(!off, "%s: %d tokens did not pick the biased expert %d first", name, off,
              force_expert);
        free(ids), free(wts);
    }
    free(x);
    free_moe(&w);
}

/* A row of zeros under softmax without bias: every score is 1/E, so the chosen experts are
 * 0..k-1 in order (ties to the lower id), each weighted 1/E. */
static void test_ties(layer_spec s)
{
    fp4_moe_weights w;
    make_moe(&w, &s);
    fp4_arch a;
    make_arch(&a, &s);
    float *x = calloc((size_t)s.H, sizeof *x), wts[16];
    int32_t ids[16];
    fp4_ref_route(&a, w.router, w.router_bias, x, 1, ids, wts);
    int bad = 0;
    for (int j = 0; j < s.topk; j++)
        bad += ids[j] != j || fabsf(wts[j] - 1.0f / s.E) > 1e-7f;
    CHECK(!bad, "tied scores: ids %d %d weights %g %g, expected 0 1 and %g", ids[0], ids[1],
          wts[0], wts[1], 1.0 / s.E);
    free(x);
    free_moe(&w);
}

static void test_routing_and_forward(void)
{
    layer_spec s = BASE;
    run_case("sigmoid+bias swigluoai mxfp8-shared", s, 13, -1);
    run_case("sigmoid+bias M=64 (two threads)", s, 64, -1);

    s = BASE;
    s.scoring = FP4_SCORE_SOFTMAX;
    s.has_bias = 0;
    s.norm_topk = 0;
    s.scaling = 1.0f;
    s.act = FP4_ACT_SILU;
    s.limit = 0.0f;
    s.shared_w = FP4_W_BF16;
    run_case("softmax no-renorm silu bf16-shared", s, 7, -1);
    test_ties(s);

    s = BASE;
    s.topk = 3;
    run_case("M=1 (experts with zero tokens)", s, 1, -1);

    s = BASE;
    s.topk = s.E;
    run_case("topk=E", s, 5, -1);

    s = BASE;
    s.topk = 1;
    s.Is = 0;
    run_case("all tokens on one expert (bias), no shared", s, 9, 5);
    s.topk = 2;
    run_case("all tokens on one expert (bias), topk 2", s, 33, 2);

    s = BASE;
    s.limit = 0.05f; /* |g|, |u| are ~0.3 here: the clamp is active on most elements */
    run_case("swigluoai limit 0.05", s, 6, -1);
    s.limit = 0.0f;
    run_case("swigluoai no limit", s, 6, -1);

    s = BASE;
    s.I = 64;
    s.Is = 96;
    s.E = 16;
    s.topk = 4;
    s.H = 128;
    run_case("H=128 E=16 I=64 Is=96 topk 4", s, 11, -1);
}

static void test_dense(void)
{
    layer_spec s = BASE;
    const struct { fp4_wscheme w; fp4_act act; int I, m; fp4_ascheme as; } c[] = {
        {FP4_W_NVFP4, FP4_ACT_SILU, 128, 5, FP4_A_NONE},
        {FP4_W_MXFP8, FP4_ACT_SWIGLUOAI, 256, 64, FP4_A_NONE}, /* two threads, split rows */
        {FP4_W_BF16, FP4_ACT_SILU, 64, 1, FP4_A_NONE},
        {FP4_W_NVFP4, FP4_ACT_SWIGLUOAI, 128, 1, FP4_A_NVFP4_STATIC}, /* one row */
        {FP4_W_NVFP4, FP4_ACT_SWIGLUOAI, 128, 1, FP4_A_NVFP4_PER_TOKEN},
        {FP4_W_NVFP4, FP4_ACT_SILU, 256, 64, FP4_A_NVFP4_PER_TOKEN}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        fp4_dense_weights d = {.layer = 1, .hidden = s.H, .inter = c[i].I};
        make_linear(&d.gate, c[i].w, c[i].I, s.H);
        make_linear(&d.up, c[i].w, c[i].I, s.H);
        make_linear(&d.down, c[i].w, s.H, c[i].I);
        set_ascheme(&d.gate, c[i].as, 0);
        set_ascheme(&d.up, c[i].as, 0);
        set_ascheme(&d.down, c[i].as, 1);
        s.act = c[i].act;
        fp4_arch a;
        make_arch(&a, &s);
        int m = c[i].m, emulate = c[i].as != FP4_A_NONE;
        float *x = make_x(m, s.H), *y = malloc((size_t)m * s.H * sizeof *y);
        double *yr = calloc((size_t)m * s.H, sizeof *yr);
        for (int t = 0; t < m; t++)
            ref_ffn(&s, &d.gate, &d.up, &d.down, emulate, x + (size_t)t * s.H, 1.0,
                    yr + (size_t)t * s.H);
        for (int fp64 = 0; fp64 <= 1; fp64++) {
            fp4_ref_opts o = {emulate, fp64};
            fp4_err e = {0};
            poison(y, (size_t)m * s.H);
            fp4moe_status st = fp4_ref_dense_forward(&a, &d, x, m, &o, y, &e);
            double err = rel_err(y, yr, (size_t)m * s.H, fp64), tol = fp64 ? 1e-12 : 1e-5;
            CHECK(st == FP4MOE_OK && err < tol, "dense w=%d act=%d I=%d M=%d a=%d fp%d: status "
                  "%d (%s), rel err %.3g >= %.0e", c[i].w, c[i].act, c[i].I, m, c[i].as,
                  fp64 ? 64 : 32, st, e.msg, err, tol);
        }
        free(x), free(y), free(yr);
        free_linear(&d.gate), free_linear(&d.up), free_linear(&d.down);
    }
}

static void test_emulation(void)
{
    layer_spec s = BASE;
    int m = 12;
    fp4_moe_weights w;
    make_moe(&w, &s);
    float *x = make_x(m, s.H);
    size_t mh = (size_t)m * s.H;
    for (int h = 0; h < s.H; h++)
        x[3 * s.H + h] = 0.0f; /* a row of zeros */

    /* scheme none: emulation is the exact reference, bit for bit */
    fp4_arch a;
    make_arch(&a, &s);
    float *y0 = malloc(mh * sizeof *y0), *y1 = malloc(mh * sizeof *y1);
    fp4_err e = {0};
    for (int fp64 = 0; fp64 <= 1; fp64++) {
        fp4_ref_opts ox = {0, fp64}, oe = {1, fp64};
        poison(y0, mh);
        poison(y1, mh);
        fp4moe_status s0 = fp4_ref_moe_forward(&a, &w, x, m, &ox, y0, NULL, NULL, &e);
        fp4moe_status s1 = fp4_ref_moe_forward(&a, &w, x, m, &oe, y1, NULL, NULL, &e);
        CHECK(s0 == FP4MOE_OK && s1 == FP4MOE_OK && !memcmp(y0, y1, mh * sizeof *y0),
              "emulation with scheme none fp%d: not bit-identical to the exact reference "
              "(status %d %d)", fp64 ? 64 : 32, s0, s1);
    }
    float *exact = check_moe("exact (zero row)", &s, &w, x, m, 0, 1);

    set_moe_ascheme(&w, FP4_A_NVFP4_STATIC, FP4_A_NVFP4_STATIC);
    float *ystat = check_moe("emulate static", &s, &w, x, m, 1, 1);
    set_moe_ascheme(&w, FP4_A_NVFP4_PER_TOKEN, FP4_A_NVFP4_PER_TOKEN);
    float *ytok = check_moe("emulate per-token", &s, &w, x, m, 1, 1);
    set_moe_ascheme(&w, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE);
    float *ymix = check_moe("emulate per-token FC1, none FC2", &s, &w, x, m, 1, 1);
    set_moe_ascheme(&w, FP4_A_NVFP4_STATIC, FP4_A_NVFP4_PER_TOKEN);
    w.up[2].input_scale *= 1.5f; /* gate and up of one expert with different scales */
    free(check_moe("emulate static FC1, per-token FC2", &s, &w, x, m, 1, 0));

    if (exact && ystat && ytok && ymix) {
        double d_st = rel_diff_f(ystat, exact, mh), d_tok = rel_diff_f(ytok, exact, mh);
        double d_st_tok = rel_diff_f(ytok, ystat, mh), d_mix = rel_diff_f(ymix, ytok, mh);
        CHECK(d_st > 1e-3 && d_tok > 1e-3, "emulation changed too little: static %.3g, "
              "per-token %.3g relative to exact", d_st, d_tok);
        CHECK(d_st_tok > 1e-3, "per-token and static emulation agree (%.3g): not both applied",
              d_st_tok);
        CHECK(d_mix > 1e-4, "FC2 emulation had no effect (%.3g)", d_mix);
        int nz = 0;
        for (int h = 0; h < s.H; h++)
            nz += ystat[3 * s.H + h] != 0.0f || ytok[3 * s.H + h] != 0.0f;
        CHECK(!nz, "a row of zeros gave %d non-zero outputs under emulation", nz);
    }
    free(exact), free(ystat), free(ytok), free(ymix);

    /* bad static input_scale: fails naming layer, expert and linear; ignored without A4 */
    const float bad[3] = {0.0f, -1.0f, NAN};
    set_moe_ascheme(&w, FP4_A_NVFP4_STATIC, FP4_A_NVFP4_STATIC);
    for (int i = 0; i < 3; i++) {
        float keep = w.up[3].input_scale;
        w.up[3].input_scale = bad[i];
        fp4_ref_opts oe = {1, 0}, ox = {0, 0};
        fp4_err_clear(&e);
        fp4moe_status st = fp4_ref_moe_forward(&a, &w, x, m, &oe, y0, NULL, NULL, &e);
        CHECK(st == FP4MOE_ERR_FORMAT && strstr(e.msg, "layer 7") &&
              strstr(e.msg, "expert 3") && strstr(e.msg, "up") && strstr(e.msg, "input_scale"),
              "input_scale %g: status %d, message '%s'", bad[i], st, e.msg);
        st = fp4_ref_moe_forward(&a, &w, x, m, &ox, y0, NULL, NULL, &e);
        CHECK(st == FP4MOE_OK, "input_scale %g without emulation: status %d (%s)", bad[i], st,
              e.msg);
        w.up[3].input_scale = keep;
    }
    /* a shape mismatch is a format error naming the linear */
    w.down[1].k = 64;
    fp4_ref_opts ox = {0, 0};
    fp4moe_status st = fp4_ref_moe_forward(&a, &w, x, m, &ox, y0, NULL, NULL, &e);
    CHECK(st == FP4MOE_ERR_FORMAT && strstr(e.msg, "expert 1 down"), "bad shape: status %d "
          "'%s'", st, e.msg);
    w.down[1].k = s.I;
    free(x), free(y0), free(y1);
    free_moe(&w);
}

int main(void)
{
    test_dequant_rows();
    test_act();
    test_routing_and_forward();
    test_dense();
    test_emulation();
    return check_done();
}
