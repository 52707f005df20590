/*
 * test_gpu_route.c - the two GPU routers on inputs whose logits are exact, so that the expected
 * top-k is known bit for bit: the decode router with its grouping (fp4_dec_route_prep: logits
 * kernel + one top-k / grouping block) and the tensor-core router (fp4_moe_route, with either
 * logits kernel: mma.sync, or wgmma on sm_90 from some M on). Router row e is c_e u / 256 and
 * token t's x is a_t u (u a fixed +-1 vector of H = 256, 288 or 2048 entries), so every logit
 * is c_e a_t H / 256 exactly in fp32 on either path and any K split. c_e and the bias depend on
 * e mod 16 only, so exact ties are everywhere, between lanes and inside one (e, e + 32), and
 * must go to the lower id; a bias of -0.625 makes scores negative. Also: one expert's row holds
 * a NaN (never chosen); one token's x holds a NaN (every score NaN: expert 0, k times); NaN
 * biases on all but four experts, one of them -inf (chosen last; the missing choices take
 * expert 0 again, with a finite weight); E = 100 (lanes past E); k = 40 (> 32); softmax;
 * scaling with and without renormalization; 600-1500 tokens (the decode router stops at
 * FP4_DEC_ROUTE_MAX_M), where on sm_90 the wgmma logits kernel serves at H = 256 (token tiles
 * of 256 with a tail, 100, 128 and 256 experts; K split in 4) and at H = 2048 (K split in 32:
 * 600 tokens with 100 experts and 1024 tokens, 32 partials a token for the top-k kernel) and
 * the mma.sync one at H = 288 (not a multiple of 64); on an sm_90 device at least one case must
 * have run each. The reference ranks in double (the ties are exact there as well). The decode
 * router's slot table and rows are checked against a grouping rebuilt from the expected ids:
 * experts in id order, each in ceil(pairs / 8) slots of 8 rows, its rows exactly its pairs
 * (source token, pair index, the pair's weight bit for bit), in token order where no id
 * repeats, padded rows empty; and its paired x element by element against the pairing done here
 * (run_case's x has two values a row; run_paired_x gives every element its own bits, at 1-3
 * tokens and H 256-6144). Outputs are poisoned with non-NaN values first, so an unwritten entry
 * cannot pass as a NaN. One token has its own path in the decode router (slots by rank of the
 * chosen ids): ties, NaN scores and biases (exactly k numbers; fewer: the fallback to the
 * general grouping), softmax with k 40 (> 32: the general path), 100 and 256 experts; and the
 * same random token alone and twice must get the same ids and weights bit for bit
 * (run_one_token_bits). Up to 8 tokens the slots come from a bitmap of the chosen experts (2,
 * 3-7 and 8 tokens, k 40 among them; 9 tokens take the scan). The routers' sigmoid is compared
 * with the IEEE formula for every float, and route_select_warp with the rule done the plain way
 * by one thread on 6000 cases of coarse logits (ties everywhere), NaN logits and biases, k
 * 1-40, E 100-256, both scorings: ids and weights bit for bit (test_gpu_route_dev.cu).
 * Prints "SKIP: no CUDA device" and exits 0 without a device.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_moe.h"

#ifdef FP4MOE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_check.h"
#include "cuda/moe_route.cuh"
#include "cuda/w4a16_decode.cuh"

long long route_sigmoid_mismatches(unsigned *first_bad); /* test_gpu_route_dev.cu */
long long route_select_mismatches(int n_cases, unsigned *first_bad);

#define MAX_H 2048
#define W_TOL 1e-5 /* routing weights: fp32 expf on the GPU against double */

static int near_ties; /* distinct reference scores closer than 1e-5 (the inputs' fault) */

typedef struct route_case {
    const char *name;
    int m, e, k, scoring, norm_topk;
    float scaling;
    int nan_expert; /* its router row holds a NaN, or -1 */
    int nan_token;  /* its x holds a NaN, or -1 */
    int nan_bias;   /* 1: bias NaN except experts 0, 1, 2 and 5 (-inf) */
    int h;          /* hidden size: 256, 2048, or 288 (not a multiple of 64) */
} route_case;

static int ran_wgmma, ran_mma; /* cases whose tensor-core router ran each logits kernel */

