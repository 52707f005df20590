/*
 * test_gpu_moe.c - the GPU W4A16 MoE pipeline (src/gpu_moe.h), every case with every kernel
 * (FP4_GPU_K_MMA, FP4_GPU_K_DECODE and, on sm_90, FP4_GPU_K_SM90_WGMMA) against one CPU
 * reference fp4_ref_moe_forward on random in-memory layers (DESIGN.md section 6):
 * random packed e2m1, e4m3 block scales mostly among normal codes (one in 16 any finite
 * code of either sign: zero, subnormal, negative), global scales 1e-3..1e-2,
 * x ~ N(0, 1) rounded to bf16 (the reference gets the same bf16 values).
 * Metric: ||y - ref|| / ||ref|| < 1e-2 (bf16 activations and a bf16 intermediate land near
 * 2e-3), y finite everywhere (outputs and the workspace are NaN-poisoned before every run),
 * routing ids equal to the reference except where selection scores tie within 1e-5, weights
 * within 1e-4.
 * Shapes: tiny (H 256, E 8, I 128, nvfp4 shared expert) over M 1..4096; tiny variants with a
 * bf16 shared expert, no shared expert, H % 128 != 0 and top-k = E; wide-I (I 1024) and
 * wide-HI (H = I = 1024: the decode's K-split FC1 at M=1, shared memory padded to spread a
 * grid of one wave, two tiles per warp at top-8); wide-I at top-1 and top-2, M=1 (the
 * one-token FC2 with 8 and 4 warps a slot; top-4 has 2 a slot); tp8 rank (H 6144,
 * E 128, I 384, mxfp8 shared expert) over M 1, 7, 64 only, plus M 1000, 4096 and 16384 checked
 * on 64 sampled rows: the CPU reference is the slow part (2 threads), and the whole suite
 * must stay under ~2 minutes. Skewed routing: router bias +0.5 on experts 0 and 1 and -100 on
 * the last one (which then gets no tokens unless top-k = E). Also: CUDA-graph capture and
 * replay gives the same bits; forward_host gives the same bits as the device path; the
 * prologue alone (fp4_gpu_moe_prologue) writes the forward's top-k ids and weights.
 * The decode kernel's slot width (8, 16 or 32 tokens, by tokens per expert) is covered: 8 at
 * small M, 16 at odd-H top-4 M=40, 32 at tiny / odd-H M >= 64 and tp8-large; with K >= 1024
 * (FC1 as 2 K slices sharing staged activations): 16 in long-K H=1344 top-4 M=40 and tp8
 * top-4 M=256, 32 in long-K top-8 (20 and 32 per expert: slots of 3 and 4 n8 tiles), tp8
 * top-8 M=256 and tp8-large (partial second slots: 1-3 n8 tiles); 8-token slots at KS 2,
 * which the launcher takes only in large grids, by a lowered bound (run_forced: wide-I and
 * wide-HI at M 1 and 7, tp8 at M 1, 7 and 64); the shallow weight ring of the KS 8 kernels
 * (one tile a warp and the one-token FC2: half the ring; two tiles a warp: a shorter lead),
 * which the launcher takes at tp8 top-8 M=1 and for every KS 8 launch with two tiles a warp,
 * forced on for wide-I, wide-HI and tp8 at M 1 and 7 (run_forced); the latter with 4 blocks
 * per SM (grids of 20 or more blocks per SM) at tp8 M=64 (FC1: 160 and 192 slots).
 * sm90-wgmma's FC2 with the token tile resident (K <= 384, <= 48 rows per expert) runs at
 * every shape's small M, long-K, tp8 M <= 256 and tp8-large top-4 M=1000 (two slots of one
 * expert where the skewed routing piles tokens on experts 0 and 1; 48 KB of B at I=384,
 * partial column groups at H=1344), the nvfp4 shared expert at M <= 48; column strips at
 * 49-84 rows per expert or with I > 384 (tiny top-8 M=64, odd-H top-16 M=64 with its masked half
 * column tile, tp8-large top-8 M=1000, wide-I, the nvfp4 shared expert at M=64); above 84 rows
 * per expert the resident kernel's BIG form with K <= 384 (pairs of 128 tokens resident: tiny
 * M >= 1000, tiny-bf16-shared M=1000, odd-H M=1000, tp8-large M >= 4096) and the one-tile
 * FC2 with K > 384 (wide-I top-8 M=160). Its FC1 above 88 rows per expert with H % 256 == 0
 * runs the gated kernel's DEEP form (5 stages for 128-token units: tiny M >= 1000 with K = 256,
 * fewer K tiles than stages; tiny-bf16-shared M=1000, wide-I M=160, tp8-large M >= 1000),
 * where an expert's last full pair takes a tail of 1-16 or 17-32 rows after it as one
 * unit of 144 or 160 (tiny top-8 M=136, 144 and 145: every expert's 128 + 8, 128 + 16 and
 * 128 + 17; tp8-large);
 * odd-H M=1000 (H = 320) keeps the 4-stage form covered there. (The launcher also wants the
 * scales 16-byte aligned: the routed scales are a cudaMalloc of their own, so always here.)
 * Prints "SKIP: no CUDA device" and exits 0 without a device.
 * sm90-wgmma's token widths per expert tile (16 .. 160, by the rows in use) are counted from
 * the top-k ids of its cases; the full suite fails if an FC1 width, a resident FC2 width, a
 * width of its BIG form or the DEEP FC1's 128, 144 or 160 is never selected.
 * Environment: FP4MOE_GPU_TEST_SMALL=1 runs the tiny shapes with M <= 64 (tiny: 160) only (for
 * compute-sanitizer); FP4MOE_GPU_TIMING=1 adds informational "INFO timing" lines and a table:
 * tp8 shape, every kernel, top-8 and top-4, with and without the shared expert, M = 1 .. 256,
 * graph replay of the whole forward, L2 flushed (256 MB memset) before every replay, median.
 * FP4MOE_GPU_TIMING=profile runs only a short timing pass (top-8, M 1, 8, 64, one replay
 * each) for a profiler such as ncu.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe.h"
#include "ref/moe_ref.h"

#ifdef FP4MOE_WITH_CUDA /* everything but the SKIP path needs the CUDA runtime */
#include <cuda_runtime_api.h>

#include "gpu/cuda_check.h"
#include "cuda/sm90_w4a16_wgmma.cuh"
#include "cuda/w4a16_decode.cuh"

