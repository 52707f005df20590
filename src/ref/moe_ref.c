/*
 * moe_ref.c - the CPU reference forward of one MLP/MoE block (DESIGN.md section 4) on exactly
 * dequantized weights (section 2), and its A4 emulation mode (section 5, "emulation").
 *
 * Router: logits accumulated in double (they decide routing), sigmoid or softmax scores,
 * selection by score (+ e_score_correction_bias), weights = unbiased scores of the chosen,
 * renormalized if norm_topk, times routed_scaling; ties go to the lower expert id.
 * Experts: tokens are grouped by expert; each used expert's matrices are dequantized once,
 * NB rows at a time, and multiplied with fp32 accumulation (double with opts->fp64). The
 * nvfp4 global scale is applied to the accumulator, so the products are of exact values.
 * Emulation: before each linear whose activation scheme is nvfp4-static (global decode scale
 * = input_scale) or nvfp4-per-token (t_m = amax|x_m| / (448*6)), its input row is quantized
 * to NVFP4; the GEMM runs on the exact e2m1*e4m3 values and its output row is multiplied by
 * the global decode scale (the same numbers as the dequantized input, one rounding fewer).
 * The router is never quantized.
 * Limits: work is split over at most 2 threads; per thread a double [M, H] accumulator is
 * held, plus [M, max(H, I)] scratch. Results do not depend on timing, only on the sizes.
 */
#include "moe_ref.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP4_REF_NB 16                 /* weight rows dequantized per block (16 x K fp32) */
#define FP4_REF_ROUTE_STACK_E 1024    /* fp4_ref_route keeps up to this many scores on stack */
#define FP4_REF_PAR_MIN_MACS 8.0e6    /* below this much work one thread is faster */
#define FP4_A4_FP8_MAX 448.0f         /* e4m3 max: per-token t_m = amax / (448 * 6) */
#define FP4_A4_FP4_MAX 6.0f           /* e2m1 max */

/* ---- activation ----------------------------------------------------------------------- */

static double fp4_act_d(const fp4_arch *a, double g, double u)
{
    if (a->act == FP4_ACT_SILU)
        return g / (1.0 + exp(-g)) * u;
    double lim = a->swiglu_limit;
    if (lim > 0.0) {
        g = g < lim ? g : lim;
        u = u < -lim ? -lim : (u > lim ? lim : u);
    }
    return (u + 1.0) * g / (1.0 + exp(-(double)a->swiglu_alpha * g));
}

float fp4_ref_act(const fp4_arch *a, float g, float u)
{
    return (float)fp4_act_d(a, g, u);
}

/* ---- router --------------------------------------------------------------------------- */

/* Route m tokens; wts in double. Scratch: score[E], sel[E], taken[E]. */
static void fp4_route_d(const fp4_arch *a, const float *router, const float *bias,
                        const float *x, int m, int32_t *ids, double *wts, double *score,
                        double *sel, unsigned char *taken)
{
    int E = a->n_experts, H = a->hidden, k = a->topk < E ? a->topk : E;
    for (int t = 0; t < m; t++) {
        const float *xt = x + (size_t)t * H;
        double mx = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) {
            const float *we = router + (size_t)e * H;
            double acc = 0.0;
            for (int h = 0; h < H; h++)
                acc += (double)we[h] * xt[h];
            score[e] = acc;
            mx = acc > mx ? acc : mx;
        }
        for (int e = 0; e < E; e++) {
            if (a->scoring == FP4_SCORE_SOFTMAX) {
                score[e] = exp(score[e] - mx);
                sum += score[e];
            } else {
                score[e] = 1.0 / (1.0 + exp(-score[e]));
            }
        }
        for (int e = 0; e < E; e++) {
            if (a->scoring == FP4_SCORE_SOFTMAX)
                score[e] /= sum;
            sel[e] = score[e] + (a->has_score_bias && bias ? (double)bias[e] : 0.0);
            taken[e] = 0;
        }
        int32_t *it = ids + (size_t)t * k;
        double *wt = wts + (size_t)t * k, wsum = 0.0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || sel[e] > sel[best]))
                    best = e;
            taken[best] = 1;
            it[j] = best;
            wt[j] = score[best];
            wsum += score[best];
        }
        for (int j = 0; j < k; j++) {
            if (a->norm_topk && wsum > 0.0)
                wt[j] /= wsum;
            wt[j] *= a->routed_scaling;
        }
    }
}

