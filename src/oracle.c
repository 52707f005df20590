/*
 * oracle.c - the backend registry and the one decider (see oracle.h for the rules).
 *
 * Backends:
 *   reference   CPU, exact: weights dequantized, activations fp32 (A16). Runs anywhere.
 *   emulation   CPU: executes the declared A4 scheme (static or per-token NVFP4 inputs), then
 *               fp32. On a layer that declares no A4 scheme it runs A16, as declared, and
 *               computes the same numbers as reference ("W4A16-emulated").
 *   w4a16-mma   CUDA SM80+: FP4 weights dequantized in registers, BF16 activations, mma.sync
 *               BF16 tensor cores (the Marlin design, hence the alias "marlin"). Kernel by
 *               size: "decode" (weights as the mma M operand, split K) up to 28 tokens per
 *               expert, where it measured faster than "mma" (64-token tiles); "mma" above
 *               (H200 as the proxy, 2026-11-29, sixth session, bench/problems_sm80.txt:
 *               16/expert decode 360 us vs mma 484, 24/expert 424 vs 502, 32/expert 536 vs
 *               520, top-4 32/expert 555 vs 529; straight lines cross near 30.6).
 *   w4a16-sm90  CUDA SM90 (sm_90a) only: "decode" up to 9 tokens per expert, then
 *               "sm90-wgmma" (wgmma with the weights dequantized into A registers), the
 *               design of the upstream engine's SM90 W4A16 MoE backend, hence "humming"
 *               (H200, 2026-11-29, decode FC1 with staged activations and 32-token slots
 *               that run only their filled n8 tiles: 14/expert decode 351 us vs wgmma 384,
 *               16/expert 366 vs 392, 32/expert 547 vs 461; straight lines between 16 and
 *               32 cross near 19.8. Sixth session, with the resident-token FC2: 18/expert
 *               373 vs 388, 20/expert 388 vs 393. Seventh session, one-mask packing and two
 *               stages per barrier: 14/expert 336.4 vs 339.5, 16/expert 347.2 vs 346.1 and
 *               top-4 353.1 vs 349.2, 18/expert 356.8 vs 352.7, 20/expert 370.2 vs 359.2.
 *               Ninth session, the next tile's codes read early and bf16 pair rows:
 *               12/expert 294.6 vs 316.8, 14/expert 332.7 vs 319.2; the lines cross near
 *               13.2. Thirty-first session, the codes in 8-row tiles (sm90-wgmma gained more
 *               than decode): 8/expert 219.6 vs 223.6 (top-4 222.8 vs 225.8), 9/expert 223.0
 *               vs 225.2 (226.8 vs 227.7), 10/expert 227.7 vs 226.1 (232.6 vs 229.9),
 *               11/expert 248.0 vs 228.5, 12/expert 252.2 vs 230.9).
 * Size bounds are measured (bench/NOTES.md) and live here only.
 */
#include "oracle.h"

#include <stdio.h>
#include <string.h>

#include "gpu_moe.h"

static const fp4_backend backend_reference = {
    .name = "reference",
    .summary = "CPU, dequantized weights, fp32 activations (exact reference)",
    .on_cpu = 1,
    .weights = FP4_BIT(FP4_W_NVFP4) | FP4_BIT(FP4_W_MXFP8) | FP4_BIT(FP4_W_BF16),
    .a16 = 1,
    .acts = FP4_BIT(FP4_ACT_SILU) | FP4_BIT(FP4_ACT_SWIGLUOAI),
    .clamps = 1,
    .load = "none: reads the checkpoint's mapped tensors and dequantizes per expert",
};

static const fp4_backend backend_emulation = {
    .name = "emulation",
    .summary = "CPU, executes the declared A4 activation scheme, then fp32",
    .on_cpu = 1,
    .weights = FP4_BIT(FP4_W_NVFP4) | FP4_BIT(FP4_W_MXFP8) | FP4_BIT(FP4_W_BF16),
    .a16 = 0,
    .a4 = FP4_BIT(FP4_A_NVFP4_STATIC) | FP4_BIT(FP4_A_NVFP4_PER_TOKEN),
    .a16_undeclared = 1,
    .acts = FP4_BIT(FP4_ACT_SILU) | FP4_BIT(FP4_ACT_SWIGLUOAI),
    .clamps = 1,
    .load = "none",
};