#define REL_TOL 1e-2     /* bf16 operands: 1e-3..1e-2 (DESIGN.md section 6) */
#define TIE_TOL 1e-5     /* selection scores this close count as tied */
#define W_TOL 1e-4       /* routing weights (fp32 on GPU vs double in the reference) */
#define SAMPLE_ROWS 32   /* large-M cases: reference on the first and last 32 rows */

static int n_pass, n_fail;

/* ---- random numbers (xorshift64*) ------------------------------------------------------ */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static double rng_unif(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
static float rng_normal(void)
{
    double u = rng_unif(), v = rng_unif();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}
static void rng_bytes(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = rng_u64();
        memcpy(p + i, &r, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)rng_u64();
}

/* ---- random layers ---------------------------------------------------------------------- */
enum { SH_NONE = 0, SH_NVFP4, SH_MXFP8, SH_BF16 };
static const char *const sh_name[] = {"none", "nvfp4", "mxfp8", "bf16"};

typedef struct test_layer {
    fp4_moe_weights w;
    void *blobs[4096];
    int n_blobs;
} test_layer;

static void *blob(test_layer *t, size_t bytes)
{
    void *p = malloc(bytes);
    if (!p || t->n_blobs >= 4096) {
        fprintf(stderr, "test_gpu_moe: out of host memory (%zu bytes)\n", bytes);
        exit(2);
    }
    t->blobs[t->n_blobs++] = p;
    return p;
}

static void make_linear(test_layer *t, fp4_linear *l, int kind, int n, int k)
{
    memset(l, 0, sizeof *l);
    l->n = n, l->k = k;
    if (kind == SH_NVFP4) {
        uint8_t *w = blob(t, (size_t)n * k / 2), *s = blob(t, (size_t)n * k / 16);
        rng_bytes(w, (size_t)n * k / 2);
        /* exponent field 5..9, any mantissa; one block in 16 any finite code of either sign
         * (zero, subnormal and negative scales: the load-time packing must keep them exact) */
        for (size_t i = 0; i < (size_t)n * k / 16; i++) {
            s[i] = (uint8_t)(((5 + rng_u64() % 5) << 3) | (rng_u64() & 7));
            if (rng_u64() % 16 == 0) {
                uint8_t c = (uint8_t)(rng_u64() % 254);      /* 0x00 .. 0xfd */
                s[i] = (uint8_t)(c >= 0x7f ? c + 1 : c);       /* skip 0x7f (NaN), ends at 0xfe */
            }
        }
        l->scheme.w = FP4_W_NVFP4;
        l->w = w, l->scale = s;
        l->global_scale = (float)pow(10.0, -2.0 - rng_unif());
    } else if (kind == SH_MXFP8) {
        uint8_t *w = blob(t, (size_t)n * k), *s = blob(t, (size_t)n * k / 32);
        for (size_t i = 0; i < (size_t)n * k; i++) /* normal e4m3, exponent field 1..10 */
            w[i] = (uint8_t)(((rng_u64() & 1) << 7) | ((1 + rng_u64() % 10) << 3) | (rng_u64() & 7));
        for (size_t i = 0; i < (size_t)n * k / 32; i++) s[i] = (uint8_t)(127 - 7 - rng_u64() % 3);
        l->scheme.w = FP4_W_MXFP8;
        l->w = w, l->scale = s;
    } else {
        uint16_t *w = blob(t, (size_t)n * k * 2);
        for (size_t i = 0; i < (size_t)n * k; i++) w[i] = fp4moe_bf16_from_float(0.03f * rng_normal());
        l->scheme.w = FP4_W_BF16;
        l->w = (const uint8_t *)w;
    }
}

static void make_layer(test_layer *t, int h, int e, int inter, int sh_kind, int sh_inter)
{
    memset(t, 0, sizeof *t);
    fp4_moe_weights *w = &t->w;
    w->n_experts = e, w->hidden = h, w->inter = inter;
    w->router = blob(t, (size_t)e * h * 4);
    w->router_bias = blob(t, (size_t)e * 4);
    for (size_t i = 0; i < (size_t)e * h; i++) w->router[i] = rng_normal() / sqrtf((float)h);
    w->gate = blob(t, e * sizeof(fp4_linear));
    w->up = blob(t, e * sizeof(fp4_linear));
    w->down = blob(t, e * sizeof(fp4_linear));
    for (int j = 0; j < e; j++) {
        make_linear(t, &w->gate[j], SH_NVFP4, inter, h);
        make_linear(t, &w->up[j], SH_NVFP4, inter, h);
        make_linear(t, &w->down[j], SH_NVFP4, h, inter);
    }
    w->has_shared = sh_kind != SH_NONE;
    w->shared_inter = w->has_shared ? sh_inter : 0;
    if (w->has_shared) {
        make_linear(t, &w->sh_gate, sh_kind, sh_inter, h);
        make_linear(t, &w->sh_up, sh_kind, sh_inter, h);
        make_linear(t, &w->sh_down, sh_kind, h, sh_inter);
    }
}

static void free_layer(test_layer *t)
{
    for (int i = 0; i < t->n_blobs; i++) free(t->blobs[i]);
    t->n_blobs = 0;
}

/* Router settings of one case: swigluoai cases use the MiniMax router (sigmoid + bias,
 * renormalized, x2.0), silu cases a softmax router (renormalized, x1.0). */
static void set_arch(fp4_arch *a, const fp4_moe_weights *w, int topk, int oai, int skew,
                     float *bias)
{
    memset(a, 0, sizeof *a);
    a->hidden = w->hidden, a->n_experts = w->n_experts, a->moe_intermediate = w->inter;
    a->shared_intermediate = w->shared_inter, a->topk = topk, a->n_layers = 1;
    a->act = oai ? FP4_ACT_SWIGLUOAI : FP4_ACT_SILU;
    a->swiglu_limit = oai ? 7.0f : 0.0f;
    a->swiglu_alpha = 1.702f;
    a->scoring = oai ? FP4_SCORE_SIGMOID : FP4_SCORE_SOFTMAX;
    a->norm_topk = 1;
    a->routed_scaling = oai ? 2.0f : 1.0f;
    a->has_score_bias = oai || skew;
    a->is_moe[0] = 1;
    int e = w->n_experts;
    for (int j = 0; j < e; j++) bias[j] = oai ? 0.01f * rng_normal() : 0.f;
    if (skew) {
        bias[0] += 0.5f;
        if (e > 1) bias[1] += 0.5f;
        bias[e - 1] = -100.f;
    }
}

/* Selection score of expert j for bf16 token x (double, like the reference). */
static double sel_score(const fp4_arch *a, const fp4_moe_weights *w, const float *x, int j)
{
    int E = w->n_experts, H = w->hidden;
    double lj = 0, mx = -INFINITY, sum = 0, p;
    double *l = calloc(E > 0 ? E : 1, sizeof(double));
    for (int e = 0; e < E; e++) {
        double acc = 0;
        for (int h = 0; h < H; h++) acc += (double)w->router[(size_t)e * H + h] * x[h];
        l[e] = acc;
        mx = acc > mx ? acc : mx;
    }
    lj = l[j];
    if (a->scoring == FP4_SCORE_SOFTMAX) {
        for (int e = 0; e < E; e++) sum += exp(l[e] - mx);
        p = exp(lj - mx) / sum;
    } else {
        p = 1.0 / (1.0 + exp(-lj));
    }
    free(l);
    return p + (a->has_score_bias ? w->router_bias[j] : 0.0);
}

typedef struct gpu_bufs {
    void *dx, *dws;
    float *dy, *dw;
    int32_t *dids;
    size_t wsb;
} gpu_bufs;

static void bufs_alloc(gpu_bufs *b, fp4_gpu_moe *g, int m, int h, int k)
{
    b->wsb = fp4_gpu_moe_workspace_size(g, m);
    CK(cudaMalloc(&b->dx, (size_t)m * h * 2));
    CK(cudaMalloc((void **)&b->dy, (size_t)m * h * 4));
    CK(cudaMalloc((void **)&b->dids, (size_t)m * k * 4));
    CK(cudaMalloc((void **)&b->dw, (size_t)m * k * 4));
    CK(cudaMalloc(&b->dws, b->wsb));
}

static void bufs_free(gpu_bufs *b)
{
    cudaFree(b->dx);
    cudaFree(b->dy);
    cudaFree(b->dids);
    cudaFree(b->dw);
    cudaFree(b->dws);
}

/* On the forward's stream: a legacy-stream cudaMemset would race with a non-blocking one. */
static void poison(gpu_bufs *b, int m, int h, int k, cudaStream_t s)
{
    CK(cudaMemsetAsync(b->dy, 0xff, (size_t)m * h * 4, s)); /* 0xffffffff is a NaN */
    CK(cudaMemsetAsync(b->dids, 0xff, (size_t)m * k * 4, s));
    CK(cudaMemsetAsync(b->dw, 0xff, (size_t)m * k * 4, s));
    /* and the workspace: a kernel that reads rows no kernel of this forward has written
     * (yet) finds NaN (bf16 / fp32) or -1 (ids, rows), not an earlier run's values */
    CK(cudaMemsetAsync(b->dws, 0xff, b->wsb, s));
}

/* Every kernel runs every case; sm90-wgmma is dropped (with a SKIP line) off sm_90. */
static const fp4_gpu_kernel kernels[] = {FP4_GPU_K_MMA, FP4_GPU_K_DECODE, FP4_GPU_K_SM90_WGMMA};
static int N_KERNELS = (int)(sizeof kernels / sizeof kernels[0]);

/* Coverage of sm90-wgmma's token widths (wg_unit in src/cuda/sm90_w4a16_wgmma.cu): the
 * routed experts' 64-row slots, in pairs (fp4_moe_group align 2), select a width by the rows
 * in use; counted here from the GPU's top-k ids of every sm90-wgmma case, for FC1 (always the
 * one-tile kernel) and FC2. FC2 (the launcher's rule, by rows per expert on average, with
 * its bounds FP4_WG_* from sm90_w4a16_wgmma.cuh) with I <= 384: up to 48 the resident
 * kernel (a slot alone as 32 .. 64 tokens, or 16 / 24 too up to 24; a pair as two of 64),
 * 49 .. 84 column strips, above that the resident kernel's BIG form (a pair as one unit of
 * 128, a slot alone as 32 .. 64); with I > 384 strips up to 84, the one-tile kernel above.
 * FC1 above 88 rows per expert with H % 256 == 0: the gated
 * kernel's DEEP form (its own 128-token body; narrower tiles run the common bodies; an
 * expert's last full pair followed by a tail of 1 .. 16 or 17 .. 32 rows runs them as one
 * unit of 144 or 160 and the tail's unit nothing: wg_tail). The suite fails if an FC1 width,
 * a resident FC2 width, a BIG FC2 width or the DEEP form's 128, 144 or 160 is never
 * selected. */
static const int wg_widths[] = {16, 24, 32, 48, 64, 80, 96, 128, 144, 160};
#define N_WG_WIDTHS ((int)(sizeof wg_widths / sizeof wg_widths[0]))
#define N_WG_KINDS 5
static const char *wg_kind[N_WG_KINDS] = {"FC1", "FC2 one-tile / strips", "FC2 resident",
                                          "FC2 resident pairs (BIG)", "FC1 DEEP"};
static const unsigned wg_need[N_WG_KINDS] = {0xff, 0, 0x1f, 0x9c, 0x380}; /* widths required */
static int wg_seen[N_WG_KINDS][N_WG_WIDTHS];

static int wg_width(int first, int second)
{
    if (second > 0) return second > 32 ? 128 : second > 16 ? 96 : 80;
    return first > 48 ? 64 : first > 32 ? 48 : first > 24 ? 32 : first > 16 ? 24 : 16;
}

static void wg_add(int kind, int width)
{
    for (int i = 0; i < N_WG_WIDTHS; i++) wg_seen[kind][i] += wg_widths[i] == width;
}

static void wg_count(const int32_t *ids, int m, int k, int n_experts, int inter, int h)
{
    int *cnt = calloc((size_t)n_experts, sizeof(int));
    for (long long i = 0; i < (long long)m * k; i++)
        if (ids[i] >= 0 && ids[i] < n_experts) cnt[ids[i]]++;
    const long long per_expert = ((long long)m * k + n_experts - 1) / n_experts;
    const int fc2_res = inter <= FP4_WG_RES_K && per_expert <= FP4_WG_RES_ROWS;
    const int fc2_small = per_expert <= FP4_WG_RES_SMALL;
    const int fc2_big = inter <= FP4_WG_RES_K && per_expert > FP4_WG_BIG_ROWS;
    const int fc1_deep = per_expert > FP4_WG_DEEP_ROWS && h % 256 == 0;
    for (int e = 0; e < n_experts; e++)
        for (int r = 0, fc1_done = 0; r < cnt[e]; r += 128) {
            const int left = cnt[e] - r, first = left < 64 ? left : 64;
            const int w = wg_width(first, left - first), pair = left > first;
            if (fc1_deep && left > 128 && left - 128 <= 32) /* this pair and its tail */
                wg_add(4, left - 128 <= 16 ? 144 : 160), fc1_done = 1;
            else if (!fc1_done)
                wg_add(fc1_deep ? 4 : 0, w);
            if (fc2_res && pair) wg_seen[2][4] += 2; /* a pair: two units of 64 */
            else if (fc2_res) wg_add(2, !fc2_small && w < 32 ? 32 : w); /* 16, 24: <= 24 only */
            else if (fc2_big) wg_add(3, pair ? 128 : w < 32 ? 32 : w);
            else wg_add(1, w);
        }
    free(cnt);
}

/* One GPU forward of m tokens (outputs poisoned first); results to the host arrays. */
static fp4moe_status gpu_run(fp4_gpu_moe *g, fp4_gpu_kernel kern, const uint16_t *xb, int m,
                             int h, int k, float *y, int32_t *gids, float *gw, cudaStream_t s,
                             fp4_err *e)
{
    size_t nx = (size_t)m * h;
    gpu_bufs b;
    bufs_alloc(&b, g, m, h, k);
    CK(cudaMemcpyAsync(b.dx, xb, nx * 2, cudaMemcpyHostToDevice, s));
    poison(&b, m, h, k, s);
    fp4moe_status st = fp4_gpu_moe_forward(g, kern, b.dx, m, b.dy, b.dids, b.dw, b.dws, b.wsb, s, e);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(y, b.dy, nx * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gids, b.dids, (size_t)m * k * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gw, b.dw, (size_t)m * k * 4, cudaMemcpyDeviceToHost));
    bufs_free(&b);
    return st;
}