void fp4_ref_route(const fp4_arch *a, const float *router, const float *bias, const float *x,
                   int m, int32_t *ids, float *weights)
{
    int E = a->n_experts, k = a->topk < E ? a->topk : E;
    double st_score[FP4_REF_ROUTE_STACK_E], st_sel[FP4_REF_ROUTE_STACK_E], wd[64];
    unsigned char st_taken[FP4_REF_ROUTE_STACK_E];
    double *score = st_score, *sel = st_sel, *w = wd;
    unsigned char *taken = st_taken;
    void *heap = NULL;
    if (E > FP4_REF_ROUTE_STACK_E || k > 64) {
        heap = malloc((size_t)E * (2 * sizeof(double) + 1) + (size_t)k * sizeof(double));
        if (!heap) { /* no status to return: mark every slot as unrouted */
            for (size_t i = 0; i < (size_t)m * k; i++) {
                ids[i] = -1;
                weights[i] = 0.0f;
            }
            return;
        }
        score = heap;
        sel = score + E;
        w = sel + E;
        taken = (unsigned char *)(w + k);
    }
    for (int t = 0; t < m; t++) {
        fp4_route_d(a, router, bias, x + (size_t)t * a->hidden, 1, ids + (size_t)t * k, w,
                    score, sel, taken);
        for (int j = 0; j < k; j++)
            weights[(size_t)t * k + j] = (float)w[j];
    }
    free(heap);
}

/* ---- one expert FFN over a group of tokens ----------------------------------------------- */

/* A group of token rows run through one (gate, up, down) triple. */
typedef struct fp4_ref_item {
    const fp4_linear *lin[3];  /* gate [I, H], up [I, H], down [H, I] */
    int inter;                 /* I */
    int c;                     /* token rows */
    const int32_t *tok;        /* [c] rows of x and y */
    const double *wt;          /* [c] combine weights; NULL: 1 */
    double cost;               /* multiply-adds, for the thread split */
} fp4_ref_item;

/* One thread's items, scratch and output accumulator. Buffers marked "acc" hold float, or
 * double with fp64. */
typedef struct fp4_ref_worker {
    const fp4_arch *arch;
    const fp4_ref_item *items;
    int n_items;
    const float *x;         /* [M, H] */
    int hidden, fp64, emulate;
    float *wblk;            /* [NB, kmax] dequantized weight rows */
    void *xin;              /* acc [cmax, kmax] the rows a linear sees */
    void *g, *u;            /* acc [cmax, imax] gate (then activation) and up outputs */
    void *yb;               /* acc [cmax, H] down outputs */
    float *rs;              /* [cmax + 4] per-row output factor (A4 global decode scale) */
    float *row, *row2;      /* [kmax] */
    uint8_t *qp, *qs;       /* [kmax/2 + 1], [kmax/16 + 1] */
    double *yacc;           /* [M, H] */
} fp4_ref_worker;