static const fp4_backend backend_w4a16_mma = {
    .name = "w4a16-mma",
    .aliases = {"marlin", NULL},
    .summary = "CUDA SM80+, FP4 dequantized in registers, BF16 mma.sync tensor cores",
    .cc_min = 80,
    .cc_max = 129,
    .weights = FP4_BIT(FP4_W_NVFP4),
    .a16 = 1,
    .acts = FP4_BIT(FP4_ACT_SILU) | FP4_BIT(FP4_ACT_SWIGLUOAI),
    .clamps = 1,
    .gpu = 1,
    .kernels = {{FP4_GPU_K_DECODE, 28}, {FP4_GPU_K_MMA, 0}},
    .n_kernels = 2,
    .workspace = fp4_gpu_moe_workspace_for,
    .load = "expert weights repacked to the kernel's tile layout and uploaded; shared expert to bf16",
};

static const fp4_backend backend_w4a16_sm90 = {
    .name = "w4a16-sm90",
    .aliases = {"humming", NULL},
    .summary = "CUDA SM90 (sm_90a), FP4 dequantized in registers, decode kernel then wgmma",
    .cc_min = 90,
    .cc_max = 90,
    .weights = FP4_BIT(FP4_W_NVFP4),
    .a16 = 1,
    .acts = FP4_BIT(FP4_ACT_SILU) | FP4_BIT(FP4_ACT_SWIGLUOAI),
    .clamps = 1,
    .gpu = 1,
    .kernels = {{FP4_GPU_K_DECODE, 9}, {FP4_GPU_K_SM90_WGMMA, 0}},
    .n_kernels = 2,
    .workspace = fp4_gpu_moe_workspace_for,
    .load = "the same device layout as w4a16-mma (one copy of the weights serves every kernel)",
};

static const fp4_backend *const registry[] = {&backend_reference, &backend_emulation,
                                              &backend_w4a16_mma, &backend_w4a16_sm90};

const fp4_backend *const *fp4_backend_registry(int *n)
{
    *n = (int)(sizeof registry / sizeof registry[0]);
    return registry;
}

/* Priority lists: the fastest backend that serves first. On SM90 the W4A16 GPU kernels come
 * before the CPU reference; the emulation is never chosen by "auto" (it is a measuring tool). */
static const char *const prio_cpu[] = {"reference"};
static const char *const prio_sm90[] = {"w4a16-sm90", "w4a16-mma", "reference"};
static const char *const prio_cuda[] = {"w4a16-mma", "reference"};

const char *const *fp4_oracle_priority(const fp4_device *dev, int *n)
{
    if (!dev->cuda) {
        *n = 1;
        return prio_cpu;
    }
    if (dev->cc == 90) {
        *n = 3;
        return prio_sm90;
    }
    *n = 2;
    return prio_cuda;
}

fp4moe_status fp4_device_resolve(const char *arch, fp4_device *out, fp4_err *e)
{
    static const struct { const char *name; int cc; } known[] = {
        {"cpu", 0}, {"sm80", 80}, {"sm86", 86}, {"sm89", 89}, {"sm90", 90}, {"sm100", 100}, {"sm120", 120}};
    memset(out, 0, sizeof *out);
    if (!arch || strcmp(arch, "auto") == 0) {
        int major = 0, minor = 0;
        if (fp4_gpu_device_cc(&major, &minor)) {
            out->cuda = 1;
            out->cc = major * 10 + minor;
            snprintf(out->name, sizeof out->name, "sm%d", out->cc);
        } else {
            snprintf(out->name, sizeof out->name, "cpu");
        }
        return FP4MOE_OK;
    }
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(arch, known[i].name) == 0) {
            out->cuda = known[i].cc > 0;
            out->cc = known[i].cc;
            snprintf(out->name, sizeof out->name, "%s", known[i].name);
            return FP4MOE_OK;
        }
    return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT,
                    "--device-arch '%s': expected one of auto, cpu, sm80, sm86, sm89, sm90, sm100, sm120",
                    arch);
}

