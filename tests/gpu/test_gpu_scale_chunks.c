/*
 * test_gpu_scale_chunks.c - scale chunks: where a K slice's block scales are 16-byte aligned
 * in the scale array, the decode GEMM (fp4_dec_set_scale_chunks: K-split launches, a row's
 * scales 4 groups per copy) and the sm90-wgmma gated GEMM's bodies below 128 tokens
 * (fp4_sm90_wgmma_set_scale_chunks: 16 bytes a row per 4 K tiles, past L1) copy them in
 * chunks; their output must equal the per-group / per-K-tile copies' bit for bit, since the
 * same scale words reach the same instructions. Each case runs one launch twice on the same
 * random weights, scales and activations (switch on, then off) and compares the outputs byte
 * for byte; it also checks that every row that has a token was written (no poison left),
 * that the output is not all zeros, and that the launcher ran the chunked kernel exactly
 * when it should, and the DEEP form at 100 rows per expert (fp4_dec_last_scale_chunks,
 * fp4_sm90_wgmma_last_launch). A failed sm90-wgmma init on an sm_90 device fails.
 * Decode: gated (FC1) and plain (FC2), 8-token slots at KS 8 with one and two m16 tiles per
 * warp, and KS 2 (the launcher's bound lowered to 0) with 8-, 16- and 32-token slots (the
 * last 32-token slot running 4, 3, 2 or 1 of its n8 tiles), at K = 2048, 6144 and 8192
 * (aligned at KS 8 and 2; 8192: the one-tile kernel's 3 scale slots reused) and K = 1536 and
 * 3072 (24 and 48 groups: per-group copies at KS 8, chunks at KS 2); an empty slot (expert
 * -1) and a last slot whose last rows have no token. Compared: the rows that hold a token.
 * sm90-wgmma (sm_90 devices only): gated, K = 256, 2048 and 6144, two slot tables that run
 * every body of the kernel (128, 96, 80 tokens as pairs of one expert's slots; 64, 48, 32, 24
 * and 16 alone), n = 128 (two column tiles), at 40 rows per expert (below WG_DEEP_ROWS) and
 * 100 (the DEEP kernel, whose bodies below 128 tokens take the chunks too), and at 100 a
 * third table of pairs with an expert's tail (144 and 160 tokens), and with fold (args.fold:
 * the rows times powers of two, so the output must be the run without fold's times them, bit
 * for bit). Plain (FC2, bf16 out): with fold over the activations times 2^7 against the run
 * without fold (which multiplies by 2^7 at the end), the res kernels' K loop unrolled at k =
 * 384 (fp4_sm90_wgmma_set_k_unroll, fold only) against the run-time loop, the same two tables
 * at 20, 40, 48, 64 and 100 rows per expert (every res body, the BIG kernel), n = 1664 (13
 * column tiles: CTAs of 12 + 1 and 4 + 4 + 4 + 1), and n = 576 and k = 256, where the run-time
 * loop must run both times; k = 448 runs the strips and the one-tile kernel. fp4_mma_gemm
 * must refuse fold.
 * Also the shallow weight ring (fp4_dec_set_shallow_ring) of the KS 8 cases, forced on (one
 * tile a warp: half the ring; two: 4 stages with a shorter lead): the same bytes as the deep
 * ring's; and every case with the unrolled K loops off (fp4_dec_set_ng), which K = 6144 and
 * 3072 at KS 8 and K = 384 at KS 1 (8- and 16-token slots, two tiles a warp) take: the same
 * bytes, and the launcher reports the unrolled kernel exactly there.
 * The values themselves are checked against the CPU reference by test_gpu_moe (its tp8 and
 * tiny shapes take the chunks).
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
#include "cuda/sm90_w4a16_wgmma.cuh"
#include "cuda/w4a16_decode.cuh"

#define N_EXPERTS 4
#define N_SLOTS 4

typedef struct dec_case {
    int gated, k, tile_t, rt2, ks2; /* ks2: the KS 2 bound lowered to 0 */
    int gap;                        /* rows of the last slot without a token */
} dec_case;

static uint16_t rand_bf16(uint64_t *s)
{
    /* sign, exponent 2^-3 .. 2^0, 7 mantissa bits: moderate values, no NaN or infinity */
    const uint32_t r = check_next32(s);
    return (uint16_t)(((r & 1) << 15) | ((124 + (r >> 1) % 4) << 7) | ((r >> 8) & 0x7f));
}