/* One case: the reference on all rows (or sampled ones), then each kernel against it. */
static void run_case(const char *shape, const fp4_arch *a, const fp4_moe_weights *w,
                     fp4_gpu_moe *g, int m, int skew, int sampled, cudaStream_t s)
{
    int H = w->hidden, k = a->topk;
    size_t nx = (size_t)m * H;
    float *x = malloc(nx * 4), *y = malloc(nx * 4), *gw = malloc((size_t)m * k * 4);
    uint16_t *xb = malloc(nx * 2);
    int32_t *gids = malloc((size_t)m * k * 4);
    for (size_t i = 0; i < nx; i++) {
        xb[i] = fp4moe_bf16_from_float(rng_normal());
        x[i] = fp4moe_bf16_to_float(xb[i]);
    }
    char params[256];
    int shk = !w->has_shared ? SH_NONE
              : w->sh_gate.scheme.w == FP4_W_NVFP4 ? SH_NVFP4
              : w->sh_gate.scheme.w == FP4_W_MXFP8 ? SH_MXFP8 : SH_BF16;
    snprintf(params, sizeof params, "%s H=%d E=%d I=%d shared=%s/%d M=%d top-%d %s %s %s",
             shape, H, w->n_experts, w->inter, sh_name[shk], w->shared_inter,
             m, k, skew ? "skewed" : "uniform", a->act == FP4_ACT_SILU ? "silu" : "swigluoai",
             a->scoring == FP4_SCORE_SOFTMAX ? "softmax" : "sigmoid");
    fp4_err e;
    /* Rows the reference checks. */
    int nr = sampled && m > 2 * SAMPLE_ROWS ? 2 * SAMPLE_ROWS : m;
    int *rows = malloc(nr * sizeof(int));
    for (int i = 0; i < nr; i++) rows[i] = nr == m ? i : (i < SAMPLE_ROWS ? i : m - 2 * SAMPLE_ROWS + i);
    float *xr = malloc((size_t)nr * H * 4), *yr = malloc((size_t)nr * H * 4);
    float *rw = malloc((size_t)nr * k * 4);
    int32_t *rids = malloc((size_t)nr * k * 4);
    for (int i = 0; i < nr; i++) memcpy(xr + (size_t)i * H, x + (size_t)rows[i] * H, H * 4);
    fp4_ref_opts o = {0, 0};
    fp4moe_status st = fp4_ref_moe_forward(a, w, xr, nr, &o, yr, rids, rw, &e);
    if (st != FP4MOE_OK) {
        printf("FAIL %s: reference: %s\n", params, e.msg);
        n_fail++;
        goto out;
    }
    for (int ki = 0; ki < N_KERNELS; ki++) {
        const char *kn = fp4_gpu_kernel_name(kernels[ki]);
        st = gpu_run(g, kernels[ki], xb, m, H, k, y, gids, gw, s, &e);
        if (st != FP4MOE_OK) {
            printf("FAIL %s kernel=%s: forward: %s\n", params, kn, e.msg);
            n_fail++;
            continue;
        }
        if (kernels[ki] == FP4_GPU_K_SM90_WGMMA) wg_count(gids, m, k, w->n_experts, w->inter, H);
        size_t n_nonfinite = 0;
        for (size_t i = 0; i < nx; i++) n_nonfinite += !isfinite(y[i]);
        double d2 = 0, r2 = 0;
        int bad_ids = 0, ties = 0, bad_w = 0;
        for (int i = 0; i < nr; i++) {
            const float *yg = y + (size_t)rows[i] * H, *yc = yr + (size_t)i * H;
            for (int h = 0; h < H; h++) {
                double d = (double)yg[h] - yc[h];
                d2 += d * d;
                r2 += (double)yc[h] * yc[h];
            }
            for (int j = 0; j < k; j++) {
                int gi = gids[(size_t)rows[i] * k + j], ri = rids[(size_t)i * k + j];
                if (gi != ri) {
                    if (gi < 0 || gi >= w->n_experts ||
                        fabs(sel_score(a, w, xr + (size_t)i * H, gi) -
                             sel_score(a, w, xr + (size_t)i * H, ri)) > TIE_TOL)
                        bad_ids++;
                    else
                        ties++;
                } else if (!(fabs(gw[(size_t)rows[i] * k + j] - rw[(size_t)i * k + j]) <=
                             W_TOL * (1.0 + fabs(rw[(size_t)i * k + j])))) {
                    bad_w++;
                }
            }
        }
        double rel = sqrt(d2 / (r2 > 0 ? r2 : 1e-300));
        int ok = rel < REL_TOL && n_nonfinite == 0 && bad_ids == 0 && bad_w == 0 && r2 > 0;
        printf("%s %s kernel=%s%s: rel err %.3e, non-finite %zu, id mismatches %d (ties %d), "
               "weight mismatches %d\n", ok ? "PASS" : "FAIL", params, kn,
               nr < m ? " (64 sampled rows)" : "", rel, n_nonfinite, bad_ids, ties, bad_w);
        ok ? n_pass++ : n_fail++;
    }
out:
    free(rows);
    free(xr);
    free(yr);
    free(rw);
    free(rids);
    free(x);
    free(y);
    free(xb);
    free(gids);
    free(gw);
}

