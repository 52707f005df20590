/*
 * test_formats.c - exact checks of the scalar codecs in src/formats.c (E2M1, E4M3FN, UE8M0,
 * BF16) and of the NVFP4 / MXFP8 block quantizers built on them.
 *
 * Every expected decode value is computed here from the sign / exponent / mantissa fields in
 * double precision (OCP MX v1.0 section 5.3, 5.4.1), independently of formats.c, and compared
 * bit for bit (so -0.0 vs +0.0 is a failure). Rounding is checked on exact midpoints of every
 * pair of adjacent codes and on the neighbouring floats either side. Canonical zero: encoders
 * keep the sign, so -0.0 and negative values that round to zero encode as 0x8 (e2m1) / 0x80
 * (e4m3), and encode(decode(c)) == c holds for every non-NaN code.
 * Prints one line per failed check and ends with "N passed, M failed".
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fp4moe.h"

#include "check.h"



static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Same value, same sign of zero, or both NaN. */
static int same_float(float a, float b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return f2u(a) == f2u(b);
}

/* A deterministic xorshift generator, so failures reproduce. */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}
static float rng_uniform(void) /* [0, 1) */
{
    return (float)(rng_u32() >> 8) * (1.0f / 16777216.0f);
}
static float rng_normal(void)
{
    float u1 = rng_uniform() + 1e-7f, u2 = rng_uniform();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* ---- independent references from the bit fields ----------------------------------------- */

static float ref_e2m1(unsigned c)
{
    int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    double v = (e == 0) ? m * 0.5 : pow(2.0, e - 1) * (1.0 + m / 2.0); /* bias 1 */
    return (float)(s ? -v : v);
}

static float ref_e4m3(unsigned c)
{
    int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = (e == 0) ? (m / 8.0) * pow(2.0, -6) : pow(2.0, e - 7) * (1.0 + m / 8.0);
    return (float)(s ? -v : v);
}

static float ref_ue8m0(unsigned c)
{
    return c == 255 ? NAN : (float)pow(2.0, (int)c - 127);
}

/* ---- code-point tables ------------------------------------------------------------------- */

static void test_decode_tables(void)
{
    static const float e2m1_pos[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (unsigned c = 0; c < 16; c++) {
        float got = fp4moe_e2m1_to_float((uint8_t)c);
        CHECK(same_float(got, ref_e2m1(c)), "e2m1 code 0x%x: got %a expected %a", c, got,
              ref_e2m1(c));
        float lit = (c & 8) ? -e2m1_pos[c & 7] : e2m1_pos[c & 7];
        CHECK(same_float(got, lit), "e2m1 code 0x%x: got %a, DESIGN.md table says %a", c, got,
              lit);
    }
    for (unsigned c = 0; c < 256; c++) {
        float got = fp4moe_e4m3_to_float((uint8_t)c);
        CHECK(same_float(got, ref_e4m3(c)), "e4m3 code 0x%02x: got %a expected %a", c, got,
              ref_e4m3(c));
        got = fp4moe_ue8m0_to_float((uint8_t)c);
        CHECK(same_float(got, ref_ue8m0(c)), "ue8m0 code 0x%02x: got %a expected %a", c, got,
              ref_ue8m0(c));
    }
    /* Landmarks stated by the spec. */
    CHECK(fp4moe_e4m3_to_float(0x7e) == 448.0f, "e4m3 max: 0x7e -> %a", fp4moe_e4m3_to_float(0x7e));
    CHECK(fp4moe_e4m3_to_float(0x01) == 0x1p-9f, "e4m3 min subnormal");
    CHECK(fp4moe_e4m3_to_float(0x08) == 0x1p-6f, "e4m3 min normal");
    CHECK(isnan(fp4moe_e4m3_to_float(0xff)) && isnan(fp4moe_e4m3_to_float(0x7f)), "e4m3 NaN");
    CHECK(fp4moe_ue8m0_to_float(127) == 1.0f && fp4moe_ue8m0_to_float(0) == 0x1p-127f &&
              fp4moe_ue8m0_to_float(254) == 0x1p127f,
          "ue8m0 landmarks");
}

static void test_encode_decode_identity(void)
{
    for (unsigned c = 0; c < 16; c++) {
        uint8_t got = fp4moe_e2m1_from_float(fp4moe_e2m1_to_float((uint8_t)c));
        CHECK(got == c, "e2m1 encode(decode(0x%x)) = 0x%x", c, got);
    }
    for (unsigned c = 0; c < 256; c++) {
        if ((c & 0x7f) != 0x7f) {
            uint8_t got = fp4moe_e4m3_from_float(fp4moe_e4m3_to_float((uint8_t)c));
            CHECK(got == c, "e4m3 encode(decode(0x%02x)) = 0x%02x", c, got);
        }
        if (c != 255) {
            uint8_t got = fp4moe_ue8m0_from_float(fp4moe_ue8m0_to_float((uint8_t)c));
            CHECK(got == c, "ue8m0 encode(decode(0x%02x)) = 0x%02x", c, got);
        }
    }
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) /* NaN */
            continue;
        uint16_t got = fp4moe_bf16_from_float(fp4moe_bf16_to_float((uint16_t)b));
        if (got != b && bad++ < 5)
            CHECK(0, "bf16 encode(decode(0x%04x)) = 0x%04x", (unsigned)b, got);
        if (f2u(fp4moe_bf16_to_float((uint16_t)b)) != b << 16 && bad++ < 5)
            CHECK(0, "bf16 decode 0x%04x -> %a", (unsigned)b, fp4moe_bf16_to_float((uint16_t)b));
    }
    CHECK(bad == 0, "bf16 decode / round trip over all non-NaN patterns: %d mismatches", bad);
}