/* Expected ids / w of one token by the routing rule, in double. */
static void ref_token(const route_case *c, const double *logit, const float *bias, int32_t *ids,
                      double *w)
{
    double p[256], sc[256], mx = -INFINITY, sum = 0.0;
    int taken[256] = {0};
    for (int e = 0; e < c->e; e++) mx = fmax(mx, logit[e]);
    for (int e = 0; e < c->e; e++) {
        p[e] = c->scoring ? exp(logit[e] - mx) : 1.0 / (1.0 + exp(-logit[e]));
        sum += p[e];
    }
    for (int e = 0; e < c->e; e++) {
        if (c->scoring) p[e] /= sum;
        sc[e] = p[e] + bias[e];
    }
    /* distinct scores must be far apart, so that fp32 on the GPU ranks them as double does */
    for (int a = 0; a < c->e; a++)
        for (int b = 0; b < a; b++)
            if (sc[a] != sc[b] && fabs(sc[a] - sc[b]) < 1e-5) near_ties++;
    double chosen = 0.0;
    for (int s = 0; s < c->k; s++) {
        int b = -1;
        for (int e = 0; e < c->e; e++) /* NaN compares false: never better */
            if (!taken[e] && (b < 0 ? sc[e] == sc[e] : sc[e] > sc[b])) b = e;
        if (b < 0) b = 0; /* every score NaN: expert 0 */
        taken[b] = 1;
        ids[s] = b;
        w[s] = p[b];
        chosen += p[b];
    }
    double f = c->norm_topk && chosen > 0.0 ? c->scaling / chosen : c->scaling;
    for (int s = 0; s < c->k; s++) w[s] *= f;
}

static int same_w(float got, double want)
{
    if (isnan(want)) return isnan(got);
    return fabs((double)got - want) <= W_TOL * fmax(1.0, fabs(want));
}

/* The first element of xp (n elements, whole rows) that is not x in the paired layout
 * (fp4_dec_pair_pos, the one the FC1 epilogue writes too), or -1 (its bits and the expected
 * ones in got / want). */
static long long paired_x_mismatch(const uint16_t *x, const uint16_t *xp, size_t n,
                                   unsigned *got, unsigned *want)
{
    *got = *want = 0;
    for (size_t b = 0; b < n; b += 64)
        for (int k = 0; k < 64; k++) {
            const size_t pos = b + (size_t)fp4_dec_pair_pos(k);
            if (xp[pos] != x[b + k]) {
                *got = xp[pos], *want = x[b + k];
                return (long long)pos;
            }
        }
    return -1;
}

