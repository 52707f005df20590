/*
 * moe_weights.c - exact dequantization of one linear's rows from checkpoint layout (DESIGN.md
 * section 2) and the release of a layer's MoE weights.
 *
 * nvfp4: w = (e2m1 * e4m3) * global_scale; the first product is exact (at most 5 significant
 * bits), so each value is the correctly rounded fp32 of the exact product. With global_scale
 * 1.0 the output is exact, which lets a caller apply the global scale to its accumulator.
 * mxfp8: w = e4m3 * 2^(ue8m0 - 127) (exact unless it leaves the fp32 range). bf16: widened.
 * Limits: k must be a multiple of 16 (nvfp4) or 32 (mxfp8); the loader checks shapes.
 */
#include "moe_weights.h"

#include <stdlib.h>
#include <string.h>

static void fp4_dequant_nvfp4_rows(const fp4_linear *l, int r0, int nr, float *out)
{
    size_t k = (size_t)l->k, nblk = k / 16;
    float e2m1[16];
    for (int c = 0; c < 16; c++)
        e2m1[c] = fp4moe_e2m1_to_float((uint8_t)c);
    for (int r = 0; r < nr; r++) {
        const uint8_t *q = l->w + (size_t)(r0 + r) * (k / 2);
        const uint8_t *sc = l->scale + (size_t)(r0 + r) * nblk;
        float *o = out + (size_t)r * k;
        for (size_t b = 0; b < nblk; b++) {
            float s = fp4moe_e4m3_to_float(sc[b]);
            float v[16];
            for (int c = 0; c < 16; c++)
                v[c] = (e2m1[c] * s) * l->global_scale;
            for (int j = 0; j < 8; j++) {
                uint8_t byte = q[b * 8 + (size_t)j];
                o[b * 16 + (size_t)(2 * j)] = v[byte & 0xf];
                o[b * 16 + (size_t)(2 * j + 1)] = v[byte >> 4];
            }
        }
    }
}

static void fp4_dequant_mxfp8_rows(const fp4_linear *l, int r0, int nr, float *out)
{
    size_t k = (size_t)l->k, nblk = k / 32;
    float e4m3[256];
    for (int c = 0; c < 256; c++)
        e4m3[c] = fp4moe_e4m3_to_float((uint8_t)c);
    for (int r = 0; r < nr; r++) {
        const uint8_t *q = l->w + (size_t)(r0 + r) * k;
        const uint8_t *sc = l->scale + (size_t)(r0 + r) * nblk;
        float *o = out + (size_t)r * k;
        for (size_t b = 0; b < nblk; b++) {
            float s = fp4moe_ue8m0_to_float(sc[b]);
            for (size_t j = 0; j < 32; j++)
                o[b * 32 + j] = e4m3[q[b * 32 + j]] * s;
        }
    }
}

static void fp4_dequant_bf16_rows(const fp4_linear *l, int r0, int nr, float *out)
{
    size_t k = (size_t)l->k;
    for (int r = 0; r < nr; r++) {
        const uint8_t *q = l->w + (size_t)(r0 + r) * k * 2;
        float *o = out + (size_t)r * k;
        for (size_t j = 0; j < k; j++) {
            uint32_t bits = ((uint32_t)q[2 * j] | ((uint32_t)q[2 * j + 1] << 8)) << 16;
            memcpy(&o[j], &bits, sizeof bits);
        }
    }
}

void fp4_linear_dequant_rows(const fp4_linear *l, int r0, int nr, float *out)
{
    switch (l->scheme.w) {
    case FP4_W_NVFP4: fp4_dequant_nvfp4_rows(l, r0, nr, out); break;
    case FP4_W_MXFP8: fp4_dequant_mxfp8_rows(l, r0, nr, out); break;
    case FP4_W_BF16: fp4_dequant_bf16_rows(l, r0, nr, out); break;
    }
}

void fp4_moe_weights_free(fp4_moe_weights *w)
{
    if (!w)
        return;
    free(w->router);
    free(w->router_bias);
    free(w->gate);
    free(w->up);
    free(w->down);
    w->router = w->router_bias = NULL;
    w->gate = w->up = w->down = NULL;
}