/* ---- rounding ---------------------------------------------------------------------------- */

typedef uint8_t (*enc8_fn)(float);
typedef float (*dec8_fn)(uint8_t);

/* For each pair of adjacent positive codes (c, c+1): the exact midpoint goes to the even code,
 * the floats just below / above it to c / c+1; the same mirrored with the sign bit. */
static void check_midpoints(const char *name, enc8_fn enc, dec8_fn dec, unsigned max_code,
                            unsigned sign_bit)
{
    for (unsigned c = 0; c < max_code; c++) {
        float lo = dec((uint8_t)c), hi = dec((uint8_t)(c + 1));
        float mid = (lo + hi) / 2.0f; /* exact: both have few significant bits */
        unsigned even = (c % 2 == 0) ? c : c + 1;
        float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
        for (int neg = 0; neg < 2; neg++) {
            float s = neg ? -1.0f : 1.0f;
            unsigned sb = neg ? sign_bit : 0;
            uint8_t got = enc(s * mid);
            CHECK(got == (even | sb), "%s tie %a -> 0x%02x, expected 0x%02x", name, s * mid, got,
                  even | sb);
            got = enc(s * below);
            CHECK(got == (c | sb), "%s %a (below tie) -> 0x%02x, expected 0x%02x", name,
                  s * below, got, c | sb);
            got = enc(s * above);
            CHECK(got == ((c + 1) | sb), "%s %a (above tie) -> 0x%02x, expected 0x%02x", name,
                  s * above, got, (c + 1) | sb);
        }
    }
}

static uint8_t e2m1_enc(float x) { return fp4moe_e2m1_from_float(x); }
static float e2m1_dec(uint8_t c) { return fp4moe_e2m1_to_float(c); }
static uint8_t e4m3_enc(float x) { return fp4moe_e4m3_from_float(x); }
static float e4m3_dec(uint8_t c) { return fp4moe_e4m3_to_float(c); }

