/*
 * test_oracle.c - the backend decision table (issue: the one decider). One row per case:
 * device, requested backend, the layer's schemes and activation, and the expected backend,
 * precision, dropped metadata or exact error. Rows for checkpoints without A4 metadata
 * pin the choice made before activation-metadata handling existed (first W4A16 backend).
 */
#include <stdio.h>
#include <string.h>

#include "gpu_moe.h"
#include "oracle.h"

#include "check.h"



/* An A4 backend that supports static scales only (the scenario's failing kind). */
static const fp4_backend a4_static_only = {
    .name = "a4-static",
    .summary = "test: quantizes activations, static scales only",
    .cc_min = 90, .cc_max = 90,
    .weights = FP4_BIT(FP4_W_NVFP4),
    .a4 = FP4_BIT(FP4_A_NVFP4_STATIC),
    .acts = FP4_BIT(FP4_ACT_SILU) | FP4_BIT(FP4_ACT_SWIGLUOAI),
    .clamps = 1,
};

/* A W4A16 backend that cannot clamp SwiGLU. */
static const fp4_backend no_clamp = {
    .name = "no-clamp",
    .cc_min = 80, .cc_max = 129,
    .weights = FP4_BIT(FP4_W_NVFP4),
    .a16 = 1,
    .acts = FP4_BIT(FP4_ACT_SILU) | FP4_BIT(FP4_ACT_SWIGLUOAI),
    .clamps = 0,
};

typedef struct row {
    const char *dev;        /* --device-arch */
    const char *req;        /* requested backend */
    fp4_wscheme w;
    fp4_ascheme a1, a2;     /* FC1, FC2 activation schemes */
    float limit;
    int test_registry;      /* 1: product registry + the test-only backends */
    /* expectations */
    fp4moe_status st;
    const char *backend, *precision, *dropped, *error;
} row;