static inline double fp4_ld(const void *p, size_t i, int f64)
{
    return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static inline void fp4_st(void *p, size_t i, double v, int f64)
{
    if (f64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

/* Fill dst[c, k] with the rows linear l sees: source rows are x[tok[r]] (xf != NULL) or
 * src[r] (acc). With emulation and an A4 scheme, each row is NVFP4-quantized and dst holds
 * the exact e2m1*e4m3 values, rs[r] the global decode scale; returns 1 then, else 0. */
static int fp4_ref_prep(fp4_ref_worker *w, const fp4_linear *l, int c, int k, const float *xf,
                        const int32_t *tok, const void *src, void *dst)
{
    int f64 = w->fp64, a4 = w->emulate && l->scheme.a != FP4_A_NONE;
    for (int r = 0; r < c; r++) {
        const float *xr = xf ? xf + (size_t)tok[r] * w->hidden : NULL;
        size_t o = (size_t)r * k;
        if (!a4) {
            for (int j = 0; j < k; j++)
                fp4_st(dst, o + j, xr ? (double)xr[j] : fp4_ld(src, o + j, f64), f64);
            continue;
        }
        float amax = 0.0f;
        for (int j = 0; j < k; j++) {
            w->row[j] = xr ? xr[j] : (float)fp4_ld(src, o + j, f64);
            amax = fmaxf(amax, fabsf(w->row[j]));
        }
        float t = l->scheme.a == FP4_A_NVFP4_STATIC ? l->input_scale
                                                     : amax / (FP4_A4_FP8_MAX * FP4_A4_FP4_MAX);
        if (!(t > 0.0f) || isinf(t)) {
            /* a zero row stays zero; a NaN or infinite row poisons its output */
            float v = amax == 0.0f ? 0.0f : NAN;
            for (int j = 0; j < k; j++)
                fp4_st(dst, o + j, v, f64);
            w->rs[r] = 1.0f;
            continue;
        }
        fp4moe_nvfp4_quantize(w->row, (size_t)k, t, w->qp, w->qs);
        fp4moe_nvfp4_dequantize(w->qp, w->qs, 1.0f, (size_t)k, w->row2);
        for (int j = 0; j < k; j++)
            fp4_st(dst, o + j, w->row2[j], f64);
        w->rs[r] = t;
    }
    return a4;
}

/* d[i] = x[i] . wr for 4 rows: 8 (fp32) or 4 (fp64) independent lanes per row so that the
 * compiler vectorizes without reassociating; the tail has its own accumulator. */
static void fp4_dot4_f32(const float *const x[4], const float *wr, int k, double d[4])
{
    float a[4][8] = {{0}}, t[4] = {0};
    int k8 = k - k % 8;
    for (int kk = 0; kk < k8; kk += 8)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++)
                a[i][j] += x[i][kk + j] * wr[kk + j];
    for (int kk = k8; kk < k; kk++)
        for (int i = 0; i < 4; i++)
            t[i] += x[i][kk] * wr[kk];
    for (int i = 0; i < 4; i++)
        d[i] = (((a[i][0] + a[i][4]) + (a[i][1] + a[i][5])) +
                ((a[i][2] + a[i][6]) + (a[i][3] + a[i][7]))) + t[i];
}

static void fp4_dot4_f64(const double *const x[4], const float *wr, int k, double d[4])
{
    double a[4][4] = {{0}}, t[4] = {0};
    int k4 = k - k % 4;
    for (int kk = 0; kk < k4; kk += 4)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                a[i][j] += x[i][kk + j] * (double)wr[kk + j];
    for (int kk = k4; kk < k; kk++)
        for (int i = 0; i < 4; i++)
            t[i] += x[i][kk] * (double)wr[kk];
    for (int i = 0; i < 4; i++)
        d[i] = ((a[i][0] + a[i][2]) + (a[i][1] + a[i][3])) + t[i];
}

/* out[c, n] = (X[c, k] . W[n, k]^T) * post * rs[r], with post the nvfp4 global scale. */
static void fp4_ref_linear(fp4_ref_worker *w, const fp4_linear *l, const void *X, int c,
                           const float *rs, void *out)
{
    fp4_linear lin = *l;
    float post = 1.0f;
    int n = l->n, k = l->k, f64 = w->fp64;
    if (l->scheme.w == FP4_W_NVFP4) {
        post = l->global_scale;
        lin.global_scale = 1.0f; /* exact e2m1*e4m3 values; the scale goes on the sums */
    }
    for (int n0 = 0; n0 < n; n0 += FP4_REF_NB) {
        int nb = n - n0 < FP4_REF_NB ? n - n0 : FP4_REF_NB;
        fp4_linear_dequant_rows(&lin, n0, nb, w->wblk);
        for (int r0 = 0; r0 < c; r0 += 4) {
            int rr = c - r0 < 4 ? c - r0 : 4;
            const float *xf[4];
            const double *xd[4];
            for (int i = 0; i < 4; i++) {
                size_t off = (size_t)(r0 + (i < rr ? i : 0)) * k;
                xf[i] = (const float *)X + off;
                xd[i] = (const double *)X + off;
            }
            for (int j = 0; j < nb; j++) {
                double d[4];
                const float *wr = w->wblk + (size_t)j * k;
                if (f64)
                    fp4_dot4_f64(xd, wr, k, d);
                else
                    fp4_dot4_f32(xf, wr, k, d);
                for (int i = 0; i < rr; i++) {
                    size_t o = (size_t)(r0 + i) * n + n0 + j;
                    if (f64) {
                        double v = d[i] * (double)post;
                        ((double *)out)[o] = rs ? v * (double)rs[r0 + i] : v;
                    } else {
                        float v = (float)d[i] * post;
                        ((float *)out)[o] = rs ? v * rs[r0 + i] : v;
                    }
                }
            }
        }
    }
}

static int fp4_same_a4(const fp4_linear *p, const fp4_linear *q)
{
    return p->scheme.a == q->scheme.a &&
           (p->scheme.a != FP4_A_NVFP4_STATIC || p->input_scale == q->input_scale);
}

static void fp4_ref_run_item(fp4_ref_worker *w, const fp4_ref_item *it)
{
    int H = w->hidden, I = it->inter, c = it->c, f64 = w->fp64;
    const fp4_linear *gl = it->lin[0], *ul = it->lin[1], *dl = it->lin[2];

    int a4 = fp4_ref_prep(w, gl, c, H, w->x, it->tok, NULL, w->xin);
    fp4_ref_linear(w, gl, w->xin, c, a4 ? w->rs : NULL, w->g);
    if (w->emulate && !fp4_same_a4(gl, ul))
        a4 = fp4_ref_prep(w, ul, c, H, w->x, it->tok, NULL, w->xin);
    fp4_ref_linear(w, ul, w->xin, c, a4 ? w->rs : NULL, w->u);

    for (size_t i = 0; i < (size_t)c * I; i++)
        fp4_st(w->g, i, fp4_act_d(w->arch, fp4_ld(w->g, i, f64), fp4_ld(w->u, i, f64)), f64);

    a4 = fp4_ref_prep(w, dl, c, I, NULL, NULL, w->g, w->xin);
    fp4_ref_linear(w, dl, w->xin, c, a4 ? w->rs : NULL, w->yb);

    for (int r = 0; r < c; r++) {
        double wt = it->wt ? it->wt[r] : 1.0;
        double *yr = w->yacc + (size_t)it->tok[r] * H;
        for (int h = 0; h < H; h++)
            yr[h] += wt * fp4_ld(w->yb, (size_t)r * H + h, f64);
    }
}

static void *fp4_ref_worker_main(void *arg)
{
    fp4_ref_worker *w = arg;
    for (int i = 0; i < w->n_items; i++)
        fp4_ref_run_item(w, &w->items[i]);
    return NULL;
}

static void fp4_ref_worker_free(fp4_ref_worker *w)
{
    free(w->wblk);
    free(w->xin);
    free(w->g);
    free(w->u);
    free(w->yb);
    free(w->rs);
    free(w->row);
    free(w->row2);
    free(w->qp);
    free(w->qs);
    free(w->yacc);
}

static fp4moe_status fp4_ref_worker_alloc(fp4_ref_worker *w, int m, fp4_err *e)
{
    size_t cmax = 1, imax = 1, H = (size_t)w->hidden, acc = w->fp64 ? sizeof(double)
                                                                    : sizeof(float);
    for (int i = 0; i < w->n_items; i++) {
        cmax = (size_t)w->items[i].c > cmax ? (size_t)w->items[i].c : cmax;
        imax = (size_t)w->items[i].inter > imax ? (size_t)w->items[i].inter : imax;
    }
    size_t kmax = H > imax ? H : imax;
    w->wblk = malloc(FP4_REF_NB * kmax * sizeof(float));
    w->xin = malloc(cmax * kmax * acc);
    w->g = malloc(cmax * imax * acc);
    w->u = malloc(cmax * imax * acc);
    w->yb = malloc(cmax * H * acc);
    w->rs = malloc((cmax + 4) * sizeof(float));
    w->row = malloc(kmax * sizeof(float));
    w->row2 = malloc(kmax * sizeof(float));
    w->qp = malloc(kmax / 2 + 1);
    w->qs = malloc(kmax / 16 + 1);
    w->yacc = calloc((size_t)m * H, sizeof(double));
    if (!w->wblk || !w->xin || !w->g || !w->u || !w->yb || !w->rs || !w->row || !w->row2 ||
        !w->qp || !w->qs || !w->yacc)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY,
                        "reference forward: cannot allocate scratch for %zu tokens x %zu "
                        "features (fp%d)", cmax, kmax, w->fp64 ? 64 : 32);
    return FP4MOE_OK;
}

/* Run the items (items has room for n + 1: one may be split for balance) and write
 * y[M, H] = sum of the items' weighted outputs. */
static fp4moe_status fp4_ref_execute(const fp4_arch *a, fp4_ref_item *items, int n,
                                     const float *x, int m, int hidden, const fp4_ref_opts *o,
                                     float *y, fp4_err *e)
{
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += items[i].cost;
    int nthreads = total >= FP4_REF_PAR_MIN_MACS ? 2 : 1;
    if (nthreads == 2) {
        int big = 0;
        for (int i = 1; i < n; i++)
            if (items[i].cost > items[big].cost)
                big = i;
        if (items[big].cost > total / 2 && items[big].c >= 2) {
            fp4_ref_item half = items[big];
            int c1 = items[big].c / 2;
            memmove(&items[big + 2], &items[big + 1], (size_t)(n - big - 1) * sizeof *items);
            items[big].c = c1;
            items[big].cost = half.cost * c1 / half.c;
            half.c -= c1;
            half.tok += c1;
            if (half.wt)
                half.wt += c1;
            half.cost -= items[big].cost;
            items[big + 1] = half;
            n++;
        }
        if (n < 2)
            nthreads = 1;
    }
    /* contiguous split: thread 0 takes items [0, b) with about half of the work */
    int b = n;
    if (nthreads == 2) {
        double pre = 0.0;
        for (b = 0; b < n - 1 && pre + items[b].cost / 2 < total / 2; b++)
            pre += items[b].cost;
        if (b == 0)
            b = 1;
    }
    fp4_ref_worker wk[2];
    memset(wk, 0, sizeof wk);
    fp4moe_status st = FP4MOE_OK;
    for (int t = 0; t < nthreads; t++) {
        wk[t].arch = a;
        wk[t].items = t == 0 ? items : items + b;
        wk[t].n_items = t == 0 ? b : n - b;
        wk[t].x = x;
        wk[t].hidden = hidden;
        wk[t].fp64 = o->fp64;
        wk[t].emulate = o->emulate_a4;
        if ((st = fp4_ref_worker_alloc(&wk[t], m, e)) != FP4MOE_OK)
            goto free_workers;
    }
    pthread_t th;
    int threaded = nthreads == 2 && pthread_create(&th, NULL, fp4_ref_worker_main, &wk[1]) == 0;
    fp4_ref_worker_main(&wk[0]);
    if (threaded)
        pthread_join(th, NULL);
    else if (nthreads == 2)
        fp4_ref_worker_main(&wk[1]); /* no thread to be had: same split, same result */
    for (size_t i = 0; i < (size_t)m * hidden; i++)
        y[i] = (float)(nthreads == 2 ? wk[0].yacc[i] + wk[1].yacc[i] : wk[0].yacc[i]);
free_workers:
    for (int t = 0; t < nthreads; t++)
        fp4_ref_worker_free(&wk[t]);
    return st;
}

/* ---- argument checks --------------------------------------------------------------------- */

static fp4moe_status fp4_ref_check_lin(const fp4_linear *l, int n, int k, int emulate,
                                       const char *who, const char *which, fp4_err *e)
{
    if (!l->w || l->n != n || l->k != k)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "%s %s: expected a weight of [%d, %d], found "
                        "[%d, %d]%s", who, which, n, k, l->n, l->k, l->w ? "" : " with no data");
    if ((l->scheme.w == FP4_W_NVFP4 && (k % 16 || !l->scale)) ||
        (l->scheme.w == FP4_W_MXFP8 && (k % 32 || !l->scale)))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "%s %s: %s weight needs in_features a multiple "
                        "of %d and block scales, found in_features %d%s", who, which,
                        l->scheme.w == FP4_W_NVFP4 ? "nvfp4" : "mxfp8",
                        l->scheme.w == FP4_W_NVFP4 ? 16 : 32, k,
                        l->scale ? "" : " and no scales");
    if (!emulate || l->scheme.a == FP4_A_NONE)
        return FP4MOE_OK;
    const char *an = l->scheme.a == FP4_A_NVFP4_STATIC ? "nvfp4-static" : "nvfp4-per-token";
    if (k % 16)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "%s %s: activation scheme %s needs in_features "
                        "a multiple of 16, found %d", who, which, an, k);
    if (l->scheme.a == FP4_A_NVFP4_STATIC && (!(l->input_scale > 0.0f) || isinf(l->input_scale)))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "%s %s: activation scheme %s needs a finite "
                        "input_scale > 0, found %g", who, which, an, (double)l->input_scale);
    return FP4MOE_OK;
}