static void test_e2m1_rounding(void)
{
    static const struct { float x; uint8_t code; } cases[] = {
        {0.25f, 0x0}, {0.75f, 0x2}, {1.25f, 0x2}, {1.75f, 0x4}, {2.5f, 0x4}, {3.5f, 0x6},
        {5.0f, 0x6},  {0.2f, 0x0},  {0.3f, 0x1},  {-0.25f, 0x8}, {-0.75f, 0xa}, {-5.0f, 0xe},
        {-0.0f, 0x8}, {0.0f, 0x0},  {-1e-30f, 0x8}, {5.01f, 0x7}, {2.49f, 0x4}, {2.51f, 0x5},
        /* saturation at +-6, Inf included; NaN has no code and reads as +0 */
        {6.5f, 0x7},  {7.0f, 0x7},  {1e30f, 0x7}, {INFINITY, 0x7}, {-INFINITY, 0xf},
        {-100.0f, 0xf}, {NAN, 0x0}, {-NAN, 0x0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t got = fp4moe_e2m1_from_float(cases[i].x);
        CHECK(got == cases[i].code, "e2m1_from_float(%a) = 0x%x, expected 0x%x", cases[i].x, got,
              cases[i].code);
    }
    check_midpoints("e2m1", e2m1_enc, e2m1_dec, 7, 0x8);
}

static void test_e4m3_rounding(void)
{
    static const struct { float x; uint8_t code; } cases[] = {
        {0x1p-10f, 0x00},  /* half the smallest subnormal: tie to 0 */
        {0x1.8p-9f, 0x02}, /* 1.5 * 2^-9: tie to 2 * 2^-9 */
        {0x1p-30f, 0x00},  {-0x1p-30f, 0x80}, {-0.0f, 0x80},
        {1.0625f, 0x38},   /* 1 + 1/16: tie between 1 and 1.125 -> 1 */
        {1.1875f, 0x3a},   /* 1.125 + 1/16: tie -> 1.25 */
        {0x1.100002p0f, 0x39}, /* just above that tie */
        {240.0f, 0x77}, {440.0f, 0x7e}, /* 440: tie of 416 (0x7d) and 448 (0x7e) -> 448 */
        /* saturation (ml_dtypes gives NaN above 464; we saturate) */
        {449.0f, 0x7e}, {464.0f, 0x7e}, {465.0f, 0x7e}, {1e6f, 0x7e}, {FLT_MAX, 0x7e},
        {INFINITY, 0x7e}, {-INFINITY, 0xfe}, {-500.0f, 0xfe},
        {NAN, 0x7f}, {-NAN, 0x7f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t got = fp4moe_e4m3_from_float(cases[i].x);
        CHECK(got == cases[i].code, "e4m3_from_float(%a) = 0x%02x, expected 0x%02x", cases[i].x,
              got, cases[i].code);
    }
    check_midpoints("e4m3", e4m3_enc, e4m3_dec, 0x7e, 0x80);
}

static void test_ue8m0_encode(void)
{
    static const struct { float x; uint8_t code; } cases[] = {
        {1.0f, 127}, {0.75f, 127}, {3.0f, 129}, {5.0f, 130}, {0x1.000002p0f, 128},
        {0x1.fffffep0f, 128}, {2.0f, 128}, {0x1p-127f, 0}, {0x1p-126f, 1}, {0x1.8p-127f, 1},
        {1e-45f, 0}, {0.0f, 0}, {-0.0f, 0}, {-3.0f, 0}, {0x1p127f, 254},
        {0x1.000002p127f, 254}, {FLT_MAX, 254}, {INFINITY, 254}, {NAN, 255},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t got = fp4moe_ue8m0_from_float(cases[i].x);
        CHECK(got == cases[i].code, "ue8m0_from_float(%a) = %u, expected %u", cases[i].x, got,
              cases[i].code);
    }
    /* Ceiling property on random positive floats: 2^(c-128) < x <= 2^(c-127). */
    for (int i = 0; i < 2000; i++) {
        float x = ldexpf(1.0f + rng_uniform(), (int)(rng_u32() % 250) - 125);
        uint8_t c = fp4moe_ue8m0_from_float(x);
        double v = ldexp(1.0, (int)c - 127);
        CHECK(v >= x && v / 2 < x, "ue8m0_from_float(%a) = %u is not the smallest 2^k >= x", x, c);
    }
}

static void test_bf16(void)
{
    static const struct { uint32_t f; uint16_t b; } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 */
        {0x3f808000u, 0x3f80}, /* tie, 0x3f80 even: down */
        {0x3f818000u, 0x3f82}, /* tie, 0x3f81 odd: up */
        {0x3f808001u, 0x3f81}, /* just above the tie */
        {0x3f807fffu, 0x3f80}, /* just below */
        {0xbf818000u, 0xbf82}, /* negative tie up */
        {0x7f7f8000u, 0x7f80}, /* tie at the top of the range rounds to even = Inf */
        {0x7f7f7fffu, 0x7f7f}, /* FLT_MAX-ish below the tie stays finite */
        {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80}, /* Inf */
        {0x80000000u, 0x8000}, /* -0 */
        {0x00008000u, 0x0000}, /* subnormal tie to even zero */
        {0x00018000u, 0x0002}, /* subnormal tie up */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = fp4moe_bf16_from_float(u2f(cases[i].f));
        CHECK(got == cases[i].b, "bf16_from_float(0x%08x) = 0x%04x, expected 0x%04x",
              (unsigned)cases[i].f, got, cases[i].b);
    }
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u,
                                    0xff800001u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t got = fp4moe_bf16_from_float(u2f(nans[i]));
        CHECK((got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0 &&
                  (got & 0x8000) == ((nans[i] >> 16) & 0x8000),
              "bf16_from_float(NaN 0x%08x) = 0x%04x is not a NaN of the same sign",
              (unsigned)nans[i], got);
    }
}

/* ---- NVFP4 -------------------------------------------------------------------------------- */

#define NV_BLOCKS 64
#define NV_N (NV_BLOCKS * 16)

static uint8_t nibble(const uint8_t *packed, size_t i)
{
    return (i & 1) ? (uint8_t)(packed[i / 2] >> 4) : (uint8_t)(packed[i / 2] & 0xf);
}

static void test_nvfp4_representable(void)
{
    /* Blocks built from codes: a power-of-two global keeps every product exact, and one
     * element of magnitude 6 per block makes amax/6/global equal the chosen scale exactly, so
     * quantize must give back the very codes and dequantize the very values. */
    static float x[NV_N], out[NV_N];
    static uint8_t codes[NV_N], sc[NV_BLOCKS], packed[NV_N / 2], scales[NV_BLOCKS];
    const float globals[] = {1.0f, 0x1p-9f, 0x1p12f};
    for (size_t gi = 0; gi < sizeof globals / sizeof globals[0]; gi++) {
        float g = globals[gi];
        for (int b = 0; b < NV_BLOCKS; b++) {
            sc[b] = (uint8_t)(1 + rng_u32() % 0x7e); /* 0x01..0x7e: positive, nonzero */
            for (int i = 0; i < 16; i++)
                codes[b * 16 + i] = (uint8_t)(rng_u32() & 0xf);
            codes[b * 16 + rng_u32() % 16] = (rng_u32() & 1) ? 0x7 : 0xf; /* +-6 */
            for (int i = 0; i < 16; i++)
                x[b * 16 + i] = ref_e2m1(codes[b * 16 + i]) * ref_e4m3(sc[b]) * g;
        }
        memset(packed, 0xaa, sizeof packed);
        memset(scales, 0xaa, sizeof scales);
        fp4moe_nvfp4_quantize(x, NV_N, g, packed, scales);
        int bad = 0;
        for (int b = 0; b < NV_BLOCKS; b++)
            if (scales[b] != sc[b] && bad++ < 5)
                CHECK(0, "nvfp4 global %a block %d: scale 0x%02x, expected 0x%02x", g, b,
                      scales[b], sc[b]);
        for (size_t i = 0; i < NV_N; i++)
            if (nibble(packed, i) != codes[i] && bad++ < 5)
                CHECK(0, "nvfp4 global %a element %zu (x=%a): code 0x%x, expected 0x%x", g, i,
                      x[i], nibble(packed, i), codes[i]);
        fp4moe_nvfp4_dequantize(packed, scales, g, NV_N, out);
        for (size_t i = 0; i < NV_N; i++)
            if (!same_float(out[i], x[i]) && bad++ < 5)
                CHECK(0, "nvfp4 global %a element %zu: dequantized %a, expected %a", g, i,
                      out[i], x[i]);
        CHECK(bad == 0, "nvfp4 representable round trip, global %a: %d mismatches", g, bad);
    }
}

static void test_nvfp4_random(void)
{
    static float x[NV_N], out[NV_N];
    static uint8_t packed[NV_N / 2], scales[NV_BLOCKS];
    static const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int trial = 0; trial < 4; trial++) {
        float spread = ldexpf(1.0f, trial * 3 - 4);
        double amax_t = 0.0;
        for (size_t i = 0; i < NV_N; i++) {
            /* per-block magnitudes vary, as in real weights */
            x[i] = rng_normal() * spread * (1.0f + (float)((i / 16) % 7));
            amax_t = fmax(amax_t, fabs(x[i]));
        }
        float g = (float)(amax_t / (6.0 * 448.0));
        fp4moe_nvfp4_quantize(x, NV_N, g, packed, scales);
        fp4moe_nvfp4_dequantize(packed, scales, g, NV_N, out);
        double num = 0, den = 0;
        int bad = 0;
        for (int b = 0; b < NV_BLOCKS; b++) {
            float amax = 0;
            for (int i = 0; i < 16; i++)
                amax = fmaxf(amax, fabsf(x[b * 16 + i]));
            float want = amax / 6.0f / g;
            float s = fp4moe_e4m3_to_float(scales[b]);
            /* the scale is the e4m3 value nearest amax/6/global: within 1/16 relative */
            if (!(fabsf(s - want) <= want / 16.0f) && bad++ < 5)
                CHECK(0, "nvfp4 trial %d block %d: scale %a far from amax/6/global %a", trial,
                      b, s, want);
            float step = s * g;
            for (int i = 0; i < 16; i++) {
                size_t k = (size_t)b * 16 + i;
                float y = fabsf(x[k] / step);
                float best = INFINITY;
                for (int j = 0; j < 8; j++)
                    best = fminf(best, fabsf(y - grid[j]));
                float got = fabsf(fp4moe_e2m1_to_float(nibble(packed, k)));
                /* a nearest grid point (saturation included), same sign */
                if (!(fabsf(got - y) <= best * (1 + 1e-6f) + 1e-6f) && bad++ < 5)
                    CHECK(0, "nvfp4 trial %d element %zu: x/scale %a coded as %a, nearest is %a "
                             "away", trial, k, y, got, best);
                if (!(fabsf(x[k] - out[k]) <= step * 1.0001f) && bad++ < 5)
                    CHECK(0, "nvfp4 trial %d element %zu: |%a - %a| > scale %a", trial, k, x[k],
                          out[k], step);
                num += (x[k] - out[k]) * (double)(x[k] - out[k]);
                den += (double)x[k] * x[k];
            }
        }
        CHECK(bad == 0, "nvfp4 random trial %d: %d bad elements", trial, bad);
        /* Gaussian blocks under NVFP4 land near 0.09 relative error; 0.15 catches a broken
         * scale while leaving room for the draw. */
        double rel = sqrt(num / den);
        CHECK(rel < 0.15, "nvfp4 random trial %d: relative error %g >= 0.15", trial, rel);
    }
}

