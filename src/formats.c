/*
 * formats.c - scalar reference codecs for the number formats fp4moe reads and writes:
 * E2M1 (FP4), E4M3FN (FP8), UE8M0 (E8M0 scale), BF16, and the two block formats built from
 * them, NVFP4 (16 x e2m1 + one e4m3 scale + an fp32 per-tensor decode scale) and MXFP8
 * (32 x e4m3 + one ue8m0 scale). These are the pinned, bit-exact definitions every other
 * module (loader, `gen`, CPU reference, GPU tests) is checked against; they favour clarity
 * over speed.
 *
 * Specs: OCP Microscaling Formats (MX) Specification v1.0 (2023), section 5.3 for the element
 * types FP4 E2M1 (bias 1, no Inf/NaN, max 6) and FP8 E4M3 (bias 7, no Inf, S.1111.111 is NaN,
 * max 448) and section 5.4.1 for the E8M0 scale (bias 127, 0xff is NaN, no sign, no zero);
 * NVIDIA NVFP4 (TensorRT-LLM / ModelOpt / Blackwell PTX docs: e2m1 elements in groups of 16,
 * an e4m3 block scale, an fp32 per-tensor scale); BF16 is the top half of IEEE-754 binary32.
 *
 * Encoding choices where the specs leave it open (tests/test_formats.c and
 * tests/py/test_codecs.py pin every one of them):
 *   - every encoder rounds to nearest, ties to even, and keeps the sign of zero and of values
 *     that round to zero (-0.0 -> 0x8 / 0x80), so encode(decode(c)) == c for every code;
 *   - e2m1 and e4m3 saturate: a magnitude beyond the largest finite value (6, 448), including
 *     Inf, encodes as that value with its sign (ml_dtypes' e4m3 gives NaN there instead);
 *   - NaN: e4m3 -> 0x7f whatever its sign; e2m1 has no NaN and encodes NaN as +0 (0x0);
 *     bf16 keeps the sign and payload and sets the quiet bit;
 *   - ue8m0_from_float rounds *up* to a power of two (a scale must never be too small);
 *     x <= 2^-127 (including 0 and negatives) -> 0x00, x > 2^127 (including +Inf) -> 0xfe,
 *     NaN -> 0xff.
 * Limits: NVFP4 needs n % 16 == 0 and a finite global_scale > 0; MXFP8 needs n % 32 == 0.
 * Block amax ignores NaN elements (fmaxf). Calls with a violated precondition do nothing.
 */
#include <math.h>
#include <string.h>

#include "fp4moe.h"

#define FP4_E2M1_MAX 6.0f
#define FP4_E4M3_MAX 448.0f
#define FP4_NVFP4_GROUP 16
#define FP4_MXFP8_GROUP 32

/* A sign-magnitude minifloat without Inf: mbits mantissa bits, emin the exponent of the
 * smallest normal (1 - bias). Exponent field 0 is subnormal. */
static float fp4_minifloat_decode(unsigned mag, int mbits, int emin)
{
    unsigned e = mag >> mbits, m = mag & ((1u << mbits) - 1u);
    if (e == 0)
        return ldexpf((float)m, emin - mbits);
    return ldexpf((float)((1u << mbits) + m), (int)e - 1 + emin - mbits);
}

/* Encode a magnitude a >= 0 (not NaN) with round-to-nearest-even; a >= max_val saturates to
 * max_code. Scaling by a power of two is exact, so rintf (ties to even in the default
 * rounding mode) sees the exact quotient; a carry out of the mantissa lands on the next
 * exponent's code by construction. */
static unsigned fp4_minifloat_encode(float a, int mbits, int emin, float max_val,
                                     unsigned max_code)
{
    if (a >= max_val)
        return max_code;
    if (a < ldexpf(1.0f, emin))
        return (unsigned)rintf(ldexpf(a, mbits - emin));
    int k;
    frexpf(a, &k);
    int e = k - 1; /* a in [2^e, 2^(e+1)) */
    unsigned m = (unsigned)rintf(ldexpf(a, mbits - e)); /* in [2^mbits, 2^(mbits+1)] */
    return ((unsigned)(e - emin + 1) << mbits) + (m - (1u << mbits));
}

float fp4moe_e2m1_to_float(uint8_t code)
{
    float v = fp4_minifloat_decode(code & 0x7u, 1, 0);
    return (code & 0x8u) ? -v : v;
}

uint8_t fp4moe_e2m1_from_float(float x)
{
    if (isnan(x))
        return 0x0;
    unsigned sign = signbit(x) ? 0x8u : 0u;
    return (uint8_t)(sign | fp4_minifloat_encode(fabsf(x), 1, 0, FP4_E2M1_MAX, 0x7u));
}

float fp4moe_e4m3_to_float(uint8_t code)
{
    if ((code & 0x7fu) == 0x7fu)
        return NAN;
    float v = fp4_minifloat_decode(code & 0x7fu, 3, -6);
    return (code & 0x80u) ? -v : v;
}