static const row rows[] = {
    /* The scenario: SM90 + auto + per-token FC1 -> W4A16 (the SM90 backend first), dropped. */
    {"sm90", "auto", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "w4a16-sm90", "W4A16",
     "nvfp4-per-token activation scales (FC1)", NULL},
    /* Each explicit W4A16 backend, and its alias, + per-token -> that backend, dropped. */
    {"sm90", "w4a16-mma", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "w4a16-mma", "W4A16",
     "nvfp4-per-token activation scales (FC1)", NULL},
    {"sm90", "marlin", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NVFP4_PER_TOKEN, 7.0f, 0, FP4MOE_OK, "w4a16-mma",
     "W4A16", "nvfp4-per-token activation scales (FC1, FC2)", NULL},
    {"sm90", "w4a16-sm90", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "w4a16-sm90",
     "W4A16", "nvfp4-per-token activation scales (FC1)", NULL},
    {"sm90", "humming", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "w4a16-sm90",
     "W4A16", "nvfp4-per-token activation scales (FC1)", NULL},
    /* SM90 + auto + static A4 checkpoint -> W4A16, input scales dropped. */
    {"sm90", "auto", FP4_W_NVFP4, FP4_A_NVFP4_STATIC, FP4_A_NVFP4_STATIC, 7.0f, 0, FP4MOE_OK, "w4a16-sm90", "W4A16",
     "nvfp4-static activation scales (FC1, FC2)", NULL},
    /* SM90 + emulation + per-token -> A4 per-token emulated, nothing dropped. */
    {"sm90", "emulation", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "emulation",
     "W4A4-emulated", "", NULL},
    {"sm90", "emulation", FP4_W_NVFP4, FP4_A_NVFP4_STATIC, FP4_A_NVFP4_STATIC, 7.0f, 0, FP4MOE_OK, "emulation",
     "W4A4-emulated", "", NULL},
    /* SM90 + emulation + A16-only checkpoint -> runs A16 as declared (documented outcome). */
    {"sm90", "emulation", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "emulation", "W4A16-emulated",
     "", NULL},
    /* An A4 backend without per-token support + per-token -> the exact error. */
    {"sm90", "a4-static", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE, 7.0f, 1, FP4MOE_ERR_NOT_SUPPORTED, NULL,
     NULL, NULL,
     "backend 'a4-static' cannot run layer 3 (nvfp4/fc1 nvfp4-per-token, fc2 none): it quantizes activations to "
     "NVFP4 and does not support nvfp4-per-token activation scales (declared for FC1)"},
    /* ... and the same backend serves a static checkpoint. */
    {"sm90", "a4-static", FP4_W_NVFP4, FP4_A_NVFP4_STATIC, FP4_A_NVFP4_STATIC, 7.0f, 1, FP4MOE_OK, "a4-static",
     "W4A4-emulated", "", NULL},
    /* CPU-only + auto -> reference (A16, so declared metadata is dropped and said). */
    {"cpu", "auto", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "reference", "reference", "", NULL},
    {"cpu", "auto", FP4_W_NVFP4, FP4_A_NVFP4_PER_TOKEN, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "reference", "reference",
     "nvfp4-per-token activation scales (FC1)", NULL},
    /* A GPU backend on a CPU-only machine: exact error, no fallback. */
    {"cpu", "w4a16-mma", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_ERR_NOT_SUPPORTED, NULL, NULL, NULL,
     "backend 'w4a16-mma' cannot run layer 3 (nvfp4/none): it needs a CUDA device (sm80-sm129) and the device is cpu"},
    /* SM80 -> the portable W4A16 backend, never an SM90-only one. */
    {"sm80", "auto", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "w4a16-mma", "W4A16", "", NULL},
    {"sm80", "w4a16-sm90", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_ERR_NOT_SUPPORTED, NULL, NULL, NULL,
     "backend 'w4a16-sm90' cannot run layer 3 (nvfp4/none): it runs on sm90-sm90 and the device is sm80"},
    {"sm100", "humming", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_ERR_NOT_SUPPORTED, NULL, NULL, NULL,
     "backend 'w4a16-sm90' cannot run layer 3 (nvfp4/none): it runs on sm90-sm90 and the device is sm100"},
    {"sm80", "a4-static", FP4_W_NVFP4, FP4_A_NVFP4_STATIC, FP4_A_NVFP4_STATIC, 7.0f, 1, FP4MOE_ERR_NOT_SUPPORTED,
     NULL, NULL, NULL,
     "backend 'a4-static' cannot run layer 3 (nvfp4/nvfp4-static): it runs on sm90-sm90 and the device is sm80"},
    /* A model with a SwiGLU limit + a backend that cannot clamp -> rejected with that reason. */
    {"sm90", "no-clamp", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 1, FP4MOE_ERR_NOT_SUPPORTED, NULL, NULL, NULL,
     "backend 'no-clamp' cannot run layer 3 (nvfp4/none): it cannot apply the SwiGLU clamp (swiglu_limit 7) the "
     "model declares"},
    {"sm90", "no-clamp", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 0.0f, 1, FP4MOE_OK, "no-clamp", "W4A16", "", NULL},
    /* Unknown names list the valid ones. */
    {"sm90", "nonsense", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_ERR_INVALID_ARGUMENT, NULL, NULL, NULL,
     "unknown backend 'nonsense'; valid backends: auto, reference, emulation, w4a16-mma (alias marlin), "
     "w4a16-sm90 (alias humming)"},
    /* Configurations without activation metadata choose what they chose before: the fastest
     * W4A16 backend of the device. */
    {"sm90", "auto", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "w4a16-sm90", "W4A16", "", NULL},
    {"sm89", "auto", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 0.0f, 0, FP4MOE_OK, "w4a16-mma", "W4A16", "", NULL},
    {"sm100", "auto", FP4_W_NVFP4, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "w4a16-mma", "W4A16", "", NULL},
    /* Experts a GPU backend does not take: auto walks on to the reference; explicit fails. */
    {"sm90", "auto", FP4_W_MXFP8, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_OK, "reference", "reference", "", NULL},
    {"sm90", "w4a16-mma", FP4_W_MXFP8, FP4_A_NONE, FP4_A_NONE, 7.0f, 0, FP4MOE_ERR_NOT_SUPPORTED, NULL, NULL, NULL,
     "backend 'w4a16-mma' cannot run layer 3 (mxfp8/none): it does not take mxfp8 expert weights"},
};