const fp4_backend *fp4_backend_lookup(const fp4_backend *const *reg, int n, const char *name)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(reg[i]->name, name) == 0)
            return reg[i];
        for (int a = 0; a < 3 && reg[i]->aliases[a]; a++)
            if (strcmp(reg[i]->aliases[a], name) == 0)
                return reg[i];
    }
    return NULL;
}

void fp4_backend_list(const fp4_backend *const *reg, int n, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && o < len; i++) {
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", reg[i]->name);
        for (int a = 0; a < 3 && reg[i]->aliases[a] && o < len; a++)
            o += (size_t)snprintf(buf + o, len - o, " (alias %s)", reg[i]->aliases[a]);
    }
}

void fp4_layer_need_str(const fp4_layer_need *need, char *buf, size_t len)
{
    if (need->fc1.a == need->fc2.a && need->fc1.w == need->fc2.w)
        snprintf(buf, len, "%s/%s", fp4_wscheme_name(need->fc1.w), fp4_ascheme_name(need->fc1.a));
    else
        snprintf(buf, len, "%s/fc1 %s, fc2 %s", fp4_wscheme_name(need->fc1.w),
                 fp4_ascheme_name(need->fc1.a), fp4_ascheme_name(need->fc2.a));
}

void fp4_decision_note(const fp4_decision *d, const char *layers, char *buf, size_t len)
{
    if (!d->backend || !d->dropped[0]) {
        buf[0] = '\0';
        return;
    }
    snprintf(buf, len, "%s: backend %s runs %s (activations not quantized); dropped %s", layers,
             d->backend->name, d->precision, d->dropped);
}

int fp4_oracle_kernel(const fp4_backend *b, int m, int topk, int n_experts)
{
    if (!b->gpu || b->n_kernels < 1)
        return -1;
    long per_expert = ((long)m * topk + n_experts - 1) / (n_experts > 0 ? n_experts : 1);
    for (int i = 0; i < b->n_kernels; i++)
        if (b->kernels[i].max_tokens_per_expert == 0 || per_expert <= b->kernels[i].max_tokens_per_expert)
            return b->kernels[i].kernel;
    return b->kernels[b->n_kernels - 1].kernel;
}

void fp4_backend_kernels_str(const fp4_backend *b, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; b->gpu && i < b->n_kernels && o < len; i++) {
        const char *name = fp4_gpu_kernel_name((fp4_gpu_kernel)b->kernels[i].kernel);
        if (b->kernels[i].max_tokens_per_expert > 0)
            o += (size_t)snprintf(buf + o, len - o, "%s up to %d tokens/expert, then ", name,
                                  b->kernels[i].max_tokens_per_expert);
        else
            o += (size_t)snprintf(buf + o, len - o, "%s", name);
    }
}

static const char *act_name(fp4_act a)
{
    return a == FP4_ACT_SWIGLUOAI ? "swigluoai" : "silu";
}

int fp4_backend_serves(const fp4_backend *b, const fp4_device *dev, const fp4_layer_need *need,
                       char *reason, size_t len)
{
    if (!b->on_cpu) {
        if (!dev->cuda) {
            snprintf(reason, len, "it needs a CUDA device (sm%d-sm%d) and the device is cpu", b->cc_min, b->cc_max);
            return 0;
        }
        if (dev->cc < b->cc_min || dev->cc > b->cc_max) {
            snprintf(reason, len, "it runs on sm%d-sm%d and the device is %s", b->cc_min, b->cc_max, dev->name);
            return 0;
        }
    }
    const fp4_scheme *sides[2] = {&need->fc1, &need->fc2};
    for (int s = 0; s < 2; s++)
        if (!(b->weights & FP4_BIT(sides[s]->w))) {
            snprintf(reason, len, "it does not take %s expert weights", fp4_wscheme_name(sides[s]->w));
            return 0;
        }
    if (!(b->acts & FP4_BIT(need->act))) {
        snprintf(reason, len, "it does not implement the %s activation", act_name(need->act));
        return 0;
    }
    if (need->swiglu_limit > 0.0f && !b->clamps) {
        snprintf(reason, len, "it cannot apply the SwiGLU clamp (swiglu_limit %g) the model declares",
                 (double)need->swiglu_limit);
        return 0;
    }
    /* Activation precision: an A16 backend takes any declaration (it drops A4 metadata). An A4
     * backend must execute every declared scheme; with nothing declared it needs a16 too. */
    if (b->a16)
        return 1;
    for (int s = 0; s < 2; s++) {
        fp4_ascheme a = sides[s]->a;
        if (a == FP4_A_NONE && !b->a16_undeclared) {
            snprintf(reason, len, "it runs A4 only and %s declares no activation scales", s == 0 ? "FC1" : "FC2");
            return 0;
        }
        if (a != FP4_A_NONE && !(b->a4 & FP4_BIT(a))) {
            snprintf(reason, len, "it quantizes activations to NVFP4 and does not support %s activation scales (declared for %s)",
                     fp4_ascheme_name(a), s == 0 ? "FC1" : "FC2");
            return 0;
        }
    }
    return 1;
}