/* A device copy of n bytes at h. */
static void *to_dev(const void *h, size_t n)
{
    void *d;
    CK(cudaMalloc(&d, n));
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

/* Random inputs of both GEMMs on the device: codes and packed scales of N_EXPERTS experts of
 * wrows x k, and a_rows activation rows of k. */
typedef struct gemm_inputs {
    uint8_t *wq, *ws;
    uint16_t *a;
} gemm_inputs;

static gemm_inputs make_inputs(int wrows, int k, int a_rows, uint64_t *seed)
{
    const size_t nq = (size_t)N_EXPERTS * wrows * (k / 2), ns = (size_t)N_EXPERTS * wrows * (k / 16);
    const size_t na = (size_t)a_rows * k;
    uint8_t *wq = malloc(nq), *ws = malloc(ns);
    uint16_t *a = malloc(na * 2);
    for (size_t i = 0; i < nq; i++) wq[i] = (uint8_t)check_next32(seed);
    /* packed e5m3 scale codes (src/gpu_pack.h) of 2^-4 .. 2^1, some zero */
    for (size_t i = 0; i < ns; i++) {
        const uint32_t r = check_next32(seed);
        ws[i] = r % 16 == 0 ? 0 : (uint8_t)(((6 + (r >> 4) % 6) << 3) | ((r >> 8) & 7));
    }
    for (size_t i = 0; i < na; i++) a[i] = rand_bf16(seed);
    gemm_inputs in = {to_dev(wq, nq), to_dev(ws, ns), to_dev(a, na * 2)};
    free(wq), free(ws), free(a);
    return in;
}

static void free_inputs(gemm_inputs *in)
{
    cudaFree(in->wq), cudaFree(in->ws), cudaFree(in->a);
}

static void run_case(const dec_case *c, uint64_t *seed)
{
    const int n = 64, k = c->k, wrows = c->gated ? 2 * n : n, tt = c->tile_t;
    const int rows = N_SLOTS * tt, a_rows = rows - c->gap; /* the last slot's last rows: none */
    const size_t out_bytes = (size_t)rows * n * (c->gated ? 2 : 4);
    uint8_t *o1 = malloc(out_bytes), *o0 = malloc(out_bytes);
    gemm_inputs in = make_inputs(wrows, k, a_rows, seed);
    const int32_t te[N_SLOTS] = {2, 0, -1, 3};
    int32_t *d_te = to_dev(te, sizeof te);
    uint8_t *d_out;
    CK(cudaMalloc((void **)&d_out, out_bytes));

    fp4_dec_gemm_args p;
    memset(&p, 0, sizeof p);
    p.wfmt = FP4_DEC_W_NVFP4, p.gated = c->gated, p.n = n, p.k = k, p.n_slots = N_SLOTS;
    p.a = in.a, p.a_rows = a_rows, p.tile_expert = d_te, p.out_rows = rows;
    p.wq = in.wq, p.ws = in.ws, p.out = d_out, p.tiles_per_warp = c->rt2 ? 2 : 1, p.tile_t = tt;

    const int old_ks2 = fp4_dec_set_ks2_per_sm(c->ks2 ? 0 : 24);
    const int old_sh = fp4_dec_set_shallow_ring(2); /* the deep ring: the rule stays out */
    uint8_t *res[2] = {o0, o1};
    for (int on = 1; on >= 0; on--) {
        fp4_dec_set_scale_chunks(on);
        CK(cudaMemset(d_out, on ? 0x7b : 0x5c, out_bytes)); /* different poison per run */
        CK(fp4_dec_gemm(&p, 0));
        /* the kernel that ran: chunks when on where a K slice is whole passes of 4 groups
         * (K = 1536 and 3072 at KS 8 are not: 24 and 48 groups), none at short K (KS 1) */
        const int kss = tt == 8 && !c->ks2 ? 8 : 2;
        const int want = on && k >= 1024 && (k / 64) % (4 * kss) == 0;
        CHECK(fp4_dec_last_scale_chunks() == want,
              "decode %s k %d tile_t %d ks2 %d, switch %d: scale chunks %s, expected %s",
              c->gated ? "gated" : "plain", k, tt, c->ks2, on,
              fp4_dec_last_scale_chunks() ? "ran" : "did not run", want ? "ran" : "not");
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(res[on], d_out, out_bytes, cudaMemcpyDeviceToHost));
    }
    fp4_dec_set_scale_chunks(1);
    fp4_dec_set_ks2_per_sm(old_ks2);
    /* KS 8 (one or two m16 tiles a warp): the shallow ring too (scale chunks on), whose
     * output must be the deep ring's bit for bit */
    const size_t row_bytes = (size_t)n * (c->gated ? 2 : 4);
    long long sh_diff = -1;
    if (tt == 8 && !c->ks2 && k >= 1024) { /* (short K runs at KS 1: no shallow form) */
        uint8_t *o2 = malloc(out_bytes);
        fp4_dec_set_shallow_ring(1);
        CK(cudaMemset(d_out, 0x7b, out_bytes));
        CK(fp4_dec_gemm(&p, 0));
        CHECK(fp4_dec_last_shallow() == 1, "decode %s k %d rt %d: the shallow ring did not run "
              "when forced", c->gated ? "gated" : "plain", k, c->rt2 ? 2 : 1);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(o2, d_out, out_bytes, cudaMemcpyDeviceToHost));
        sh_diff = 0;
        for (int r = 0; r < a_rows; r++)
            if (r / tt != 2)
                for (size_t b = 0; b < row_bytes; b++)
                    sh_diff += o2[r * row_bytes + b] != o1[r * row_bytes + b];
        free(o2);
    }
    fp4_dec_set_shallow_ring(old_sh);
    /* unrolled K loops (fp4_dec_set_ng): the RT 2 kernels whose warps run 6 (KS 1 at K = 384,
     * KS 8 at K = 3072) or 12 (KS 8, K = 6144) groups, against the run-time loop; elsewhere
     * both runs take the same kernel, and the launcher must report none */
    const int want_ng = !c->rt2 || tt == 32 ? 0
                        : k == 384                   ? 6
                        : tt == 8 && !c->ks2         ? (k == 6144 ? 12 : k == 3072 ? 6 : 0)
                                                     : 0;
    uint8_t *ng_out[2] = {malloc(out_bytes), malloc(out_bytes)};
    fp4_dec_set_ks2_per_sm(c->ks2 ? 0 : 24);
    for (int on = 1; on >= 0; on--) {
        fp4_dec_set_ng(on);
        CK(cudaMemset(d_out, on ? 0x7b : 0x5c, out_bytes));
        CK(fp4_dec_gemm(&p, 0));
        CHECK(fp4_dec_last_ng() == (on ? want_ng : 0), "decode %s k %d tile_t %d rt %d, switch %d: "
              "unrolled K loop of %d groups ran, expected %d", c->gated ? "gated" : "plain", k, tt,
              c->rt2 ? 2 : 1, on, fp4_dec_last_ng(), on ? want_ng : 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ng_out[on], d_out, out_bytes, cudaMemcpyDeviceToHost));
    }
    fp4_dec_set_ng(1);
    fp4_dec_set_ks2_per_sm(old_ks2);
    long long ng_diff = 0;
    for (int r = 0; r < a_rows; r++)
        if (r / tt != 2)
            for (size_t b = 0; b < row_bytes; b++)
                ng_diff += ng_out[1][r * row_bytes + b] != ng_out[0][r * row_bytes + b];
    free(ng_out[0]), free(ng_out[1]);

    /* the rows that hold a token, outside the empty slot (2): written by both runs (a
     * 32-token slot runs only its n8 tiles that hold tokens, so rows past them are not) */
    long long diff = 0, poison = 0, nonzero = 0, first = -1, written = 0;
    for (int r = 0; r < a_rows; r++) {
        if (r / tt == 2) continue;
        written += (long long)row_bytes;
        for (size_t b = 0; b < row_bytes; b++) {
            const size_t i = r * row_bytes + b;
            if (o1[i] != o0[i]) {
                diff++;
                if (first < 0) first = (long long)i;
            }
            poison += o1[i] == 0x7b;
            nonzero += o1[i] != 0;
        }
    }
    const char *what = c->gated ? "gated" : "plain";
    CHECK(diff == 0, "%s k %d, %d-token slots%s%s: %lld bytes differ with scale chunks off, first %lld",
          what, k, tt, c->rt2 ? ", 2 tiles a warp" : "", c->ks2 ? ", KS 2" : "", diff, first);
    /* a poison byte can be a real output byte now and then; a row left unwritten is 100s */
    CHECK(poison < written / 64, "%s k %d, %d-token slots: %lld of %lld output bytes still poisoned",
          what, k, tt, poison, written);
    CHECK(nonzero > written / 2, "%s k %d, %d-token slots: only %lld of %lld output bytes non-zero",
          what, k, tt, nonzero, written);
    CHECK(sh_diff <= 0, "%s k %d, 8-token slots%s: %lld bytes differ with the shallow ring",
          what, k, c->rt2 ? ", 2 tiles a warp" : "", sh_diff);
    CHECK(ng_diff == 0, "%s k %d, %d-token slots%s: %lld bytes differ with the unrolled K loop off",
          what, k, tt, c->rt2 ? ", 2 tiles a warp" : "", ng_diff);
    printf("%s k %d, %d-token slots%s%s, last slot %d rows: %lld bytes equal%s%s\n", what, k, tt,
           c->rt2 ? ", 2 tiles a warp" : "", c->ks2 ? ", KS 2" : "", tt - c->gap, written,
           sh_diff == 0 ? " (and with the shallow ring)" : "",
           want_ng ? " (and with the K loop unrolled)" : "");

    free_inputs(&in), cudaFree(d_te), cudaFree(d_out);
    free(o1), free(o0);
}