/* Graph capture + replay and forward_host give the same bits as the eager device path. */
static void run_repro_case(const fp4_arch *a, const fp4_moe_weights *w, fp4_gpu_moe *g,
                           fp4_gpu_kernel kern, int m, cudaStream_t s)
{
    const char *kn = fp4_gpu_kernel_name(kern);
    int H = w->hidden, k = a->topk;
    size_t nx = (size_t)m * H;
    float *x = malloc(nx * 4), *y0 = malloc(nx * 4), *y1 = malloc(nx * 4), *y2 = malloc(nx * 4);
    uint16_t *xb = malloc(nx * 2);
    for (size_t i = 0; i < nx; i++) {
        xb[i] = fp4moe_bf16_from_float(rng_normal());
        x[i] = fp4moe_bf16_to_float(xb[i]);
    }
    gpu_bufs b;
    bufs_alloc(&b, g, m, H, k);
    CK(cudaMemcpyAsync(b.dx, xb, nx * 2, cudaMemcpyHostToDevice, s));
    poison(&b, m, H, k, s);
    fp4_err e;
    int ok = 1;
    /* eager, with NULL top-k outputs (workspace copies) */
    if (fp4_gpu_moe_forward(g, kern, b.dx, m, b.dy, NULL, NULL, b.dws, b.wsb, s, &e) != FP4MOE_OK) {
        printf("FAIL graph kernel=%s M=%d: eager forward: %s\n", kn, m, e.msg);
        ok = 0;
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(y0, b.dy, nx * 4, cudaMemcpyDeviceToHost));
    /* capture, then replay twice into a poisoned y */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    fp4moe_status st = fp4_gpu_moe_forward(g, kern, b.dx, m, b.dy, b.dids, b.dw, b.dws, b.wsb, s, &e);
    CK(cudaStreamEndCapture(s, &graph));
    if (st != FP4MOE_OK) {
        printf("FAIL graph kernel=%s M=%d: forward under capture: %s\n", kn, m, e.msg);
        ok = 0;
    }
    CK(cudaGraphInstantiate(&exec, graph, 0));
    poison(&b, m, H, k, s);
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(y1, b.dy, nx * 4, cudaMemcpyDeviceToHost));
    poison(&b, m, H, k, s);
    CK(cudaGraphLaunch(exec, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(y2, b.dy, nx * 4, cudaMemcpyDeviceToHost));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    size_t nonfinite = 0;
    for (size_t i = 0; i < nx; i++) nonfinite += !isfinite(y0[i]);
    int same1 = !memcmp(y0, y1, nx * 4), same2 = !memcmp(y0, y2, nx * 4);
    printf("%s graph capture kernel=%s M=%d top-%d: replay equal %d, second replay equal %d, "
           "non-finite %zu\n", ok && same1 && same2 && !nonfinite ? "PASS" : "FAIL", kn, m, k,
           same1, same2, nonfinite);
    ok && same1 && same2 && !nonfinite ? n_pass++ : n_fail++;
    /* forward_host on the same x */
    memset(y1, 0, nx * 4);
    st = fp4_gpu_moe_forward_host(g, kern, x, m, y1, NULL, NULL, &e);
    int same = st == FP4MOE_OK && !memcmp(y0, y1, nx * 4);
    printf("%s forward_host kernel=%s M=%d: equal to the device path %d%s%s\n",
           same ? "PASS" : "FAIL", kn, m, same, st ? ": " : "", st ? e.msg : "");
    same ? n_pass++ : n_fail++;
    /* the prologue alone (bench's route_us) writes the ids / weights of the whole forward */
    size_t pk = (size_t)m * k;
    int32_t *id0 = malloc(pk * 4), *id1 = malloc(pk * 4);
    float *w0 = malloc(pk * 4), *w1 = malloc(pk * 4);
    CK(cudaMemcpy(id0, b.dids, pk * 4, cudaMemcpyDeviceToHost)); /* from the last replay */
    CK(cudaMemcpy(w0, b.dw, pk * 4, cudaMemcpyDeviceToHost));
    poison(&b, m, H, k, s);
    st = fp4_gpu_moe_prologue(g, kern, b.dx, m, b.dids, b.dw, b.dws, b.wsb, s, &e);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(id1, b.dids, pk * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(w1, b.dw, pk * 4, cudaMemcpyDeviceToHost));
    same = st == FP4MOE_OK && !memcmp(id0, id1, pk * 4) && !memcmp(w0, w1, pk * 4);
    printf("%s prologue kernel=%s M=%d: ids and weights equal to the forward's %d%s%s\n",
           same ? "PASS" : "FAIL", kn, m, same, st ? ": " : "", st ? e.msg : "");
    same ? n_pass++ : n_fail++;
    free(id0);
    free(id1);
    free(w0);
    free(w1);
    bufs_free(&b);
    free(x);
    free(y0);
    free(y1);
    free(y2);
    free(xb);
}