/* Fill precision and dropped for a backend that serves the layer. */
static void describe(const fp4_backend *b, const fp4_layer_need *need, fp4_decision *d)
{
    int declared = need->fc1.a != FP4_A_NONE || need->fc2.a != FP4_A_NONE;
    d->backend = b;
    d->dropped[0] = '\0';
    if (b->a16) {
        snprintf(d->precision, sizeof d->precision, "%s", b->on_cpu ? "reference" : "W4A16");
        if (!declared)
            return;
        if (need->fc1.a == need->fc2.a)
            snprintf(d->dropped, sizeof d->dropped, "%s activation scales (FC1, FC2)",
                     fp4_ascheme_name(need->fc1.a));
        else if (need->fc2.a == FP4_A_NONE)
            snprintf(d->dropped, sizeof d->dropped, "%s activation scales (FC1)", fp4_ascheme_name(need->fc1.a));
        else if (need->fc1.a == FP4_A_NONE)
            snprintf(d->dropped, sizeof d->dropped, "%s activation scales (FC2)", fp4_ascheme_name(need->fc2.a));
        else
            snprintf(d->dropped, sizeof d->dropped, "%s (FC1) and %s (FC2) activation scales",
                     fp4_ascheme_name(need->fc1.a), fp4_ascheme_name(need->fc2.a));
        return;
    }
    snprintf(d->precision, sizeof d->precision, "%s", declared ? "W4A4-emulated" : "W4A16-emulated");
}

fp4moe_status fp4_oracle_select(const fp4_backend *const *reg, int n, const fp4_device *dev,
                                const char *requested, const fp4_layer_need *need,
                                fp4_decision *out, fp4_err *e)
{
    char reason[256], scheme[96], names[512];
    memset(out, 0, sizeof *out);
    if (!reg)
        reg = fp4_backend_registry(&n);
    fp4_layer_need_str(need, scheme, sizeof scheme);
    if (requested && strcmp(requested, "auto") != 0) {
        const fp4_backend *b = fp4_backend_lookup(reg, n, requested);
        if (!b) {
            fp4_backend_list(reg, n, names, sizeof names);
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT,
                            "unknown backend '%s'; valid backends: auto, %s", requested, names);
        }
        if (!fp4_backend_serves(b, dev, need, reason, sizeof reason))
            return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "backend '%s' cannot run layer %d (%s): %s",
                            b->name, need->layer, scheme, reason);
        describe(b, need, out);
        return FP4MOE_OK;
    }
    int np;
    const char *const *prio = fp4_oracle_priority(dev, &np);
    char why[FP4_ERR_LEN] = "";
    size_t o = 0;
    for (int i = 0; i < np; i++) {
        const fp4_backend *b = fp4_backend_lookup(reg, n, prio[i]);
        if (!b)
            continue;
        if (fp4_backend_serves(b, dev, need, reason, sizeof reason)) {
            describe(b, need, out);
            return FP4MOE_OK;
        }
        if (o < sizeof why)
            o += (size_t)snprintf(why + o, sizeof why - o, "%s%s: %s", o ? "; " : "", b->name, reason);
    }
    return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "no backend can run layer %d (%s) on %s: %s",
                    need->layer, scheme, dev->name, why);
}
