/*
 * cmd_check.c - `fp4moe check`: run backends against the CPU reference (fp64 accumulation)
 * on fresh random bf16-representable inputs and report, per backend, the relative error
 * ||out - ref|| / ||ref||, the share of routing decisions that agree, and PASS/FAIL.
 *
 * Tolerances (documented in the README):
 *   reference (fp32)             1e-4   fp32 accumulation against fp64
 *   W4A16 GPU backends           1e-2   BF16 activations between FC1 and FC2 (expect ~3e-3)
 *   emulation (A4 declared)      0.25   reported for measurement: NVFP4 activations cost
 *                                       ~5-15%; the bound only catches gross errors
 *   emulation (nothing declared) 1e-4   it computes the reference in fp32
 * Routing must agree on at least 99% of (token, slot) decisions (ties may differ).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.h"
#include "cli.h"
#include "layer_run.h"
#include "oracle.h"
#include "ref/moe_ref.h"

static const char *usage_text =
    "usage: fp4moe check DIR [--layer L|--all] [--tokens M] [--moe-backend NAME|--all-backends]\n"
    "                    [--routing uniform|skewed] [--seed S] [--layers N] [--device-arch ARCH]\n"
    "default: the first MoE layer, 64 tokens, the backend auto selects, uniform routing, a fresh seed.\n";

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float gauss(uint64_t *s)
{
    double u1 = ((double)(mix(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(mix(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Inputs: N(0,1), for "skewed" pushed toward the router rows of experts 0..3 so the load is
 * uneven; rounded to bf16 (the activations W4A16 kernels see). */
static void make_input(const fp4_moe_weights *w, int H, int m, int skewed, uint64_t seed, float *x)
{
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)m * (size_t)H; i++)
        x[i] = gauss(&s);
    if (skewed && w && w->router) {
        int hot = w->n_experts < 4 ? w->n_experts : 4;
        for (int j = 0; j < hot; j++) {
            const float *r = w->router + (size_t)j * (size_t)H;
            double nn = 0;
            for (int h = 0; h < H; h++)
                nn += (double)r[h] * r[h];
            float c = (float)(4.0 / sqrt(nn > 0 ? nn : 1));
            for (int t = 0; t < m; t++)
                if ((t + j) % 2 == 0 || j == 0)
                    for (int h = 0; h < H; h++)
                        x[(size_t)t * H + h] += c * r[h];
        }
    }
    for (size_t i = 0; i < (size_t)m * (size_t)H; i++)
        x[i] = fp4moe_bf16_to_float(fp4moe_bf16_from_float(x[i]));
}