/* Shape errors are reported as NOT_SUPPORTED with the shape in the message. */
static void run_reject_case(void)
{
    test_layer t;
    make_layer(&t, 96, 4, 128, SH_NONE, 0); /* H % 64 != 0 */
    fp4_arch a;
    set_arch(&a, &t.w, 2, 1, 0, t.w.router_bias);
    fp4_gpu_moe *g = NULL;
    fp4_err e;
    fp4moe_status st = fp4_gpu_moe_create(&a, &t.w, &g, &e);
    int ok = st == FP4MOE_ERR_NOT_SUPPORTED && strstr(e.msg, "H=96") && !g;
    printf("%s reject H=96: status %d, message '%s'\n", ok ? "PASS" : "FAIL", (int)st,
           st ? e.msg : "");
    ok ? n_pass++ : n_fail++;
    fp4_gpu_moe_destroy(g);
    free_layer(&t);

    /* An e4m3 NaN block scale cannot be packed: a format error naming the linear. */
    make_layer(&t, 128, 4, 64, SH_NONE, 0);
    set_arch(&a, &t.w, 2, 1, 0, t.w.router_bias);
    ((uint8_t *)t.w.up[2].scale)[5 * (128 / 16) + 3] = 0xff;
    g = NULL;
    st = fp4_gpu_moe_create(&a, &t.w, &g, &e);
    ok = st == FP4MOE_ERR_FORMAT && strstr(e.msg, "expert 2 up") && strstr(e.msg, "[5, 3]") &&
         strstr(e.msg, "NaN") && !g;
    printf("%s reject NaN block scale: status %d, message '%s'\n", ok ? "PASS" : "FAIL",
           (int)st, st ? e.msg : "");
    ok ? n_pass++ : n_fail++;
    fp4_gpu_moe_destroy(g);
    free_layer(&t);
}

