/*
 * fp4moe.h - the public C11 API of libfp4moe.
 *
 * fp4moe loads NVFP4-quantized Mixture-of-Experts checkpoints (Hugging Face model
 * directories: config.json, optional hf_quant_config.json, safetensors shards) and runs their
 * MoE layers: on the CPU as an exact dequantized reference, as an A4 emulation, and on NVIDIA
 * GPUs as W4A16 (FP4 weights dequantized in registers, BF16 activations, BF16 tensor cores).
 *
 * Conventions (cuBLAS / SQLite manner): opaque handles with create/destroy pairs; every call
 * returns an fp4moe_status and hands results back through out-pointers; the sentence for a
 * status comes from fp4moe_status_string() and the detail of the last failure on a handle
 * (file, tensor, expected vs found) from fp4moe_model_errmsg(). The library never exits.
 */
#ifndef FP4MOE_H
#define FP4MOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4MOE_VERSION "0.1.0"

typedef enum fp4moe_status {
    FP4MOE_OK = 0,
    FP4MOE_ERR_INVALID_ARGUMENT, /* the caller's mistake: a bad flag, size or pointer */
    FP4MOE_ERR_IO,               /* a file could not be opened, mapped or written */
    FP4MOE_ERR_FORMAT,           /* a file's content is malformed or inconsistent */
    FP4MOE_ERR_NOT_SUPPORTED,    /* valid, but not runnable here (scheme, backend, device) */
    FP4MOE_ERR_CUDA,             /* the CUDA runtime or a kernel launch failed */
    FP4MOE_ERR_OUT_OF_MEMORY,    /* host or device allocation failed */
    FP4MOE_ERR_INTERNAL          /* a bug in fp4moe: please report it */
} fp4moe_status;

/* The sentence for a status code ("invalid argument", ...). Never NULL. */
const char *fp4moe_status_string(fp4moe_status status);

/* ---- Scalar codecs (reference quality, bit-exact; see src/formats.c for the specs) ------- */

float fp4moe_e2m1_to_float(uint8_t code);     /* low nibble: sign bit 3, magnitude bits 0-2 */
uint8_t fp4moe_e2m1_from_float(float x);      /* round-to-nearest-even, saturates to +-6 */
float fp4moe_e4m3_to_float(uint8_t code);     /* float8_e4m3fn; 0x7f/0xff are NaN */
uint8_t fp4moe_e4m3_from_float(float x);      /* RNE, saturates to +-448, NaN -> 0x7f */
float fp4moe_ue8m0_to_float(uint8_t code);    /* 2^(code-127); 0xff is NaN */
uint8_t fp4moe_ue8m0_from_float(float x);     /* smallest power of two >= x (x > 0) */
float fp4moe_bf16_to_float(uint16_t bits);
uint16_t fp4moe_bf16_from_float(float x);     /* RNE; NaN stays NaN */

/* NVFP4 blocks: n a multiple of 16; packed[n/2] (element 2j low nibble), scales[n/16] e4m3.
 * global_scale is the per-tensor *decode* scale (amax/(6*448)); x = e2m1*e4m3*global. */
void fp4moe_nvfp4_quantize(const float *x, size_t n, float global_scale, uint8_t *packed,
                           uint8_t *scales);
void fp4moe_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float global_scale,
                             size_t n, float *out);
/* MXFP8 blocks: n a multiple of 32; q[n] e4m3, scales[n/32] ue8m0. */
void fp4moe_mxfp8_quantize(const float *x, size_t n, uint8_t *q, uint8_t *scales);
void fp4moe_mxfp8_dequantize(const uint8_t *q, const uint8_t *scales, size_t n, float *out);

/* ---- Models ---------------------------------------------------------------------------- */

typedef struct fp4moe_model *fp4moe_model_t;

typedef struct fp4moe_open_options {
    int max_layers;           /* open only layers < max_layers (0: all) */
    const char *device_arch;  /* "auto" (NULL), "cpu", "sm80", "sm89", "sm90", "sm100" */
    const char *moe_backend;  /* "auto" (NULL) or a backend name or alias */
} fp4moe_open_options;

/* Open a Hugging Face model directory. On failure *out may still hold a handle whose
 * fp4moe_model_errmsg() says what went wrong; destroy it either way. */
fp4moe_status fp4moe_model_open(const char *dir, const fp4moe_open_options *options,
                                fp4moe_model_t *out);
void fp4moe_model_destroy(fp4moe_model_t model);
const char *fp4moe_model_errmsg(fp4moe_model_t model); /* "" when the last call succeeded */

int fp4moe_model_num_layers(fp4moe_model_t model);      /* layers opened (after max_layers) */
int fp4moe_model_hidden_size(fp4moe_model_t model);
int fp4moe_model_layer_is_moe(fp4moe_model_t model, int layer);

/* What the one decider chose for a layer: backend name, precision ("W4A16", "W4A4-emulated",
 * "reference") and the activation metadata it dropped ("" when none). */
typedef struct fp4moe_layer_plan {
    char backend[32];
    char precision[32];
    char dropped[128];
} fp4moe_layer_plan;
fp4moe_status fp4moe_model_layer_plan(fp4moe_model_t model, int layer, fp4moe_layer_plan *plan);

/* Run one decoder layer's MLP/MoE block on host activations x[M, hidden] (fp32) with the
 * backend chosen at open; writes y[M, hidden] fp32 and, for MoE layers, topk_ids[M, k] and
 * topk_weights[M, k] (either may be NULL). */
fp4moe_status fp4moe_model_layer_forward(fp4moe_model_t model, int layer, const float *x, int m,
                                         float *y, int32_t *topk_ids, float *topk_weights);
int fp4moe_model_topk(fp4moe_model_t model);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_H */