static fp4moe_status fp4_ref_check_ffn(const fp4_linear *g, const fp4_linear *u,
                                       const fp4_linear *d, int hidden, int inter, int emulate,
                                       const char *who, fp4_err *e)
{
    fp4moe_status st;
    if ((st = fp4_ref_check_lin(g, inter, hidden, emulate, who, "gate", e)) != FP4MOE_OK ||
        (st = fp4_ref_check_lin(u, inter, hidden, emulate, who, "up", e)) != FP4MOE_OK ||
        (st = fp4_ref_check_lin(d, hidden, inter, emulate, who, "down", e)) != FP4MOE_OK)
        return st;
    return FP4MOE_OK;
}

static double fp4_ffn_cost(int c, int hidden, int inter)
{
    /* the GEMMs plus dequantizing the three matrices once (about two tokens' worth) */
    return (c + 2.0) * 3.0 * hidden * inter;
}

/* ---- forwards ---------------------------------------------------------------------------- */

fp4moe_status fp4_ref_moe_forward(const fp4_arch *a, const fp4_moe_weights *w, const float *x,
                                  int m, const fp4_ref_opts *o, float *y, int32_t *ids,
                                  float *weights, fp4_err *e)
{
    if (!a || !w || !o || m < 0 || (m > 0 && (!x || !y)))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "reference MoE forward: NULL argument "
                        "or negative token count %d", m);
    int E = w->n_experts, H = w->hidden, I = w->inter, L = w->layer;
    if (a->hidden != H || a->n_experts != E || E < 1 || a->topk < 1 || a->topk > E)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "layer %d: config has hidden %d, %d "
                        "experts, top-k %d; the layer's weights have hidden %d, %d experts",
                        L, a->hidden, a->n_experts, a->topk, H, E);
    if (!w->router || !w->gate || !w->up || !w->down)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "layer %d: MoE weights without router "
                        "or expert arrays", L);
    if (a->has_score_bias && !w->router_bias)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "layer %d: config declares an "
                        "e_score_correction_bias but the layer has none", L);
    char who[64];
    fp4moe_status st;
    for (int j = 0; j < E; j++) {
        snprintf(who, sizeof who, "layer %d expert %d", L, j);
        if ((st = fp4_ref_check_ffn(&w->gate[j], &w->up[j], &w->down[j], H, I, o->emulate_a4,
                                    who, e)) != FP4MOE_OK)
            return st;
    }
    if (w->has_shared) {
        snprintf(who, sizeof who, "layer %d shared expert", L);
        if ((st = fp4_ref_check_ffn(&w->sh_gate, &w->sh_up, &w->sh_down, H, w->shared_inter,
                                    o->emulate_a4, who, e)) != FP4MOE_OK)
            return st;
    }
    if (m == 0)
        return FP4MOE_OK;

    int k = a->topk;
    size_t mk = (size_t)m * k;
    int32_t *own_ids = ids ? NULL : malloc(mk * sizeof *own_ids);
    double *wd = malloc(mk * sizeof *wd), *sw = malloc(mk * sizeof *sw);
    double *rscr = malloc((size_t)E * 2 * sizeof *rscr);
    unsigned char *taken = malloc((size_t)E);
    int32_t *stok = malloc((mk + (size_t)m) * sizeof *stok);
    size_t *start = calloc((size_t)E + 1, sizeof *start);
    fp4_ref_item *items = calloc((size_t)E + 3, sizeof *items);
    if ((!ids && !own_ids) || !wd || !sw || !rscr || !taken || !stok || !start || !items) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "layer %d: cannot allocate routing "
                      "buffers for %d tokens x top-%d", L, m, k);
        goto free_all;
    }
    if (!ids)
        ids = own_ids;
    fp4_route_d(a, w->router, w->router_bias, x, m, ids, wd, rscr, rscr + E, taken);
    if (weights)
        for (size_t i = 0; i < mk; i++)
            weights[i] = (float)wd[i];

    /* group (token, weight) pairs by expert, tokens ascending within an expert */
    for (size_t i = 0; i < mk; i++)
        start[ids[i] + 1]++;
    for (int j = 0; j < E; j++)
        start[j + 1] += start[j];
    size_t *fill = malloc((size_t)E * sizeof *fill);
    if (!fill) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "layer %d: cannot allocate routing buffers",
                      L);
        goto free_all;
    }
    memcpy(fill, start, (size_t)E * sizeof *fill);
    for (size_t i = 0; i < mk; i++) {
        size_t p = fill[ids[i]]++;
        stok[p] = (int32_t)(i / k);
        sw[p] = wd[i];
    }
    free(fill);

    int n = 0;
    for (int j = 0; j < E; j++) {
        int c = (int)(start[j + 1] - start[j]);
        if (c == 0)
            continue;
        items[n++] = (fp4_ref_item){{&w->gate[j], &w->up[j], &w->down[j]}, I, c,
                                    stok + start[j], sw + start[j], fp4_ffn_cost(c, H, I)};
    }
    if (w->has_shared) {
        int32_t *all = stok + mk;
        for (int t = 0; t < m; t++)
            all[t] = t;
        items[n++] = (fp4_ref_item){{&w->sh_gate, &w->sh_up, &w->sh_down}, w->shared_inter, m,
                                    all, NULL, fp4_ffn_cost(m, H, w->shared_inter)};
    }
    st = fp4_ref_execute(a, items, n, x, m, H, o, y, e);