/* bf16 bits times 2^e, exactly (normal values and zeros: the test's outputs) */
static uint16_t bf16_times_pow2(uint16_t b, int e)
{
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    f = ldexpf(f, e);
    uint32_t r;
    memcpy(&r, &f, 4);
    return (uint16_t)(r >> 16);
}

/* sm90-wgmma, 8 slots of 64 padded rows (4 units of two slots), n output columns (gated: n
 * gate and n up rows). rows[s]: the rows in use of slot s (a prefix), expert[s] its expert
 * (-1: none); a unit's two slots hold one expert or the second none, as fp4_moe_group's align 2
 * makes them. Gated: scale chunks on, then off; then on with fold (args.fold: each row times
 * row_w x fold_gscale x 2^7, here a power of two per row: 2^-3 .. 2^4), whose output must be
 * the first run's times that power bit for bit (rounding to bf16 commutes with it). Plain
 * (bf16 out, FC2): first without fold (the K loop unrolled on: it must not run), then with
 * fold over the activations times 2^7 (exact in bf16), so every sum is the first run's times
 * 2^7 and must round to the same bf16 (the run without fold multiplies by 2^7 at the end, the
 * one with fold by nothing). With fold, the res kernels' K loop unrolled
 * (fp4_sm90_wgmma_set_k_unroll) on, then off; it must run exactly at k = 384, n % 128 == 0,
 * where the res or BIG kernels serve (rows per expert up to FP4_WG_RES_ROWS or above
 * FP4_WG_BIG_ROWS). The three runs' outputs must be equal bit for bit. */