int main(void)
{
    int np;
    const fp4_backend *const *prod = fp4_backend_registry(&np);
    const fp4_backend *test_reg[16];
    int nt = 0;
    for (int i = 0; i < np; i++)
        test_reg[nt++] = prod[i];
    test_reg[nt++] = &a4_static_only;
    test_reg[nt++] = &no_clamp;

    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row *r = &rows[i];
        fp4_err e = {0};
        fp4_device dev;
        CHECK(fp4_device_resolve(r->dev, &dev, &e) == FP4MOE_OK, "row %zu: device '%s': %s", i, r->dev, e.msg);
        fp4_layer_need need = {3, {r->w, r->a1}, {r->w, r->a2}, FP4_ACT_SWIGLUOAI, r->limit};
        fp4_decision d;
        fp4moe_status st = fp4_oracle_select(r->test_registry ? test_reg : NULL, r->test_registry ? nt : 0, &dev,
                                             r->req, &need, &d, &e);
        CHECK(st == r->st, "row %zu (%s, %s, a %s/%s): status %s, expected %s (%s)", i, r->dev, r->req,
              fp4_ascheme_name(r->a1), fp4_ascheme_name(r->a2), fp4moe_status_string(st),
              fp4moe_status_string(r->st), e.msg);
        if (st != r->st)
            continue;
        if (st == FP4MOE_OK) {
            CHECK(!strcmp(d.backend->name, r->backend), "row %zu (%s, %s): backend %s, expected %s", i, r->dev,
                  r->req, d.backend->name, r->backend);
            CHECK(!strcmp(d.precision, r->precision), "row %zu (%s, %s): precision %s, expected %s", i, r->dev,
                  r->req, d.precision, r->precision);
            CHECK(!strcmp(d.dropped, r->dropped), "row %zu (%s, %s): dropped '%s', expected '%s'", i, r->dev,
                  r->req, d.dropped, r->dropped);
        } else {
            CHECK(!strcmp(e.msg, r->error), "row %zu (%s, %s):\n  error    '%s'\n  expected '%s'", i, r->dev,
                  r->req, e.msg, r->error);
        }
    }

    /* auto with nothing that serves lists every backend of the priority list with its reason. */
    {
        fp4_err e = {0};
        fp4_device dev;
        fp4_device_resolve("cpu", &dev, &e);
        fp4_layer_need need = {5, {FP4_W_NVFP4, FP4_A_NONE}, {FP4_W_NVFP4, FP4_A_NONE}, (fp4_act)7, 0.0f};
        fp4_decision d;
        fp4moe_status st = fp4_oracle_select(NULL, 0, &dev, "auto", &need, &d, &e);
        CHECK(st == FP4MOE_ERR_NOT_SUPPORTED && strstr(e.msg, "no backend can run layer 5") &&
                  strstr(e.msg, "reference: it does not implement"),
              "auto with no serving backend: %s", e.msg);
    }
    /* Unknown device arch. */
    {
        fp4_err e = {0};
        fp4_device dev;
        CHECK(fp4_device_resolve("sm75x", &dev, &e) == FP4MOE_ERR_INVALID_ARGUMENT && strstr(e.msg, "'sm75x'") &&
                  strstr(e.msg, "sm90"),
              "bad --device-arch: %s", e.msg);
    }
    /* Selection by size inside the decider: tokens per expert = ceil(M k / E). */
    {
        const fp4_backend *sm90 = fp4_backend_lookup(prod, np, "w4a16-sm90");
        const fp4_backend *mma = fp4_backend_lookup(prod, np, "w4a16-mma");
        const fp4_backend *ref = fp4_backend_lookup(prod, np, "reference");
        CHECK(fp4_oracle_kernel(sm90, 1, 8, 128) == FP4_GPU_K_DECODE, "sm90 M=1 top-8: decode");
        CHECK(fp4_oracle_kernel(sm90, 128, 8, 128) == FP4_GPU_K_DECODE, "sm90 M=128 top-8 (8/expert): decode");
        CHECK(fp4_oracle_kernel(sm90, 144, 8, 128) == FP4_GPU_K_DECODE, "sm90 M=144 top-8 (9/expert): decode");
        CHECK(fp4_oracle_kernel(sm90, 145, 8, 128) == FP4_GPU_K_SM90_WGMMA, "sm90 M=145 top-8 (10/expert): wgmma");
        CHECK(fp4_oracle_kernel(sm90, 288, 4, 128) == FP4_GPU_K_DECODE, "sm90 M=288 top-4 (9/expert): decode");
        CHECK(fp4_oracle_kernel(sm90, 320, 4, 128) == FP4_GPU_K_SM90_WGMMA, "sm90 M=320 top-4 (10/expert): wgmma");
        CHECK(fp4_oracle_kernel(sm90, 192, 8, 128) == FP4_GPU_K_SM90_WGMMA, "sm90 M=192 top-8 (12/expert): wgmma");
        CHECK(fp4_oracle_kernel(sm90, 320, 8, 128) == FP4_GPU_K_SM90_WGMMA, "sm90 M=320 top-8 (20/expert): wgmma");
        CHECK(fp4_oracle_kernel(sm90, 512, 8, 128) == FP4_GPU_K_SM90_WGMMA, "sm90 M=512 top-8 (32/expert): wgmma");
        CHECK(fp4_oracle_kernel(sm90, 4096, 8, 128) == FP4_GPU_K_SM90_WGMMA, "sm90 M=4096: wgmma");
        CHECK(fp4_oracle_kernel(mma, 256, 8, 128) == FP4_GPU_K_DECODE, "mma M=256 top-8 (16/expert): decode");
        CHECK(fp4_oracle_kernel(mma, 448, 8, 128) == FP4_GPU_K_DECODE, "mma M=448 top-8 (28/expert): decode");
        CHECK(fp4_oracle_kernel(mma, 449, 8, 128) == FP4_GPU_K_MMA, "mma M=449 top-8 (29/expert): mma");
        CHECK(fp4_oracle_kernel(mma, 512, 8, 128) == FP4_GPU_K_MMA, "mma M=512 top-8 (32/expert): mma");
        CHECK(fp4_oracle_kernel(ref, 1, 8, 128) == -1, "reference has no GPU kernel");
    }
    /* Workspace size is part of each descriptor: GPU backends need device scratch that grows
     * with the tokens; CPU backends none. */
    {
        fp4_arch A;
        memset(&A, 0, sizeof A);
        A.hidden = 6144, A.n_experts = 128, A.moe_intermediate = 384, A.topk = 8, A.shared_intermediate = 384;
        for (int i = 0; i < np; i++) {
            const fp4_backend *b = prod[i];
            if (!b->gpu) {
                CHECK(b->workspace == NULL, "%s: CPU backend with a device workspace", b->name);
                continue;
            }
            CHECK(b->workspace != NULL, "%s: GPU backend without a workspace query", b->name);
#ifdef FP4MOE_WITH_CUDA
            size_t w1 = b->workspace(&A, 1), w2 = b->workspace(&A, 4096);
            /* 4096 tokens x top-8 x 6144 x bf16 per-(token, slot) FC2 rows alone are 403 MB. */
            CHECK(w1 > 0 && w2 > w1 && w2 >= (size_t)4096 * 8 * 6144 * 2, "%s: workspace %zu (1 token), %zu (4096)",
                  b->name, w1, w2);
#endif
        }
    }
    /* Aliases resolve to the canonical descriptor. */
    CHECK(fp4_backend_lookup(prod, np, "marlin") == fp4_backend_lookup(prod, np, "w4a16-mma"), "alias marlin");

    return check_done();
}