free_all:
    free(own_ids);
    free(wd);
    free(sw);
    free(rscr);
    free(taken);
    free(stok);
    free(start);
    free(items);
    return st;
}

fp4moe_status fp4_ref_dense_forward(const fp4_arch *a, const fp4_dense_weights *w,
                                    const float *x, int m, const fp4_ref_opts *o, float *y,
                                    fp4_err *e)
{
    if (!a || !w || !o || m < 0 || (m > 0 && (!x || !y)))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "reference dense forward: NULL "
                        "argument or negative token count %d", m);
    if (a->hidden != w->hidden)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "layer %d: config has hidden %d, the "
                        "layer's weights %d", w->layer, a->hidden, w->hidden);
    char who[64];
    snprintf(who, sizeof who, "layer %d dense mlp", w->layer);
    fp4moe_status st = fp4_ref_check_ffn(&w->gate, &w->up, &w->down, w->hidden, w->inter,
                                         o->emulate_a4, who, e);
    if (st != FP4MOE_OK || m == 0)
        return st;
    int32_t *all = malloc((size_t)m * sizeof *all);
    if (!all)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "layer %d: cannot allocate %d token ids",
                        w->layer, m);
    for (int t = 0; t < m; t++)
        all[t] = t;
    fp4_ref_item items[2] = {{{&w->gate, &w->up, &w->down}, w->inter, m, all, NULL,
                              fp4_ffn_cost(m, w->hidden, w->inter)}};
    st = fp4_ref_execute(a, items, 1, x, m, w->hidden, o, y, e);
    free(all);
    return st;
}