static void test_nvfp4_edges(void)
{
    float x[32], out[32];
    uint8_t packed[16], scales[2];
    /* all zeros; second block tiny: amax/6/global below half the smallest e4m3 -> zeros */
    for (int i = 0; i < 16; i++) {
        x[i] = (i & 1) ? -0.0f : 0.0f;
        x[16 + i] = (i % 3 - 1) * 1e-4f;
    }
    memset(packed, 0xaa, sizeof packed);
    memset(scales, 0xaa, sizeof scales);
    fp4moe_nvfp4_quantize(x, 32, 1.0f, packed, scales);
    CHECK(scales[0] == 0 && scales[1] == 0, "nvfp4 zero/tiny blocks: scales 0x%02x 0x%02x",
          scales[0], scales[1]);
    int nz = 0;
    for (int i = 0; i < 16; i++)
        nz += packed[i] != 0;
    CHECK(nz == 0, "nvfp4 zero/tiny blocks: %d nonzero packed bytes", nz);
    fp4moe_nvfp4_dequantize(packed, scales, 1.0f, 32, out);
    for (int i = 0; i < 32; i++)
        CHECK(out[i] == 0.0f, "nvfp4 zero/tiny blocks: out[%d] = %a", i, out[i]);

    /* amax/6/global far above 448: the scale saturates to 448 and elements to +-6 */
    for (int i = 0; i < 32; i++)
        x[i] = (i & 1) ? -1e6f : 1e6f;
    fp4moe_nvfp4_quantize(x, 32, 1.0f, packed, scales);
    CHECK(scales[0] == 0x7e && scales[1] == 0x7e, "nvfp4 saturation: scales 0x%02x 0x%02x",
          scales[0], scales[1]);
    for (int i = 0; i < 16; i++)
        CHECK(packed[i] == 0xf7, "nvfp4 saturation: packed[%d] = 0x%02x, expected 0xf7", i,
              packed[i]);

    /* Nibble order: element 2j low, 2j+1 high. */
    for (int i = 0; i < 16; i++)
        x[i] = (i == 0) ? 6.0f : (i == 1) ? 0.5f : 0.0f;
    fp4moe_nvfp4_quantize(x, 16, 1.0f, packed, scales);
    CHECK(scales[0] == 0x38 && packed[0] == 0x17, "nvfp4 nibble order: scale 0x%02x byte 0x%02x",
          scales[0], packed[0]);
}