static double rel_err(const float *y, const float *ref, size_t n, int *nonfinite)
{
    double num = 0, den = 0;
    *nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(y[i]))
            (*nonfinite)++;
        double d = (double)y[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double routing_agree(const int32_t *a, const int32_t *b, int m, int k)
{
    size_t agree = 0;
    for (int t = 0; t < m; t++)
        for (int i = 0; i < k; i++)
            for (int j = 0; j < k; j++)
                if (a[(size_t)t * k + i] == b[(size_t)t * k + j]) {
                    agree++;
                    break;
                }
    return (double)agree / ((double)m * k);
}

static double tolerance(const fp4_decision *d)
{
    if (!d->backend->on_cpu)
        return 1e-2;
    if (!strcmp(d->precision, "W4A4-emulated"))
        return 0.25;
    return 1e-4;
}

/* Check one layer: returns the number of failures (or -1 on a hard error, printed). */
static int check_layer(fp4_ckpt *c, const fp4_device *dev, int L, int m, const char *backend,
                       int all_backends, int skewed, uint64_t seed)
{
    fp4_err e = {0};
    const fp4_arch *A = &c->arch;
    int H = A->hidden, k = A->topk, fails = 0;
    fp4_layer_runner ref;
    if (fp4_layer_runner_init(&ref, c, dev, "reference", L, &e)) {
        fp4_layer_runner_free(&ref);
        return cli_error("check", &e), -1;
    }
    size_t n = (size_t)m * (size_t)H;
    float *x = malloc(n * sizeof *x), *yr = malloc(n * sizeof *yr), *y = malloc(n * sizeof *y);
    int32_t *idr = malloc((size_t)m * k * sizeof *idr), *id = malloc((size_t)m * k * sizeof *id);
    float *wr = malloc((size_t)m * k * sizeof *wr), *wt = malloc((size_t)m * k * sizeof *wt);
    if (!x || !yr || !y || !idr || !id || !wr || !wt) {
        fprintf(stderr, "fp4moe check: out of memory for %d tokens\n", m);
        fails = -1;
        goto out;
    }
    make_input(ref.is_moe ? &ref.moe : NULL, H, m, skewed, seed + (uint64_t)L, x);
    fp4_ref_opts o64 = {0, 1};
    if ((ref.is_moe ? fp4_ref_moe_forward(A, &ref.moe, x, m, &o64, yr, idr, wr, &e)
                    : fp4_ref_dense_forward(A, &ref.dense, x, m, &o64, yr, &e))) {
        fails = -1;
        cli_error("check", &e);
        goto out;
    }
    /* Backends to run: every registered one (--all-backends, MoE layers), else the one asked
     * for (NULL: auto). Dense layers always run on the reference. */
    int nb;
    const fp4_backend *const *reg = fp4_backend_registry(&nb);
    int runs = all_backends && ref.is_moe ? nb : 1;
    for (int b = 0; b < runs; b++) {
        const char *name = all_backends && ref.is_moe ? reg[b]->name : ref.is_moe ? backend : NULL;
        fp4_layer_runner r;
        fp4_err be = {0};
        if (fp4_layer_runner_init(&r, c, dev, ref.is_moe ? name : NULL, L, &be)) {
            fp4_layer_runner_free(&r);
            if (all_backends && be.status == FP4MOE_ERR_NOT_SUPPORTED) {
                printf("layer %-3d %-12s SKIP: %s\n", L, name, be.msg);
                continue;
            }
            printf("layer %-3d %-12s FAIL: %s\n", L, name ? name : "auto", be.msg);
            fails++;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            y[i] = NAN; /* poison: every element must be written */
        if (fp4_layer_runner_forward(&r, A, x, m, y, r.is_moe ? id : NULL, r.is_moe ? wt : NULL, &be)) {
            printf("layer %-3d %-12s FAIL: %s\n", L, r.is_moe ? r.decision.backend->name : "reference", be.msg);
            fp4_layer_runner_free(&r);
            fails++;
            continue;
        }
        int nonfinite;
        double err = rel_err(y, yr, n, &nonfinite);
        double agree = r.is_moe ? routing_agree(id, idr, m, k) : 1.0;
        double tol = r.is_moe ? tolerance(&r.decision) : 1e-4;
        int pass = nonfinite == 0 && err < tol && agree >= 0.99;
        printf("layer %-3d %-12s %-15s tokens %-5d rel_err %.3e (tol %.2g) routing %6.2f%% %s%s%s\n", L,
               r.is_moe ? r.decision.backend->name : "reference", r.is_moe ? r.decision.precision : "dense fp32",
               m, err, tol, 100.0 * agree, pass ? "PASS" : "FAIL",
               r.is_moe && r.decision.dropped[0] ? "  dropped: " : "", r.is_moe ? r.decision.dropped : "");
        if (nonfinite)
            printf("          %d non-finite outputs\n", nonfinite);
        fails += !pass;
        fp4_layer_runner_free(&r);
    }
out:
    fp4_layer_runner_free(&ref);
    free(x);
    free(yr);
    free(y);
    free(idr);
    free(id);
    free(wr);
    free(wt);
    return fails;
}

int cmd_check(int argc, char **argv)
{
    const char *dir = NULL, *arch = NULL, *backend = NULL;
    long layer = -1, tokens = 64, layers = 0;
    int all = 0, all_backends = 0, skewed = 0;
    uint64_t seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--all")) {
            all = 1;
        } else if (!strcmp(a, "--all-backends")) {
            all_backends = 1;
        } else if (!strcmp(a, "--layer")) {
            if (!(val = cli_value("check", argc, argv, &i)) || !cli_int("check", a, val, 0, 100000, &layer))
                return CLI_USAGE;
        } else if (!strcmp(a, "--layers")) {
            if (!(val = cli_value("check", argc, argv, &i)) || !cli_int("check", a, val, 1, 100000, &layers))
                return CLI_USAGE;
        } else if (!strcmp(a, "--tokens")) {
            if (!(val = cli_value("check", argc, argv, &i)) || !cli_int("check", a, val, 1, 1 << 20, &tokens))
                return CLI_USAGE;
        } else if (!strcmp(a, "--seed")) {
            if (!(val = cli_value("check", argc, argv, &i)) || !cli_u64("check", a, val, &seed))
                return CLI_USAGE;
        } else if (!strcmp(a, "--routing")) {
            if (!(val = cli_value("check", argc, argv, &i)))
                return CLI_USAGE;
            if (!strcmp(val, "skewed")) skewed = 1;
            else if (strcmp(val, "uniform")) {
                fprintf(stderr, "fp4moe check: --routing: expected uniform or skewed, found '%s'\n", val);
                return CLI_USAGE;
            }
        } else if (!strcmp(a, "--moe-backend")) {
            if (!(backend = cli_value("check", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--device-arch")) {
            if (!(arch = cli_value("check", argc, argv, &i)))
                return CLI_USAGE;
        } else if (a[0] == '-') {
            fprintf(stderr, "fp4moe check: unknown option '%s'\n%s", a, usage_text);
            return CLI_USAGE;
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "fp4moe check: unexpected argument '%s'\n", a);
            return CLI_USAGE;
        }
    }
    if (!dir) {
        fprintf(stderr, "fp4moe check: expected a model directory\n%s", usage_text);
        return CLI_USAGE;
    }
    if (backend && all_backends) {
        fprintf(stderr, "fp4moe check: --moe-backend and --all-backends exclude each other\n");
        return CLI_USAGE;
    }
    if (all && layer >= 0) {
        fprintf(stderr, "fp4moe check: --layer and --all exclude each other\n");
        return CLI_USAGE;
    }
    fp4_err e = {0};
    fp4_device dev;
    if (fp4_device_resolve(arch, &dev, &e))
        return cli_error("check", &e), CLI_USAGE;
    fp4_ckpt *c = NULL;
    if (fp4_ckpt_open(dir, (int)layers, &c, &e))
        return cli_error("check", &e);
    if (layer >= c->n_layers) {
        fprintf(stderr, "fp4moe check: --layer %ld: expected 0..%d for '%s'\n", layer, c->n_layers - 1, dir);
        fp4_ckpt_close(c);
        return CLI_USAGE;
    }
    if (layer < 0 && !all) {
        for (int L = 0; L < c->n_layers && layer < 0; L++)
            if (c->arch.is_moe[L])
                layer = L;
        if (layer < 0)
            layer = 0;
    }
    printf("check %s on %s, seed %llu, routing %s\n", dir, dev.name, (unsigned long long)seed,
           skewed ? "skewed" : "uniform");
    int fails = 0;
    for (int L = all ? 0 : (int)layer; L < (all ? c->n_layers : (int)layer + 1); L++) {
        int f = check_layer(c, &dev, L, (int)tokens, backend, all_backends, skewed, seed);
        if (f < 0) {
            fp4_ckpt_close(c);
            return CLI_FAIL;
        }
        fails += f;
    }
    fp4_ckpt_close(c);
    printf("%s\n", fails ? "check FAILED" : "check passed");
    return fails ? CLI_FAIL : CLI_OK;
}