/* ---- timing (informational, FP4MOE_GPU_TIMING=1) ------------------------------------- */
#define FLUSH_BYTES ((size_t)256 << 20) /* > the 60 MB L2 of an H100/H200 */
#define TIME_REPS 15

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median us of graph replays of one forward, the L2 flushed by a memset before each. */
static double time_median(fp4_gpu_moe *g, fp4_gpu_kernel kern, int m, gpu_bufs *b, void *flush,
                          cudaEvent_t e0, cudaEvent_t e1, int reps, cudaStream_t s)
{
    fp4_err e;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    fp4moe_status st = fp4_gpu_moe_forward(g, kern, b->dx, m, b->dy, b->dids, b->dw, b->dws,
                                           b->wsb, s, &e);
    CK(cudaStreamEndCapture(s, &graph));
    if (st != FP4MOE_OK) {
        printf("INFO timing kernel=%s M=%d: forward failed: %s\n", fp4_gpu_kernel_name(kern), m,
               e.msg);
        CK(cudaGraphDestroy(graph));
        return -1;
    }
    CK(cudaGraphInstantiate(&exec, graph, 0));
    double t[TIME_REPS];
    for (int r = reps < TIME_REPS ? 0 : -3; r < reps; r++) {
        CK(cudaMemsetAsync(flush, r & 0xff, FLUSH_BYTES, s));
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(exec, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = 1e3 * ms;
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    qsort(t, reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

/* Both kernels at the tp8 shape (H 6144, E 128, I 384, mxfp8 -> bf16 shared 384), MiniMax
 * router (uniform), top-8 and top-4, with and without the shared expert. The table at the
 * end: median us, and GB/s of the weight bytes the forward must read (distinct routed experts
 * hit, from the ids of the last replay, at 0.5625 B/param; shared expert as bf16). */
static void run_timing(int profile, cudaStream_t s)
{
    static const int ms_all[] = {1, 2, 4, 8, 16, 32, 64, 128, 256}, ms_prof[] = {1, 8, 64};
    static const int topks[] = {8, 4};
    enum { NM = sizeof ms_all / sizeof ms_all[0] };
    const int *ms = profile ? ms_prof : ms_all, n_ms = profile ? 3 : NM;
    const int n_topk = profile ? 1 : 2, reps = profile ? 1 : TIME_REPS;
    const int H = 6144, E = 128, I = 384, IS = 384, mmax = 256;
    double us[2][2][NM][FP4_GPU_K_COUNT], gbytes[2][2][NM];
    test_layer t;
    make_layer(&t, H, E, I, SH_MXFP8, IS);
    uint16_t *xb = malloc((size_t)mmax * H * 2);
    int32_t *ids = malloc((size_t)mmax * 8 * 4);
    for (size_t i = 0; i < (size_t)mmax * H; i++) xb[i] = fp4moe_bf16_from_float(rng_normal());
    void *flush;
    CK(cudaMalloc(&flush, FLUSH_BYTES));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    memset(us, 0, sizeof us);
    memset(gbytes, 0, sizeof gbytes);
    for (int ti = 0; ti < n_topk; ti++)
        for (int sh = 0; sh < 2; sh++) {
            fp4_moe_weights w = t.w;
            w.has_shared = !sh;
            w.shared_inter = w.has_shared ? IS : 0;
            fp4_arch a;
            set_arch(&a, &w, topks[ti], 1, 0, t.w.router_bias);
            fp4_gpu_moe *g = NULL;
            fp4_err e;
            if (fp4_gpu_moe_create(&a, &w, &g, &e) != FP4MOE_OK) {
                printf("INFO timing: create failed: %s\n", e.msg);
                continue;
            }
            gpu_bufs b;
            bufs_alloc(&b, g, mmax, H, topks[ti]);
            CK(cudaMemcpyAsync(b.dx, xb, (size_t)mmax * H * 2, cudaMemcpyHostToDevice, s));
            for (int mi = 0; mi < n_ms; mi++) {
                int m = ms[mi], k = topks[ti];
                for (int ki = 0; ki < N_KERNELS; ki++)
                    us[ti][sh][mi][ki] =
                        time_median(g, kernels[ki], m, &b, flush, e0, e1, reps, s);
                CK(cudaMemcpy(ids, b.dids, (size_t)m * k * 4, cudaMemcpyDeviceToHost));
                int hit[128] = {0}, n_hit = 0;
                for (int i = 0; i < m * k; i++)
                    if (ids[i] >= 0 && ids[i] < E && !hit[ids[i]]++) n_hit++;
                gbytes[ti][sh][mi] = 1e-9 * (n_hit * 3.0 * I * H * 0.5625 +
                                             (w.has_shared ? 3.0 * IS * H * 2 : 0));
                for (int ki = 0; ki < N_KERNELS; ki++)
                    printf("INFO timing H=%d E=%d I=%d top-%d shared=%s M=%d kernel=%s: %.1f us "
                           "(median of %d graph replays, L2 flushed), %d experts hit, %.0f GB/s\n",
                           H, E, I, k, w.has_shared ? "mxfp8/384" : "none", m,
                           fp4_gpu_kernel_name(kernels[ki]), us[ti][sh][mi][ki], reps, n_hit,
                           gbytes[ti][sh][mi] / us[ti][sh][mi][ki] * 1e6);
            }
            bufs_free(&b);
            fp4_gpu_moe_destroy(g);
        }
    printf("INFO table: us per MoE forward (graph replay, L2 cold, median); GB/s of weights read\n");
    printf("INFO table: %-6s %-6s %5s %10s %10s %8s %9s\n", "top-k", "shared", "M", "mma_us",
           "decode_us", "mma/dec", "dec_GB/s");
    for (int ti = 0; ti < n_topk; ti++)
        for (int sh = 0; sh < 2; sh++)
            for (int mi = 0; mi < n_ms; mi++) {
                double m0 = us[ti][sh][mi][0], d0 = us[ti][sh][mi][1];
                printf("INFO table: %-6d %-6s %5d %10.1f %10.1f %8.2f %9.0f\n", topks[ti],
                       sh ? "none" : "mxfp8", ms[mi], m0, d0, d0 > 0 ? m0 / d0 : 0,
                       d0 > 0 ? gbytes[ti][sh][mi] / d0 * 1e6 : 0);
            }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(flush));
    free(xb);
    free(ids);
    free_layer(&t);
}

typedef struct shape_spec {
    const char *name;
    int h, e, inter, sh_kind, sh_inter;
    const int *ms;
    int n_ms;
    const int *topks;
    int n_topks;
    int combos;  /* 1: all 4 of skew x act; 0: skewed swigluoai and uniform silu only */
    int sampled; /* reference on sampled rows for large M */
} shape_spec;

static void run_shape(const shape_spec *sp, cudaStream_t s)
{
    test_layer t;
    make_layer(&t, sp->h, sp->e, sp->inter, sp->sh_kind, sp->sh_inter);
    for (int ti = 0; ti < sp->n_topks; ti++)
        for (int c = 0; c < 4; c++) {
            int skew = c & 1, oai = c >> 1;
            if (!sp->combos && skew != oai) continue;
            fp4_arch a;
            set_arch(&a, &t.w, sp->topks[ti], oai, skew, t.w.router_bias);
            fp4_gpu_moe *g = NULL;
            fp4_err e;
            if (fp4_gpu_moe_create(&a, &t.w, &g, &e) != FP4MOE_OK) {
                printf("FAIL %s top-%d: create: %s\n", sp->name, sp->topks[ti], e.msg);
                n_fail++;
                continue;
            }
            for (int mi = 0; mi < sp->n_ms; mi++)
                run_case(sp->name, &a, &t.w, g, sp->ms[mi], skew, sp->sampled, s);
            if (!strcmp(sp->name, "tiny") && ti == sp->n_topks - 1 && skew && oai)
                for (int ki = 0; ki < N_KERNELS; ki++) {
                    run_repro_case(&a, &t.w, g, kernels[ki], 200, s);
                    run_repro_case(&a, &t.w, g, kernels[ki], 3, s);
                }
            fp4_gpu_moe_destroy(g);
        }
    free_layer(&t);
}

/* Decode kernels that the launcher takes only where no shape here reaches, run by its
 * switches. 8-token slots of long K with staged activations over 2 K slices (KS 2): taken in
 * grids of >= 12 blocks per SM (I = 3072 at M >= 4), so the bound is lowered to 0. Then FC1
 * where K = H >= 1024 (wide-HI, tp8, with the nvfp4 shared FC1 at wide-HI), FC2 and the nvfp4
 * shared FC2 where K = I = 1024 (wide-I, wide-HI) run at KS 2; the one-token FC2 (M=1) keeps
 * its own kernel. The shallow weight ring of the KS 8 RT 1 kernels and the one-token FC2
 * (fp4_dec_set_shallow_ring): taken for one-wave grids with 24 or more weight-streaming warps
 * per SM (tp8 top-8 M=1 here), so forced on at M=1 and 7 for grids it leaves deep: wide-I
 * (the one-token FC2 at K = 1024), wide-HI (the one-token FC2; FC1 at K = 1024 with one tile
 * a warp at top-4) and tp8 (top-4: FC1 at K = 6144 and the one-token FC2 of 4 experts). At
 * M=7 the routed FC1 runs two tiles a warp at KS 8 and takes the shorter lead; whatever runs
 * at KS 8 with one tile a warp there takes the half ring. The small suite leaves tp8 out. */
static void run_forced(int full, cudaStream_t s)
{
    static const int ms_w[] = {1, 7}, ms_t[] = {1, 7, 64}, k48[] = {4, 8};
    const shape_spec st[2][3] = {
        {{"wide-I, staged 8-token slots", 256, 8, 1024, SH_NVFP4, 1024, ms_w, 2, k48, 2, 0, 0},
         {"wide-HI, staged 8-token slots", 1024, 8, 1024, SH_NVFP4, 1024, ms_w, 2, k48, 2, 0, 0},
         {"tp8, staged 8-token slots", 6144, 128, 384, SH_MXFP8, 384, ms_t, 3, k48, 2, 0, 0}},
        {{"wide-I, shallow ring", 256, 8, 1024, SH_NVFP4, 1024, ms_w, 2, k48, 2, 0, 0},
         {"wide-HI, shallow ring", 1024, 8, 1024, SH_NVFP4, 1024, ms_w, 2, k48, 2, 0, 0},
         {"tp8, shallow ring", 6144, 128, 384, SH_MXFP8, 384, ms_w, 2, k48, 2, 0, 0}},
    };
    for (int f = 0; f < 2; f++) {
        const int old = f ? fp4_dec_set_shallow_ring(1) : fp4_dec_set_ks2_per_sm(0);
        for (int i = 0; i < (full ? 3 : 2); i++) run_shape(&st[f][i], s);
        if (f) fp4_dec_set_shallow_ring(old);
        else fp4_dec_set_ks2_per_sm(old);
    }
}

int main(void)
{
    if (fp4_gpu_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    int ma = 0, mi = 0;
    fp4_gpu_device_cc(&ma, &mi);
    printf("device 0: compute capability %d.%d\n", ma, mi);
    if (ma != 9 || mi != 0) {
        N_KERNELS--; /* sm90-wgmma is last in kernels[] */
        printf("SKIP: kernel sm90-wgmma needs an sm_90 GPU (this is sm_%d%d)\n", ma, mi);
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* tiny top-8 (every expert has all M tokens) M=136, 144, 145: the DEEP form's 128 + 8,
     * 128 + 16 and 128 + 17 (tails, wg_tail: units of 144, 144, 160) */
    static const int ms_tiny[] = {1, 7, 64, 136, 144, 145, 1000, 4096}, k48[] = {4, 8};
    static const int ms_small[] = {7, 1000}, k8[] = {8};
    static const int ms_odd[] = {1, 40, 64, 1000}, k_odd[] = {4, 16};
    static const int ms_tp8[] = {1, 7, 64, 256}, ms_tp8_big[] = {1000, 4096, 16384};
    static const int ms_long_k[] = {40, 64}, ms_wide[] = {1, 7}, ms_wide_i[] = {1, 7, 160};
    static const int ms_one[] = {1}, k12[] = {1, 2};
    const shape_spec shapes[] = {
        {"tiny", 256, 8, 128, SH_NVFP4, 128, ms_tiny, 8, k48, 2, 1, 0},
        {"tiny-bf16-shared", 256, 8, 192, SH_BF16, 256, ms_small, 2, k8, 1, 1, 0},
        /* H % 128 != 0 (masked FC2 column tile), no shared expert, top-k = E = 16 */
        {"odd-H", 320, 16, 128, SH_NONE, 0, ms_odd, 4, k_odd, 2, 0, 0},
        /* H = 1344 (21 groups): FC1 of 16- and 32-token decode slots in 2 K slices of 10 and
         * 11 groups, 3 staged chunks each, the last ones partial */
        {"long-K", 1344, 16, 128, SH_NONE, 0, ms_long_k, 2, k48, 2, 0, 0},
        /* I = 1024 (16 groups): decode FC2 and the shared FC2 split K over 8 warps (KS 8),
         * their weight copies issued before the PDL wait (weights_first), sm90-wgmma's FC2 by
         * the one-tile kernel at M=160 top-8 (160 rows per expert), strips below */
        {"wide-I", 256, 8, 1024, SH_NVFP4, 1024, ms_wide_i, 3, k48, 2, 0, 0},
        /* top-1 / top-2 at M=1: the one-token FC2 (16 groups) with 8 / 4 warps a slot, 2 / 4
         * groups each (top-4 takes 2 warps a slot: wide-I, tp8) */
        {"wide-I, one-token FC2 split", 256, 8, 1024, SH_NVFP4, 1024, ms_one, 1, k12, 2, 0, 0},
        /* H = I = 1024: at M=1 the decode FC1 and the shared FC1 split K over 8 warps (top-8:
         * 8 slots x 128 m16 tiles, two per warp), the one-token FC2 runs 16 groups per warp;
         * grids of one wave with fewer blocks per SM than registers allow (shared memory
         * padded: the one-token FC2 and the shared FC1) */
        {"wide-HI", 1024, 8, 1024, SH_NVFP4, 1024, ms_wide, 2, k48, 2, 0, 0},
        {"tp8", 6144, 128, 384, SH_MXFP8, 384, ms_tp8, 4, k48, 2, 1, 0},
        {"tp8-large", 6144, 128, 384, SH_MXFP8, 384, ms_tp8_big, 3, k48, 2, 0, 1},
    };
    /* FP4MOE_GPU_TEST_SMALL=1 (for compute-sanitizer): tiny shapes and M <= 160 only. */
    const char *small = getenv("FP4MOE_GPU_TEST_SMALL"), *timing = getenv("FP4MOE_GPU_TIMING");
    const int is_small = small && *small && strcmp(small, "0");
    const int is_profile = timing && !strcmp(timing, "profile");
    if (is_small) {
        static const int ms_s[] = {1, 7, 64}, ms_s_tiny[] = {1, 7, 64, 136, 160};
        const shape_spec sm[] = {
            /* M=136 / 160: 68 / 80 rows per expert at top-4, sm90-wgmma's 80- and 96-token
             * tiles; 136 / 160 at top-8 (every expert has every token), the DEEP form with
             * 128 + 8 and 128 + 32 (tails, wg_tail: units of 144 and 160) */
            {"tiny", 256, 8, 128, SH_NVFP4, 128, ms_s_tiny, 5, k48, 2, 0, 0},
            {"tiny-bf16-shared", 256, 8, 192, SH_BF16, 256, ms_s + 1, 1, k8, 1, 0, 0},
            {"odd-H", 320, 16, 128, SH_NONE, 0, ms_s, 2, k_odd, 2, 0, 0},
            {"long-K", 1344, 16, 128, SH_NONE, 0, ms_long_k, 2, k48, 2, 0, 0},
            {"wide-I", 256, 8, 1024, SH_NVFP4, 1024, ms_wide, 2, k48, 2, 0, 0},
            {"wide-I, one-token FC2 split", 256, 8, 1024, SH_NVFP4, 1024, ms_one, 1, k12, 2, 0, 0},
            {"wide-HI", 1024, 8, 1024, SH_NVFP4, 1024, ms_wide, 2, k48, 2, 0, 0},
        };
        for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++) run_shape(&sm[i], s);
        run_forced(0, s);
    } else if (is_profile) {
        run_timing(1, s); /* for a profiler: one replay per point, no correctness cases */
    } else {
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run_shape(&shapes[i], s);
        run_forced(1, s);
        if (timing && *timing && strcmp(timing, "0")) run_timing(0, s);
    }
    run_reject_case();
    if (N_KERNELS == (int)(sizeof kernels / sizeof kernels[0]) && !is_profile) {
        int missing = 0;
        for (int f = 0; f < N_WG_KINDS; f++) {
            printf("sm90-wgmma %s token widths (expert tiles):", wg_kind[f]);
            for (int i = 0; i < N_WG_WIDTHS; i++) {
                printf(" n%d x%d", wg_widths[i], wg_seen[f][i]);
                /* small: a few M only */
                missing += (wg_need[f] >> i & 1) && !wg_seen[f][i] && !is_small;
            }
            printf("\n");
        }
        if (missing) {
            printf("FAIL sm90-wgmma coverage: %d required token widths never selected\n",
                   missing);
            n_fail++;
        }
    }
    CK(cudaStreamDestroy(s));
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#else /* !FP4MOE_WITH_CUDA */

int main(void)
{
    if (fp4_gpu_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    printf("0 passed, 1 failed\n"); /* unreachable: no device without CUDA */
    return 1;
}

#endif