static void run_wgmma_case(int gated, int k, int n, int rpe, const int *rows,
                           const int32_t *expert, const char *name, uint64_t *seed)
{
    enum { SLOTS = 8 };
    const int wrows = gated ? 2 * n : n, prows = SLOTS * 64, a_rows = 200;
    const size_t out_elems = (size_t)prows * n;
    uint16_t *o1 = malloc(out_elems * 2), *o0 = malloc(out_elems * 2), *of = malloc(out_elems * 2);
    gemm_inputs in = make_inputs(wrows, k, a_rows, seed);
    /* plain with fold: the activations times 2^7 (every one a normal bf16: exponent + 7) */
    uint16_t *d_a128 = NULL;
    if (!gated) {
        uint16_t *h = malloc((size_t)a_rows * k * 2);
        CK(cudaMemcpy(h, in.a, (size_t)a_rows * k * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < (size_t)a_rows * k; i++) h[i] = (uint16_t)(h[i] + (7 << 7));
        d_a128 = to_dev(h, (size_t)a_rows * k * 2);
        free(h);
    }
    /* gated with fold: row r's multiplier row_w[r] x fold_gscale[e] x 2^7 = 2^(r % 5 + e - 3) */
    float row_w[SLOTS * 64], fgs[N_EXPERTS];
    for (int r = 0; r < SLOTS * 64; r++) row_w[r] = ldexpf(1.f, r % 5 - 9);
    for (int e = 0; e < N_EXPERTS; e++) fgs[e] = ldexpf(1.f, e - 1);
    float *d_row_w = to_dev(row_w, sizeof row_w), *d_fgs = to_dev(fgs, sizeof fgs);
    int32_t rsrc[SLOTS * 64];
    for (int r = 0; r < prows; r++)
        rsrc[r] = r % 64 < rows[r / 64] ? (int32_t)(check_next32(seed) % a_rows) : -1;
    int32_t *d_te = to_dev(expert, SLOTS * sizeof(int32_t)), *d_rsrc = to_dev(rsrc, sizeof rsrc);
    uint16_t *d_out;
    CK(cudaMalloc((void **)&d_out, out_elems * 2));

    fp4_mma_gemm_args p;
    memset(&p, 0, sizeof p);
    p.wfmt = FP4_MMA_W_NVFP4, p.gated = gated, p.n = n, p.k = k, p.n_tiles_m = SLOTS;
    p.a = in.a, p.a_rows = a_rows, p.tile_expert = d_te, p.row_src = d_rsrc, p.out_rows = prows;
    p.wq = in.wq, p.ws = in.ws, p.out = d_out, p.rows_per_expert = rpe; /* DEEP above the bound */
    p.out_bf16 = !gated; /* plain: every padded row r < out_rows written (row_dst NULL) */
    const int res = k <= FP4_WG_RES_K && (rpe <= FP4_WG_RES_ROWS || rpe > FP4_WG_BIG_ROWS);
    const int want_nk = !gated && res && k == 384 && n % 128 == 0;
    const char *what = gated ? "scale chunks" : "the K loop unrolled";
    /* run 2 (gated: chunks on, into o1; plain: no fold, into of), 1 (gated: chunks off, o0;
     * plain: fold, unrolled on, o1), 0 (gated: chunks on, fold, of; plain: fold, unrolled
     * off, o0) */
    uint16_t *out[3] = {gated ? of : o0, gated ? o0 : o1, gated ? o1 : of};
    for (int run = 2; run >= 0; run--) {
        const int on = gated ? run != 1 : run != 0, fold = gated ? run == 0 : run < 2;
        if (gated) fp4_sm90_wgmma_set_scale_chunks(on);
        else fp4_sm90_wgmma_set_k_unroll(on);
        p.fold = fold;
        p.row_w = fold && gated ? d_row_w : NULL, p.fold_gscale = fold && gated ? d_fgs : NULL;
        p.a = fold && !gated ? d_a128 : in.a;
        CK(cudaMemset(d_out, 0x7b, out_elems * 2)); /* bf16 0x7b7b: 1.3e36, never an output */
        CK(fp4_sm90_wgmma_gemm(&p, 0));
        /* the kernel that ran: chunks when on (gated); DEEP above FP4_WG_DEEP_ROWS rows per
         * expert (gated); the unrolled K loop when on with fold where it serves (plain) */
        const int ran = fp4_sm90_wgmma_last_launch();
        const int sc = gated && on, deep = gated && rpe > FP4_WG_DEEP_ROWS,
                  nk = want_nk && on && fold;
        CHECK(!!(ran & FP4_WG_RAN_SC) == sc && !!(ran & FP4_WG_RAN_DEEP) == deep &&
                  !!(ran & FP4_WG_RAN_NK) == nk,
              "sm90-wgmma %s k %d n %d rpe %d, switch %d fold %d: ran scale chunks %d DEEP %d "
              "unrolled K %d, expected %d %d %d", gated ? "gated" : "plain", k, n, rpe, on, fold,
              !!(ran & FP4_WG_RAN_SC), !!(ran & FP4_WG_RAN_DEEP), !!(ran & FP4_WG_RAN_NK), sc,
              deep, nk);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(out[run], d_out, out_elems * 2, cudaMemcpyDeviceToHost));
    }
    fp4_sm90_wgmma_set_scale_chunks(1);
    fp4_sm90_wgmma_set_k_unroll(1);
    /* fp4_mma_gemm (mma.sync) serves these arguments, but not with fold */
    p.fold = 0, p.a = in.a, p.row_w = NULL, p.fold_gscale = NULL;
    CHECK(fp4_mma_gemm(&p, 0) == cudaSuccess, "fp4_mma_gemm refused the sm90-wgmma case's args");
    p.fold = 1;
    CHECK(fp4_mma_gemm(&p, 0) == cudaErrorInvalidValue, "fp4_mma_gemm took args.fold");
    CK(cudaDeviceSynchronize());

    /* o0 against o1; the fold run (of) against o1 (gated: times its row's power of two,
     * except where o1 holds the poison: rows past a tile's token width and the empty slots'
     * rows, which no run writes) */
    long long diff = 0, fdiff = 0, poison = 0, nonzero = 0, used = 0, first = -1, ffirst = -1;
    for (int r = 0; r < prows; r++)
        for (int c = 0; c < n; c++) {
            const size_t i = (size_t)r * n + c;
            if (o1[i] != o0[i]) {
                diff++;
                if (first < 0) first = (long long)i;
            }
            const int e = expert[r / 64];
            const uint16_t want = !gated || e < 0 || o1[i] == 0x7b7b
                                      ? o1[i]
                                      : bf16_times_pow2(o1[i], r % 5 + e - 3);
            if (of[i] != want) {
                fdiff++;
                if (ffirst < 0) ffirst = (long long)i;
            }
            if (rsrc[r] < 0) continue;
            used++;
            poison += o1[i] == 0x7b7b;
            nonzero += o1[i] != 0;
        }
    const char *kind = gated ? "gated" : "plain";
    CHECK(diff == 0, "sm90-wgmma %s k %d n %d rpe %d, %s: %lld values differ with %s off, first "
          "%lld", kind, k, n, rpe, name, diff, what, first);
    CHECK(fdiff == 0, "sm90-wgmma %s k %d n %d rpe %d, %s: %lld values differ with fold, first "
          "%lld", kind, k, n, rpe, name, fdiff, ffirst);
    CHECK(poison == 0, "sm90-wgmma %s k %d n %d rpe %d, %s: %lld of %lld values of rows in use "
          "unwritten", kind, k, n, rpe, name, poison, used);
    CHECK(nonzero > used / 2, "sm90-wgmma %s k %d n %d rpe %d, %s: only %lld of %lld values "
          "non-zero", kind, k, n, rpe, name, nonzero, used);
    printf("sm90-wgmma %s k %d n %d rpe %d, %s: %lld values equal (and with fold)%s\n", kind, k,
           n, rpe, name, (long long)out_elems, want_nk ? " (and with the K loop unrolled)" : "");

    free_inputs(&in), cudaFree(d_te), cudaFree(d_rsrc), cudaFree(d_out);
    cudaFree(d_a128), cudaFree(d_row_w), cudaFree(d_fgs);
    free(o1), free(o0), free(of);
}
#endif