uint8_t fp4moe_e4m3_from_float(float x)
{
    if (isnan(x))
        return 0x7f;
    unsigned sign = signbit(x) ? 0x80u : 0u;
    return (uint8_t)(sign | fp4_minifloat_encode(fabsf(x), 3, -6, FP4_E4M3_MAX, 0x7eu));
}

float fp4moe_ue8m0_to_float(uint8_t code)
{
    if (code == 0xff)
        return NAN;
    return ldexpf(1.0f, (int)code - 127); /* code 0 is 2^-127, a float subnormal: exact */
}

uint8_t fp4moe_ue8m0_from_float(float x)
{
    if (isnan(x))
        return 0xff;
    if (x <= ldexpf(1.0f, -127))
        return 0x00;
    if (x > ldexpf(1.0f, 127))
        return 0xfe;
    int k;
    float f = frexpf(x, &k); /* x = f * 2^k, f in [0.5, 1) */
    int e = (f == 0.5f) ? k - 1 : k; /* smallest e with 2^e >= x */
    return (uint8_t)(e + 127);
}

float fp4moe_bf16_to_float(uint16_t bits)
{
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t fp4moe_bf16_from_float(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet; a payload only in the low half stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* ties to even; overflow carries into Inf correctly */
    return (uint16_t)(u >> 16);
}

/* The value a block scale code and the global scale decode to: e4m3(s) * global. */
static float fp4_nvfp4_block_scale(uint8_t scale_code, float global_scale)
{
    return fp4moe_e4m3_to_float(scale_code) * global_scale;
}

void fp4moe_nvfp4_quantize(const float *x, size_t n, float global_scale, uint8_t *packed,
                           uint8_t *scales)
{
    if (!x || !packed || !scales || n % FP4_NVFP4_GROUP != 0 || !(global_scale > 0.0f) ||
        isinf(global_scale))
        return;
    for (size_t b = 0; b < n / FP4_NVFP4_GROUP; b++) {
        const float *xb = x + b * FP4_NVFP4_GROUP;
        uint8_t *pb = packed + b * (FP4_NVFP4_GROUP / 2);
        float amax = 0.0f;
        for (int i = 0; i < FP4_NVFP4_GROUP; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        uint8_t s = fp4moe_e4m3_from_float(amax / 6.0f / global_scale);
        float scale = fp4_nvfp4_block_scale(s, global_scale);
        scales[b] = s;
        if (scale == 0.0f) {
            /* The block scale rounded to zero (or e4m3*global underflowed): all zeros. */
            memset(pb, 0, FP4_NVFP4_GROUP / 2);
            continue;
        }
        for (int i = 0; i < FP4_NVFP4_GROUP; i += 2) {
            uint8_t lo = fp4moe_e2m1_from_float(xb[i] / scale);
            uint8_t hi = fp4moe_e2m1_from_float(xb[i + 1] / scale);
            pb[i / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void fp4moe_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float global_scale,
                             size_t n, float *out)
{
    if (!packed || !scales || !out || n % FP4_NVFP4_GROUP != 0)
        return;
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = packed[i / 2];
        uint8_t code = (i & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0xf);
        /* e2m1 * e4m3 is exact (<= 5 significant bits); the global scale is applied last,
         * as a W4A16 kernel does on its accumulator. */
        out[i] = fp4moe_e2m1_to_float(code) * fp4moe_e4m3_to_float(scales[i / FP4_NVFP4_GROUP]) *
                 global_scale;
    }
}

void fp4moe_mxfp8_quantize(const float *x, size_t n, uint8_t *q, uint8_t *scales)
{
    if (!x || !q || !scales || n % FP4_MXFP8_GROUP != 0)
        return;
    for (size_t b = 0; b < n / FP4_MXFP8_GROUP; b++) {
        const float *xb = x + b * FP4_MXFP8_GROUP;
        float amax = 0.0f;
        for (int i = 0; i < FP4_MXFP8_GROUP; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        /* Smallest power of two with amax / scale <= 448. Rounding of amax/448 cannot land
         * below the true power of two for float inputs; the check is a cheap guard. */
        uint8_t s = fp4moe_ue8m0_from_float(amax / FP4_E4M3_MAX);
        if (s < 0xfe && amax / fp4moe_ue8m0_to_float(s) > FP4_E4M3_MAX)
            s++;
        float scale = fp4moe_ue8m0_to_float(s);
        scales[b] = s;
        for (int i = 0; i < FP4_MXFP8_GROUP; i++)
            q[b * FP4_MXFP8_GROUP + i] = fp4moe_e4m3_from_float(xb[i] / scale);
    }
}

void fp4moe_mxfp8_dequantize(const uint8_t *q, const uint8_t *scales, size_t n, float *out)
{
    if (!q || !scales || !out || n % FP4_MXFP8_GROUP != 0)
        return;
    for (size_t i = 0; i < n; i++)
        out[i] = fp4moe_e4m3_to_float(q[i]) * fp4moe_ue8m0_to_float(scales[i / FP4_MXFP8_GROUP]);
}
