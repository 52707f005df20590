/*
 * oracle.h - the one decider: which backend runs each MoE layer (DESIGN.md sections 1, 5).
 * inspect, model load and the forward pass all call fp4_oracle_select; nothing else decides.
 *
 * Rules: an explicit backend serves the layer or the call fails with
 *   backend '<name>' cannot run layer <L> (<weight>/<activation>): <reason>
 * and never falls back; "auto" walks the device's priority list and takes the first that
 * serves, or lists every backend with its reason. A backend that runs A16 drops any declared
 * activation metadata (static or per-token) and says so; a backend that runs A4 must support
 * the declared activation scheme or reject the layer.
 */
#ifndef FP4MOE_ORACLE_H
#define FP4MOE_ORACLE_H

#include <stddef.h>

#include "common.h"
#include "model_config.h"
#include "quant_scheme.h"

typedef struct fp4_device {
    int cuda;        /* 0: CPU only */
    int cc;          /* compute capability * 10 (90 for sm_90); 0 for CPU */
    char name[16];   /* "cpu", "sm80", "sm90", ... */
} fp4_device;

/* arch: NULL or "auto" (query the CUDA device once; CPU when none), or one of
 * "cpu", "sm80", "sm89", "sm90", "sm100". */
fp4moe_status fp4_device_resolve(const char *arch, fp4_device *out, fp4_err *e);

#define FP4_BIT(x) (1u << (unsigned)(x))

typedef struct fp4_backend {
    const char *name;
    const char *aliases[3];   /* documented aliases, NULL-terminated */
    const char *summary;
    int on_cpu;               /* runs on the host, on any device */
    int cc_min, cc_max;       /* CUDA compute capability range (x10); 0, 0 for CPU backends */
    unsigned weights;         /* FP4_BIT(fp4_wscheme) of routed-expert weights it takes */
    int a16;                  /* runs layers with activations in 16 bit (drops A4 metadata) */
    unsigned a4;              /* FP4_BIT(fp4_ascheme) it executes as A4 (quantized inputs) */
    int a16_undeclared;       /* an A4 backend that runs a side declaring no A4 scheme at A16 */
    unsigned acts;            /* FP4_BIT(fp4_act) supported */
    int clamps;               /* applies the SwiGLU limit */
    int gpu;                  /* 1: runs through the GPU pipeline (gpu_moe.h) */
    struct {
        int kernel;           /* fp4_gpu_kernel */
        int max_tokens_per_expert; /* serves calls up to this many tokens per expert; 0: any */
    } kernels[3];             /* selection by size: the first that admits the call runs */
    int n_kernels;
    size_t (*workspace)(const fp4_arch *a, int max_tokens); /* caller-owned device scratch;
                                                               NULL: none (CPU backends) */
    const char *load;         /* load-time weight conversion, in words */
} fp4_backend;

/* What a MoE layer needs: its routed experts' schemes and activation. */
typedef struct fp4_layer_need {
    int layer;
    fp4_scheme fc1, fc2;
    fp4_act act;
    float swiglu_limit;
} fp4_layer_need;

typedef struct fp4_decision {
    const fp4_backend *backend;
    char precision[32];       /* "W4A16", "W4A4-emulated", "W4A16-emulated", "reference" */
    char dropped[128];        /* activation metadata dropped, "" when none */
} fp4_decision;

/* The product registry and lookups. */
const fp4_backend *const *fp4_backend_registry(int *n);
/* Canonical name or alias; NULL when unknown. */
const fp4_backend *fp4_backend_lookup(const fp4_backend *const *reg, int n, const char *name);
/* "reference, emulation, w4a16-mma (alias marlin), ..." */
void fp4_backend_list(const fp4_backend *const *reg, int n, char *buf, size_t len);
/* The priority list of a device (names, most preferred first). */
const char *const *fp4_oracle_priority(const fp4_device *dev, int *n);

/* 1 when b can run the layer on dev; else 0 with the reason. */
int fp4_backend_serves(const fp4_backend *b, const fp4_device *dev, const fp4_layer_need *need,
                       char *reason, size_t len);

/* The decider. requested: NULL/"auto" or a name/alias. reg/n: NULL/0 for the product
 * registry (tests pass their own). */
fp4moe_status fp4_oracle_select(const fp4_backend *const *reg, int n, const fp4_device *dev,
                                const char *requested, const fp4_layer_need *need,
                                fp4_decision *out, fp4_err *e);

/* The one line said once per layer group when metadata is dropped, e.g. "layers 1-3:
 * backend w4a16-mma runs W4A16 (activations not quantized); dropped nvfp4-per-token
 * activation scales (FC1)". Empty when nothing was dropped. */
void fp4_decision_note(const fp4_decision *d, const char *layers, char *buf, size_t len);

/* Selection by size, inside the decider: the GPU kernel of backend b for a call of m
 * tokens (expected tokens per expert: ceil(m * topk / n_experts)). -1 for CPU backends. */
int fp4_oracle_kernel(const fp4_backend *b, int m, int topk, int n_experts);

/* The size rule in words: "decode up to 4 tokens/expert, then mma"; "" for CPU backends. */
void fp4_backend_kernels_str(const fp4_backend *b, char *buf, size_t len);

/* "nvfp4/nvfp4-per-token" (or "nvfp4/fc1 nvfp4-per-token, fc2 none" when they differ). */
void fp4_layer_need_str(const fp4_layer_need *need, char *buf, size_t len);

#endif /* FP4MOE_ORACLE_H */