static void run_case(const route_case *c, cudaStream_t st)
{
    const int m = c->m, E = c->e, k = c->k, pairs = m * k, H = c->h;
    const int dec = m <= FP4_DEC_ROUTE_MAX_M; /* the decode router takes this many tokens */
    const int n_slots = (pairs + FP4_DEC_TILE_T - 1) / FP4_DEC_TILE_T + E, rows = n_slots * 8;
    float *router = malloc((size_t)E * H * 4), *bias = malloc((size_t)E * 4);
    uint16_t *x = malloc((size_t)m * H * 2), *planes = malloc((size_t)3 * E * H * 2);
    double *logit = malloc((size_t)E * 8), *wref = malloc((size_t)pairs * 8);
    int32_t *idref = malloc((size_t)pairs * 4);
    int32_t *ids = malloc((size_t)pairs * 4), *te = malloc((size_t)n_slots * 4);
    int32_t *rsrc = malloc((size_t)rows * 4), *rdst = malloc((size_t)rows * 4);
    float *w = malloc((size_t)pairs * 4), *rw = malloc((size_t)rows * 4);
    double *cv = malloc((size_t)E * 8), *av = malloc((size_t)m * 8);
    signed char u[MAX_H];
    for (int i = 0; i < H; i++) u[i] = ((i * 7 + 3) % 5) < 2 ? -1 : 1;
    static const float b_set[] = {0.f, 0.125f, -0.625f};
    for (int e = 0; e < E; e++) { /* 16 classes by e mod 16: ties across and inside lanes */
        const int cls = (e * 5) % 16;
        cv[e] = (double)(cls - 8) / 16.0;
        bias[e] = b_set[cls % 3];
        if (c->nan_bias && e > 2) bias[e] = e == 5 ? -INFINITY : NAN;
        for (int i = 0; i < H; i++) router[(size_t)e * H + i] = (float)(cv[e] * u[i] / 256.0);
    }
    if (c->nan_expert >= 0) router[(size_t)c->nan_expert * H + 17] = NAN;
    static const double a_set[] = {1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, 1.5};
    for (int t = 0; t < m; t++) {
        av[t] = a_set[(t * 3 + 1) % 8];
        for (int i = 0; i < H; i++) /* exact in bf16 */
            x[(size_t)t * H + i] = fp4moe_bf16_from_float((float)(av[t] * u[i]));
        if (t == c->nan_token) x[(size_t)t * H + 5] = 0x7fc0;
    }
    for (int t = 0; t < m; t++) {
        for (int e = 0; e < E; e++) {
            logit[e] = cv[e] * av[t] * H / 256.0;
            if (e == c->nan_expert || t == c->nan_token) logit[e] = NAN;
        }
        ref_token(c, logit, bias, idref + (size_t)t * k, wref + (size_t)t * k);
    }
    CHECK(near_ties == 0, "%s: %d near ties in the reference scores (inputs to change)", c->name,
          near_ties);
    near_ties = 0;
    fp4_gpu_router_split(router, (size_t)E * H, planes);

    float *d_router, *d_bias, *d_logits, *d_w, *d_rw;
    uint16_t *d_x, *d_planes, *d_xp;
    int32_t *d_ids, *d_te, *d_rsrc, *d_rdst;
    void *d_scr;
    size_t scr = fp4_moe_route_scratch_bytes(m, E);
    CK(cudaMalloc((void **)&d_router, (size_t)E * H * 4));
    CK(cudaMalloc((void **)&d_bias, (size_t)E * 4));
    CK(cudaMalloc((void **)&d_logits, (size_t)m * E * 4));
    CK(cudaMalloc((void **)&d_w, (size_t)pairs * 4));
    CK(cudaMalloc((void **)&d_rw, (size_t)rows * 4));
    CK(cudaMalloc((void **)&d_x, (size_t)m * H * 2));
    CK(cudaMalloc((void **)&d_planes, (size_t)3 * E * H * 2));
    CK(cudaMalloc((void **)&d_xp, (size_t)m * H * 2));
    CK(cudaMalloc((void **)&d_ids, (size_t)pairs * 4));
    CK(cudaMalloc((void **)&d_te, (size_t)n_slots * 4));
    CK(cudaMalloc((void **)&d_rsrc, (size_t)rows * 4));
    CK(cudaMalloc((void **)&d_rdst, (size_t)rows * 4));
    CK(cudaMalloc(&d_scr, scr));
    CK(cudaMemcpy(d_router, router, (size_t)E * H * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_bias, bias, (size_t)E * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_x, x, (size_t)m * H * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_planes, planes, (size_t)3 * E * H * 2, cudaMemcpyHostToDevice));

    const int wg = fp4_moe_route_uses_wgmma(m, H);
    ran_wgmma += wg, ran_mma += !wg;
    for (int path = !dec; path < 2; path++) {
        const char *pn = path ? (wg ? "tensor-core router (wgmma logits)"
                                    : "tensor-core router (mma.sync logits)")
                              : "decode router";
        /* poison the outputs: every entry the kernels own must be written (on st: a non-
         * blocking stream does not wait for the legacy stream's cudaMemset) */
        CK(cudaMemsetAsync(d_ids, 0x7f, (size_t)pairs * 4, st)); /* 0x7f7f7f7f: no id, no NaN */
        CK(cudaMemsetAsync(d_w, 0x7f, (size_t)pairs * 4, st));
        CK(cudaMemsetAsync(d_te, 0x7f, (size_t)n_slots * 4, st));
        CK(cudaMemsetAsync(d_rsrc, 0x7f, (size_t)rows * 4, st));
        CK(cudaMemsetAsync(d_rdst, 0x7f, (size_t)rows * 4, st));
        CK(cudaMemsetAsync(d_rw, 0x7f, (size_t)rows * 4, st));
        CK(cudaMemsetAsync(d_xp, 0x7f, (size_t)m * H * 2, st));
        cudaError_t err =
            path ? fp4_moe_route(d_x, d_planes, d_bias, m, H, E, k, c->scoring, c->norm_topk,
                                 c->scaling, d_scr, scr, d_ids, d_w, st)
                 : fp4_dec_route_prep(d_x, d_router, d_bias, m, H, E, k, c->scoring,
                                      c->norm_topk, c->scaling, d_logits, d_ids, d_w, n_slots,
                                      d_te, d_rsrc, d_rdst, d_rw, d_xp, st);
        CHECK(err == cudaSuccess, "%s %s: launch %s", c->name, pn, cudaGetErrorString(err));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(ids, d_ids, (size_t)pairs * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(w, d_w, (size_t)pairs * 4, cudaMemcpyDeviceToHost));
        int bad_id = -1, bad_w = -1;
        for (int q = 0; q < pairs; q++) {
            if (bad_id < 0 && ids[q] != idref[q]) bad_id = q;
            if (bad_w < 0 && !same_w(w[q], wref[q])) bad_w = q;
        }
        CHECK(bad_id < 0, "%s %s: pair %d (token %d choice %d) id %d, expected %d", c->name, pn,
              bad_id, bad_id / k, bad_id % k, ids[bad_id < 0 ? 0 : bad_id],
              idref[bad_id < 0 ? 0 : bad_id]);
        CHECK(bad_w < 0, "%s %s: pair %d weight %.8g, expected %.8g", c->name, pn, bad_w,
              w[bad_w < 0 ? 0 : bad_w], wref[bad_w < 0 ? 0 : bad_w]);
        if (path) continue;

        /* the grouping, rebuilt from the expected ids */
        CK(cudaMemcpy(te, d_te, (size_t)n_slots * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(rsrc, d_rsrc, (size_t)rows * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(rdst, d_rdst, (size_t)rows * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(rw, d_rw, (size_t)rows * 4, cudaMemcpyDeviceToHost));
        /* per expert: its pairs in (token, pair) order; its segment's rows must be exactly
         * them, in that order unless an id repeats (then in any order: group_pairs) */
        int slot = 0, bad_slot = -1, bad_row = -1, repeats = 0;
        for (int q = 0; q < pairs; q++)
            for (int q2 = q - q % k; q2 < q; q2++) repeats += idref[q2] == idref[q];
        for (int e = 0; e < E; e++) {
            int cnt = 0, n = 0;
            const int r0 = slot * 8;
            for (int q = 0; q < pairs; q++) cnt += idref[q] == e;
            for (int q = 0; q < pairs; q++) {
                if (idref[q] != e) continue;
                int r = repeats ? -1 : r0 + n; /* the row that holds pair q */
                for (int x = r0; repeats && x < r0 + cnt; x++)
                    if (rdst[x] == q) r = x;
                if (bad_row < 0 && (r < 0 || rsrc[r] != q / k || rdst[r] != q ||
                                    memcmp(&rw[r], &w[q], 4)))
                    bad_row = r < 0 ? r0 + n : r;
                n++;
            }
            for (int r = r0 + cnt; r < r0 + (cnt + 7) / 8 * 8; r++)
                if (bad_row < 0 && (rsrc[r] != -1 || rdst[r] != -1 || rw[r] != 0.f)) bad_row = r;
            for (int i = 0; i < (cnt + 7) / 8; i++, slot++)
                if (bad_slot < 0 && te[slot] != e) bad_slot = slot;
        }
        for (int sl = slot; sl < n_slots; sl++) {
            if (bad_slot < 0 && te[sl] != -1) bad_slot = sl;
            for (int r = sl * 8; r < sl * 8 + 8; r++)
                if (bad_row < 0 && (rsrc[r] != -1 || rdst[r] != -1 || rw[r] != 0.f)) bad_row = r;
        }
        CHECK(bad_slot < 0, "%s %s: slot %d expert %d", c->name, pn, bad_slot,
              te[bad_slot < 0 ? 0 : bad_slot]);
        CHECK(bad_row < 0, "%s %s: row %d src %d dst %d w %g", c->name, pn, bad_row,
              rsrc[bad_row < 0 ? 0 : bad_row], rdst[bad_row < 0 ? 0 : bad_row],
              rw[bad_row < 0 ? 0 : bad_row]);
        /* the paired x (by the logits kernel) */
        uint16_t *xp = malloc((size_t)m * H * 2);
        CK(cudaMemcpy(xp, d_xp, (size_t)m * H * 2, cudaMemcpyDeviceToHost));
        unsigned got, want;
        const long long bad_xp = paired_x_mismatch(x, xp, (size_t)m * H, &got, &want);
        free(xp);
        CHECK(bad_xp < 0, "%s %s: paired x element %lld (token %lld) is 0x%04x, expected 0x%04x",
              c->name, pn, bad_xp, bad_xp / H, got, want);
    }
    printf("%s: m %d, E %d, k %d, H %d, %s%s; logits on %s%s\n", c->name, m, E, k, H,
           c->scoring ? "softmax" : "sigmoid", c->norm_topk ? ", renormalized" : "",
           wg ? "wgmma" : "mma.sync", dec ? "" : " (no decode router at this m)");

    cudaFree(d_router), cudaFree(d_bias), cudaFree(d_logits), cudaFree(d_w), cudaFree(d_rw);
    cudaFree(d_x), cudaFree(d_planes), cudaFree(d_xp), cudaFree(d_ids), cudaFree(d_te);
    cudaFree(d_rsrc), cudaFree(d_rdst), cudaFree(d_scr);
    free(router), free(bias), free(x), free(planes), free(logit), free(wref), free(idref);
    free(ids), free(te), free(rsrc), free(rdst), free(w), free(rw), free(cv), free(av);
}

/* The decode router's paired x (written by its logits kernel) with distinct bits in every
 * element: run_case's x repeats two values a row, so a swap inside a group can go unseen
 * there. One token at H 256, 512 and 6144, 2 and 3 tokens; element by element against the
 * pairing done here. Random router rows: any finite logits will do. */
static void run_paired_x(cudaStream_t st)
{
    static const struct { int m, h; } cs[] = {{1, 512}, {1, 6144}, {1, 256}, {2, 512}, {3, 1024}};
    enum { E = 128, K = 8 };
    uint64_t rng = 0x5eed0002u;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int m = cs[ci].m, H = cs[ci].h, n_slots = (m * K + 7) / 8 + E;
        const size_t nx = (size_t)m * H;
        uint16_t *x = malloc(nx * 2), *xp = malloc(nx * 2);
        float *router = malloc((size_t)E * H * 4);
        for (size_t i = 0; i < nx; i++) x[i] = (uint16_t)(0x3f80 + i % 1021); /* finite */
        for (size_t i = 0; i < (size_t)E * H; i++)
            router[i] = ((float)(check_next32(&rng) >> 8) / 16777216.f - 0.5f) * 0.01f;
        uint16_t *d_x, *d_xp;
        float *d_router, *d_logits, *d_w, *d_rw;
        int32_t *d_ids, *d_te, *d_rsrc, *d_rdst;
        CK(cudaMalloc((void **)&d_x, nx * 2));
        CK(cudaMalloc((void **)&d_xp, nx * 2));
        CK(cudaMalloc((void **)&d_router, (size_t)E * H * 4));
        CK(cudaMalloc((void **)&d_logits, (size_t)m * E * 4));
        CK(cudaMalloc((void **)&d_w, (size_t)m * K * 4));
        CK(cudaMalloc((void **)&d_ids, (size_t)m * K * 4));
        CK(cudaMalloc((void **)&d_te, (size_t)n_slots * 4));
        CK(cudaMalloc((void **)&d_rsrc, (size_t)n_slots * 8 * 4));
        CK(cudaMalloc((void **)&d_rdst, (size_t)n_slots * 8 * 4));
        CK(cudaMalloc((void **)&d_rw, (size_t)n_slots * 8 * 4));
        CK(cudaMemcpy(d_x, x, nx * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_router, router, (size_t)E * H * 4, cudaMemcpyHostToDevice));
        CK(cudaMemsetAsync(d_xp, 0x7f, nx * 2, st));
        cudaError_t err = fp4_dec_route_prep(d_x, d_router, NULL, m, H, E, K, 0, 1, 1.0f, d_logits,
                                             d_ids, d_w, n_slots, d_te, d_rsrc, d_rdst, d_rw,
                                             d_xp, st);
        CHECK(err == cudaSuccess, "paired x, m %d H %d: launch %s", m, H, cudaGetErrorString(err));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(xp, d_xp, nx * 2, cudaMemcpyDeviceToHost));
        unsigned got, want;
        const long long bad = paired_x_mismatch(x, xp, nx, &got, &want);
        CHECK(bad < 0, "paired x, m %d H %d: element %lld (token %lld) is 0x%04x, expected 0x%04x",
              m, H, bad, bad / H, got, want);
        if (bad < 0) printf("paired x: m %d, H %d, every element in place\n", m, H);
        cudaFree(d_x), cudaFree(d_xp), cudaFree(d_router), cudaFree(d_logits), cudaFree(d_w);
        cudaFree(d_ids), cudaFree(d_te), cudaFree(d_rsrc), cudaFree(d_rdst), cudaFree(d_rw);
        free(x), free(xp), free(router);
    }
}

/* One token takes its own path through the decode router, two tokens the few-token one:
 * the same token alone and twice must get the same ids and weights bit for bit. Random fp32
 * router rows and bf16 x (logits of any bits, not the exact ones of run_case), with experts
 * 5, 37 and E - 3 sharing one row and bias (exact key ties, to the lower id) and a scaled
 * copy of x as that row (large logits: sigmoid 1.0 for the three, with the largest bias:
 * chosen first). E = 256, 128 and 100; top-8, 4 and 6; with and without renormalization;
 * biases on and off. The logits of the two runs are compared first (a token's logits do not
 * depend on the batch). */
static void run_one_token_bits(cudaStream_t st)
{
    static const struct { int e, k, norm, bias, tie; float scaling; } cs[] = {
        {256, 8, 1, 1, 1, 2.5f}, {128, 8, 1, 1, 1, 2.5f}, {128, 4, 0, 1, 0, 1.0f},
        {100, 6, 1, 0, 1, 1.5f}, {128, 8, 1, 1, 0, 2.5f}, {256, 8, 0, 0, 0, 1.0f},
    };
    enum { H = 256 };
    uint64_t rng = 0x5eed0001u;
    int compared = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int E = cs[ci].e, k = cs[ci].k, n_slots = (2 * k + 7) / 8 + E; /* m = 2 */
        float *router = malloc((size_t)E * H * 4), bias[256];
        uint16_t x[2 * H];
        for (int i = 0; i < H; i++) {
            const float v = ((float)(check_next32(&rng) >> 8) / 16777216.f - 0.5f) * 4.f;
            x[i] = x[H + i] = fp4moe_bf16_from_float(v);
        }
        for (int e = 0; e < E; e++) {
            bias[e] = cs[ci].bias ? ((float)(check_next32(&rng) >> 8) / 16777216.f - 0.5f) : 0.f;
            for (int i = 0; i < H; i++)
                router[(size_t)e * H + i] =
                    ((float)(check_next32(&rng) >> 8) / 16777216.f - 0.5f) * 0.125f;
        }
        if (cs[ci].tie) {
            const int tied[3] = {5, 37, E - 3};
            for (int t = 0; t < 3; t++) {
                bias[tied[t]] = cs[ci].bias ? 0.5f : 0.f; /* above every other bias */
                for (int i = 0; i < H; i++)
                    router[(size_t)tied[t] * H + i] = fp4moe_bf16_to_float(x[i]) * 0.5f;
            }
        }
        float *d_router, *d_bias, *d_logits, *d_w, *d_rw;
        uint16_t *d_x, *d_xp;
        int32_t *d_ids, *d_te, *d_rsrc, *d_rdst;
        const int rows = n_slots * 8;
        CK(cudaMalloc((void **)&d_router, (size_t)E * H * 4));
        CK(cudaMalloc((void **)&d_bias, (size_t)E * 4));
        CK(cudaMalloc((void **)&d_logits, (size_t)2 * E * 4));
        CK(cudaMalloc((void **)&d_w, (size_t)2 * k * 4));
        CK(cudaMalloc((void **)&d_ids, (size_t)2 * k * 4));
        CK(cudaMalloc((void **)&d_x, (size_t)2 * H * 2));
        CK(cudaMalloc((void **)&d_xp, (size_t)2 * H * 2));
        CK(cudaMalloc((void **)&d_te, (size_t)n_slots * 4));
        CK(cudaMalloc((void **)&d_rsrc, (size_t)rows * 4));
        CK(cudaMalloc((void **)&d_rdst, (size_t)rows * 4));
        CK(cudaMalloc((void **)&d_rw, (size_t)rows * 4));
        CK(cudaMemcpy(d_router, router, (size_t)E * H * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_bias, bias, (size_t)E * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_x, x, sizeof x, cudaMemcpyHostToDevice));
        int32_t ids[2][2 * 32];
        float w[2][2 * 32], lg[2][2 * 256];
        for (int m = 1; m <= 2; m++) {
            CK(cudaMemsetAsync(d_ids, 0x7f, (size_t)2 * k * 4, st));
            CK(cudaMemsetAsync(d_w, 0x7f, (size_t)2 * k * 4, st));
            const int slots = (m * k + 7) / 8 + E; /* what the router takes at this m */
            cudaError_t err = fp4_dec_route_prep(d_x, d_router, cs[ci].bias ? d_bias : NULL, m, H,
                                                 E, k, 0, cs[ci].norm, cs[ci].scaling, d_logits,
                                                 d_ids, d_w, slots, d_te, d_rsrc, d_rdst, d_rw,
                                                 d_xp, st);
            CHECK(err == cudaSuccess, "one token bits E %d k %d m %d: launch %s", E, k, m,
                  cudaGetErrorString(err));
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(ids[m - 1], d_ids, (size_t)m * k * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(w[m - 1], d_w, (size_t)m * k * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(lg[m - 1], d_logits, (size_t)m * E * 4, cudaMemcpyDeviceToHost));
        }
        CHECK(!memcmp(lg[0], lg[1], (size_t)E * 4), "one token bits E %d k %d: token 0's logits "
              "differ between m = 1 and m = 2", E, k);
        CHECK(!memcmp(lg[1], lg[1] + E, (size_t)E * 4), "one token bits E %d k %d: the two "
              "copies of the token got different logits", E, k);
        for (int s = 0; s < k; s++) {
            CHECK(ids[0][s] == ids[1][s] && ids[1][s] == ids[1][k + s],
                  "one token bits E %d k %d: choice %d expert %d alone, %d / %d in two", E, k, s,
                  ids[0][s], ids[1][s], ids[1][k + s]);
            CHECK(!memcmp(&w[0][s], &w[1][s], 4) && !memcmp(&w[1][s], &w[1][k + s], 4),
                  "one token bits E %d k %d: choice %d weight %.9g alone, %.9g / %.9g in two",
                  E, k, s, w[0][s], w[1][s], w[1][k + s]);
            compared++;
        }
        if (cs[ci].tie) { /* the three tied experts lead, in id order */
            CHECK(ids[0][0] == 5 && ids[0][1] == 37 && ids[0][2] == E - 3,
                  "one token bits E %d k %d: choices %d %d %d, expected the tied 5 37 %d", E, k,
                  ids[0][0], ids[0][1], ids[0][2], E - 3);
        }
        cudaFree(d_router), cudaFree(d_bias), cudaFree(d_logits), cudaFree(d_w), cudaFree(d_ids);
        cudaFree(d_x), cudaFree(d_xp), cudaFree(d_te), cudaFree(d_rsrc), cudaFree(d_rdst);
        cudaFree(d_rw);
        free(router);
    }
    printf("one token alone against twice: %d choices, ids and weights bit for bit\n",
           compared);
}

/* The one-token FC2 (fp4_dec_gemm_args.one_token) refuses what it cannot run before it
 * launches anything: each case below is one field away from a valid call (which the
 * forward at M = 1 makes, test_gpu_moe). The pointers are never dereferenced. */
static void run_one_token_rejects(void)
{
    static char dummy[256] __attribute__((aligned(16)));
    fp4_dec_gemm_args ok;
    memset(&ok, 0, sizeof ok);
    ok.wfmt = FP4_DEC_W_NVFP4, ok.one_token = 1, ok.n = 256, ok.k = 128, ok.n_slots = 1;
    ok.a = (const uint16_t *)dummy, ok.a_rows = 64, ok.tile_expert = (const int32_t *)dummy;
    ok.row_dst = (const int32_t *)dummy, ok.row_w = (const float *)dummy;
    ok.wq = (const uint8_t *)dummy, ok.ws = (const uint8_t *)dummy, ok.out = dummy;
    static const char *what[] = {"gated", "BF16 weights", "2 slots", "72 table rows",
                                 "table rows not whole slots", "16-token slots", "no slot table",
                                 "no multipliers", "a row source table", "two tiles per warp",
                                 "no destination rows", "bf16 output"};
    for (int c = 0; c < (int)(sizeof what / sizeof what[0]); c++) {
        fp4_dec_gemm_args p = ok;
        switch (c) {
        case 0: p.gated = 1; break;
        case 1: p.wfmt = FP4_DEC_W_BF16, p.wb = (const uint16_t *)dummy; break;
        case 2: p.n_slots = 2; break;
        case 3: p.a_rows = 72; break;
        case 4: p.a_rows = 60; break;
        case 5: p.tile_t = 16; break;
        case 6: p.tile_expert = NULL; break;
        case 7: p.row_w = NULL; break;
        case 8: p.row_src = (const int32_t *)dummy; break;
        case 9: p.tiles_per_warp = 2; break;
        case 10: p.row_dst = NULL; break;
        case 11: p.out_bf16 = 1; break;
        }
        cudaError_t err = fp4_dec_gemm(&p, 0);
        CHECK(err == cudaErrorInvalidValue, "one-token FC2 with %s: launch returned %s", what[c],
              cudaGetErrorString(err));
    }
    printf("one-token FC2: %d invalid argument sets refused\n", (int)(sizeof what / sizeof what[0]));
}

/* A decode launch whose grid would need more than 65535 blocks in y is refused by the
 * launcher (cudaErrorInvalidValue) instead of failing at the launch: plain BF16 weights at
 * K / 64 >= 16 run KS 8, one m16 tile per block, so n = 16 x 65536 is one block too many
 * (the launcher's old bound assumed 8 tiles a block and let it through). Nothing launches. */
static void run_grid_rejects(void)
{
    static char dummy[256] __attribute__((aligned(16)));
    fp4_dec_gemm_args p;
    memset(&p, 0, sizeof p);
    p.wfmt = FP4_DEC_W_BF16, p.n = 16 * 65536, p.k = 1024, p.n_slots = 1, p.a_rows = 8;
    p.a = (const uint16_t *)dummy, p.wb = (const uint16_t *)dummy, p.out = dummy;
    cudaError_t err = fp4_dec_gemm(&p, 0);
    CHECK(err == cudaErrorInvalidValue, "decode launch of 65536 row blocks: returned %s",
          cudaGetErrorString(err));
    printf("decode launch of 65536 row blocks refused\n");
}
#endif

int main(void)
{
    if (fp4_gpu_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
#ifdef FP4MOE_WITH_CUDA
    static const route_case cases[] = {
        {"ties, one token", 1, 128, 8, 0, 1, 2.5f, -1, -1, 0, 256},
        {"one token, NaN expert, top-4", 1, 128, 4, 0, 0, 1.0f, 3, -1, 0, 256},
        {"one token, all NaN", 1, 128, 8, 0, 1, 1.0f, -1, 0, 0, 256},
        {"one token, NaN biases", 1, 128, 8, 0, 1, 2.5f, -1, -1, 1, 256},
        {"one token, NaN biases, top-4", 1, 128, 4, 0, 1, 2.5f, -1, -1, 1, 256},
        {"one token, NaN biases, top-5", 1, 128, 5, 0, 0, 1.0f, -1, -1, 1, 256},
        {"one token, 256 experts", 1, 256, 8, 0, 1, 2.5f, 40, -1, 0, 256},
        {"one token, 100 experts", 1, 100, 6, 0, 1, 1.0f, -1, -1, 0, 256},
        {"one token, softmax, k 32", 1, 64, 32, 1, 1, 1.5f, -1, -1, 0, 256},
        {"one token, softmax, k 40", 1, 64, 40, 1, 1, 1.5f, -1, -1, 0, 256},
        {"2 tokens", 2, 128, 8, 0, 1, 2.5f, -1, -1, 0, 256},
        {"8 tokens, top-4", 8, 128, 4, 0, 1, 1.0f, -1, -1, 0, 256},
        {"8 tokens, NaN expert", 8, 128, 8, 0, 1, 2.5f, 6, -1, 0, 256},
        {"ties, NaN expert", 7, 128, 8, 0, 0, 1.0f, 3, -1, 0, 256},
        {"NaN token", 5, 128, 8, 0, 1, 1.0f, -1, 2, 0, 256},
        {"NaN biases", 4, 128, 8, 0, 1, 2.5f, -1, -1, 1, 256},
        {"32 tokens", 32, 128, 8, 0, 1, 2.5f, 40, -1, 0, 256},
        {"64 tokens, top-4", 64, 128, 4, 0, 1, 1.0f, -1, -1, 0, 256},
        {"100 experts", 5, 100, 6, 0, 1, 1.0f, -1, -1, 0, 256},
        {"softmax, k 40", 3, 64, 40, 1, 1, 1.5f, -1, -1, 0, 256},
        {"softmax, k 40, no renormalization", 3, 64, 40, 1, 0, 1.5f, -1, -1, 0, 256},
        {"softmax, 256 experts", 9, 256, 8, 1, 1, 1.0f, -1, 4, 0, 256},
        {"1500 tokens, NaN expert and token", 1500, 128, 8, 0, 1, 2.5f, 40, 777, 0, 256},
        {"1100 tokens, 256 experts, softmax", 1100, 256, 8, 1, 1, 1.0f, -1, -1, 0, 256},
        {"1300 tokens, 100 experts, NaN biases", 1300, 100, 6, 0, 1, 2.5f, -1, -1, 1, 256},
        {"1500 tokens, H 288", 1500, 128, 8, 0, 1, 2.5f, -1, 3, 0, 288},
        {"1024 tokens, H 2048, NaN token", 1024, 128, 8, 0, 1, 2.5f, -1, 700, 0, 2048},
        {"600 tokens, H 2048, 100 experts", 600, 100, 8, 0, 1, 2.5f, 30, -1, 0, 2048},
    };
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(fp4_moe_route_init());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], st);
    run_one_token_bits(st);
    run_paired_x(st);
    run_one_token_rejects();
    run_grid_rejects();
    unsigned first_bad = 0;
    long long bad = route_sigmoid_mismatches(&first_bad);
    CHECK(bad == 0, "router sigmoid: %lld of 2^32 inputs differ from 1 / (1 + expf(-x)), first "
          "bit pattern 0x%08x", bad, first_bad);
    printf("router sigmoid: %lld of 2^32 inputs differ from the IEEE formula\n", bad);
    unsigned first_case = 0;
    const long long bad_sel = route_select_mismatches(6000, &first_case);
    CHECK(bad_sel == 0, "route_select_warp: %lld of 6000 cases differ from the plain rule, "
          "first case %u", bad_sel, first_case);
    printf("route_select_warp: %lld of 6000 cases differ from the plain rule (ties, NaN, k "
           "1-40, E 100-256, both scorings)\n", bad_sel);
    CK(cudaStreamDestroy(st));
    int major = 0, minor = 0;
    if (fp4_gpu_device_cc(&major, &minor) && major == 9 && minor == 0) {
        CHECK(ran_wgmma > 0, "sm_90: no case ran the wgmma logits kernel");
        CHECK(ran_mma > 0, "sm_90: no case ran the mma.sync logits kernel");
    }
#endif
    return check_done();
}