/* ---- MXFP8 -------------------------------------------------------------------------------- */

#define MX_BLOCKS 64
#define MX_N (MX_BLOCKS * 32)

static void test_mxfp8(void)
{
    static float x[MX_N], out[MX_N];
    static uint8_t codes[MX_N], sc[MX_BLOCKS], q[MX_N], scales[MX_BLOCKS];

    /* representable: one +-448 per block pins the scale; all codes come back */
    for (int b = 0; b < MX_BLOCKS; b++) {
        sc[b] = (uint8_t)(127 - 100 + rng_u32() % 200);
        for (int i = 0; i < 32; i++) {
            uint8_t c;
            do
                c = (uint8_t)rng_u32();
            while ((c & 0x7f) == 0x7f);
            codes[b * 32 + i] = c;
        }
        codes[b * 32 + rng_u32() % 32] = (rng_u32() & 1) ? 0x7e : 0xfe;
        for (int i = 0; i < 32; i++)
            x[b * 32 + i] = ref_e4m3(codes[b * 32 + i]) * ref_ue8m0(sc[b]);
    }
    fp4moe_mxfp8_quantize(x, MX_N, q, scales);
    fp4moe_mxfp8_dequantize(q, scales, MX_N, out);
    int bad = 0;
    for (int b = 0; b < MX_BLOCKS; b++)
        if (scales[b] != sc[b] && bad++ < 5)
            CHECK(0, "mxfp8 block %d: scale %u, expected %u", b, scales[b], sc[b]);
    for (size_t i = 0; i < MX_N; i++)
        if ((q[i] != codes[i] || !same_float(out[i], x[i])) && bad++ < 5)
            CHECK(0, "mxfp8 element %zu (x=%a): code 0x%02x -> %a, expected 0x%02x", i, x[i],
                  q[i], out[i], codes[i]);
    CHECK(bad == 0, "mxfp8 representable round trip: %d mismatches", bad);

    /* random: scale is the smallest power of two with amax/scale <= 448, error <= half ulp */
    for (size_t i = 0; i < MX_N; i++)
        x[i] = rng_normal() * ldexpf(1.0f, (int)((i / 32) % 40) - 20);
    fp4moe_mxfp8_quantize(x, MX_N, q, scales);
    fp4moe_mxfp8_dequantize(q, scales, MX_N, out);
    bad = 0;
    for (int b = 0; b < MX_BLOCKS; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        double s = ldexp(1.0, scales[b] - 127);
        if (!(amax / s <= 448.0 && amax / (s / 2) > 448.0) && bad++ < 5)
            CHECK(0, "mxfp8 block %d: scale 2^%d not minimal for amax %a", b, scales[b] - 127,
                  amax);
        for (int i = 0; i < 32; i++) {
            size_t k = (size_t)b * 32 + i;
            double tol = fmax(fabs(x[k]) / 16.0, s * 0x1p-10);
            if (!(fabs((double)x[k] - out[k]) <= tol) && bad++ < 5)
                CHECK(0, "mxfp8 element %zu: |%a - %a| > %a", k, x[k], out[k], tol);
        }
    }
    CHECK(bad == 0, "mxfp8 random: %d bad", bad);

    /* all-zero block */
    memset(x, 0, 32 * sizeof x[0]);
    memset(q, 0xaa, 32);
    fp4moe_mxfp8_quantize(x, 32, q, scales);
    fp4moe_mxfp8_dequantize(q, scales, 32, out);
    bad = 0;
    for (int i = 0; i < 32; i++)
        bad += q[i] != 0 || out[i] != 0.0f;
    CHECK(bad == 0 && scales[0] == 0, "mxfp8 zero block: %d nonzero, scale %u", bad, scales[0]);
}

int main(void)
{
    test_decode_tables();
    test_encode_decode_identity();
    test_e2m1_rounding();
    test_e4m3_rounding();
    test_ue8m0_encode();
    test_bf16();
    test_nvfp4_representable();
    test_nvfp4_random();
    test_nvfp4_edges();
    test_mxfp8();
    return check_done();
}