int main(void)
{
    if (fp4_gpu_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
#ifdef FP4MOE_WITH_CUDA
    CK(fp4_dec_gemm_init());
    CK(fp4_mma_gemm_init());
    uint64_t seed = 0x5eed5ca1e5ull;
    /* K = 8192: 16 groups a K slice at KS 8, so the one-tile (RT 1) kernel's 3 scale slots
     * are reused; K = 3072: 6 groups a slice at KS 8 (the I = 3072 FC2: per-group scale
     * copies, the unrolled 6-group loop at two tiles a warp) */
    static const int ks[] = {2048, 6144, 1536, 8192, 3072};
    for (int g = 1; g >= 0; g--)
        for (int i = 0; i < 5; i++) {
            const dec_case cs[] = {
                {g, ks[i], 8, 0, 0, 3}, {g, ks[i], 8, 1, 0, 3}, /* KS 8 */
                {g, ks[i], 8, 1, 1, 3}, {g, ks[i], 16, 1, 0, 3}, /* KS 2 */
                /* 32-token slots whose last one runs 4, 3, 2 and 1 n8 tiles */
                {g, ks[i], 32, 1, 0, 3}, {g, ks[i], 32, 1, 0, 10}, {g, ks[i], 32, 1, 0, 20},
                {g, ks[i], 32, 1, 0, 26},
            };
            for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) run_case(&cs[c], &seed);
        }
    /* K = 384 (KS 1: the unrolled 6-group loop at 8 and 16 tokens, two tiles a warp; one tile
     * and 32-token slots keep the run-time loop) */
    for (int g = 1; g >= 0; g--) {
        const dec_case cs[] = {{g, 384, 8, 1, 0, 3}, {g, 384, 16, 1, 0, 3}, {g, 384, 8, 0, 0, 3},
                               {g, 384, 32, 1, 0, 10}};
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) run_case(&cs[c], &seed);
    }
    int ma = 0, mi = 0;
    fp4_gpu_device_cc(&ma, &mi);
    if (ma == 9 && mi == 0) {
        const cudaError_t err = fp4_sm90_wgmma_gemm_init();
        CHECK(err == cudaSuccess, "sm_90 device: fp4_sm90_wgmma_gemm_init failed: %s",
              cudaGetErrorString(err));
        /* pairs of 128 (64 + 40 rows), 96 (64 + 20), 80 (64 + 8) and 16 alone (10 rows) */
        static const int rows_a[8] = {64, 40, 64, 20, 10, 0, 64, 8};
        static const int32_t exp_a[8] = {1, 1, 0, 0, 2, -1, 3, 3};
        /* alone: 64, 48, 32 (30 rows), 24 (20 rows) */
        static const int rows_b[8] = {64, 0, 48, 0, 30, 0, 20, 0};
        static const int32_t exp_b[8] = {2, -1, 0, -1, 1, -1, 3, -1};
        /* DEEP only: pairs with an expert's tail, 144 (10 rows) and 160 (30 rows) tokens.
         * Those bodies copy chunks either way: this table checks that they write every row
         * in use, not the switch. */
        static const int rows_c[8] = {64, 64, 10, 0, 64, 64, 30, 0};
        static const int32_t exp_c[8] = {0, 0, 0, -1, 1, 1, 1, -1};
        static const int wk[] = {256, 2048, 6144};
        /* 40 rows per expert: the scale-chunk kernel; 100: the DEEP kernel, whose bodies
         * below 128 tokens take the chunks too (if the launcher's bound leaves that range,
         * the cases must move with it) */
        _Static_assert(40 <= FP4_WG_DEEP_ROWS && FP4_WG_DEEP_ROWS < 100,
                       "rpe 40 and 100 must sit on both sides of the DEEP bound");
        for (int i = 0; i < 3 && err == cudaSuccess; i++)
            for (int rpe = 40; rpe <= 100; rpe += 60) {
                run_wgmma_case(1, wk[i], 128, rpe, rows_a, exp_a, "128 / 96 / 80 / 16 tokens",
                               &seed);
                run_wgmma_case(1, wk[i], 128, rpe, rows_b, exp_b, "64 / 48 / 32 / 24 tokens",
                               &seed);
                if (rpe > FP4_WG_DEEP_ROWS)
                    run_wgmma_case(1, wk[i], 128, rpe, rows_c, exp_c, "144 / 160 tokens (tails)",
                                   &seed);
            }
        /* plain (FC2): the res kernels at 20 rows per expert (with the 16 / 24 bodies, 12
         * column tiles a CTA), 40 (12) and 48 (4), the BIG kernel at 64 and 100 (4; pairs as
         * 128 tokens). n = 1664: 13 column tiles, so groups of 12 + 1 and 4 + 4 + 4 + 1 (the
         * ring's last steps in a CTA of one column tile); n = 576 (a half tile) and k = 256
         * keep the run-time loop. k = 448 (past FP4_WG_RES_K): the strips (with fold, a
         * kernel of their own) up to 64, the one-tile kernel at 100 (never unrolled). */
        _Static_assert(20 <= FP4_WG_RES_SMALL && 48 <= FP4_WG_RES_ROWS &&
                           FP4_WG_RES_ROWS <= FP4_WG_BIG_ROWS && FP4_WG_BIG_ROWS < 64 &&
                           64 <= FP4_WG_STRIP_ROWS && FP4_WG_STRIP_ROWS < 100 &&
                           FP4_WG_RES_K == 384,
                       "the plain cases' rows per expert must sit in each form's range");
        static const int prpe[] = {20, 40, 48, 64, 100};
        static const int pk[][2] = {{384, 1664}, {384, 576}, {256, 1664}, {448, 1664}};
        for (int i = 0; i < 4 && err == cudaSuccess; i++)
            for (int j = 0; j < 5; j++) {
                run_wgmma_case(0, pk[i][0], pk[i][1], prpe[j], rows_a, exp_a,
                               "128 / 96 / 80 / 16 tokens", &seed);
                run_wgmma_case(0, pk[i][0], pk[i][1], prpe[j], rows_b, exp_b,
                               "64 / 48 / 32 / 24 tokens", &seed);
            }
    } else {
        printf("SKIP: sm90-wgmma needs an sm_90 GPU (this is sm_%d%d)\n", ma, mi);
    }
#endif
    return check_done();
}
