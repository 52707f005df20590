/*
 * test_router_split.c - the router in three bf16 planes (fp4_gpu_router_split), as the
 * tensor-core router reads it: hi + mid + lo must give back every fp32 router weight exactly
 * (checked in double, which holds the sum of three bf16 without rounding), the planes must be
 * the truncated parts (|hi| <= |r|, sign kept, hi the top 8 significant bits), and non-finite
 * values must survive in hi. CPU only: the split is host code in every build.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fp4moe.h"
#include "gpu_moe.h"

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next32(void) { return check_next32(&rng); }

/* Split one value; returns hi + mid + lo in double and the three planes. */
static double split1(float r, uint16_t p[3])
{
    fp4_gpu_router_split(&r, 1, p);
    return (double)fp4moe_bf16_to_float(p[0]) + (double)fp4moe_bf16_to_float(p[1]) +
           (double)fp4moe_bf16_to_float(p[2]);
}

int main(void)
{
    /* every exponent from 2^-110 to 2^127, random significands and signs: exact */
    long inexact = 0, bad_hi = 0, n = 0;
    for (int ex = -110; ex <= 127; ex++)
        for (int i = 0; i < 400; i++) {
            uint32_t u = ((uint32_t)(ex + 127) << 23) | (next32() & 0x7fffffu) |
                         (next32() & 1u) << 31;
            float r = u2f(u);
            uint16_t p[3];
            double s = split1(r, p);
            n++;
            if (s != (double)r) {
                if (inexact++ < 5)
                    CHECK(0, "r = %a: hi + mid + lo = %a", (double)r, s);
            }
            /* hi: the top 16 bits of r (sign, exponent, 7 stored significand bits) */
            if (p[0] != (uint16_t)(u >> 16)) bad_hi++;
        }
    CHECK(inexact == 0, "%ld of %ld values in [2^-110, 2^128) not exact", inexact, n);
    CHECK(bad_hi == 0, "%ld values whose hi plane is not the truncated top half", bad_hi);

    /* values with all 24 significand bits set and the edges of the range */
    const float edge[] = {1.0f,      -1.0f,        u2f(0x3fffffffu), u2f(0xbfffffffu),
                          FLT_MAX,   -FLT_MAX,     u2f(0x00800000u), u2f(0x09ffffffu),
                          0.0f,      -0.0f,        0.1f,             -1.0f / 3.0f,
                          6.1035156e-5f, 123456.789f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        uint16_t p[3];
        double s = split1(edge[i], p);
        if (fabsf(edge[i]) >= 0x1p-110f || edge[i] == 0.0f)
            CHECK(s == (double)edge[i], "edge %a: hi + mid + lo = %a", (double)edge[i], s);
        else /* below 2^-110 the last part may lose bits below the bf16 subnormal step */
            CHECK(fabs(s - (double)edge[i]) <= 0x1p-133, "edge %a: error %a > 2^-133",
                  (double)edge[i], fabs(s - (double)edge[i]));
        CHECK(signbit(fp4moe_bf16_to_float(p[0])) == signbit(edge[i]), "edge %a: sign of hi",
              (double)edge[i]);
    }

    /* tiny and subnormal values: error below the bf16 subnormal step */
    for (int i = 0; i < 2000; i++) {
        float r = u2f((next32() % 0x0a000000u) | (next32() & 1u) << 31); /* |r| < 2^-107 */
        uint16_t p[3];
        double s = split1(r, p);
        CHECK(fabs(s - (double)r) <= 0x1p-133, "tiny %a: error %a", (double)r, fabs(s - (double)r));
    }

    /* non-finite: hi alone carries it */
    const float nf[] = {INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        uint16_t p[3];
        fp4_gpu_router_split(&nf[i], 1, p);
        float hi = fp4moe_bf16_to_float(p[0]);
        CHECK(isnan(nf[i]) ? isnan(hi) : hi == nf[i], "non-finite %f: hi %f", (double)nf[i],
              (double)hi);
        CHECK(p[1] == 0 && p[2] == 0, "non-finite %f: mid 0x%04x lo 0x%04x", (double)nf[i], p[1],
              p[2]);
    }

    /* layout: planes [3][n] for an array */
    {
        float r[5] = {1.5f, -2.0f, 0.3f, 7.0e-3f, -1.0e4f};
        uint16_t p[15];
        fp4_gpu_router_split(r, 5, p);
        for (int i = 0; i < 5; i++) {
            uint16_t q[3];
            split1(r[i], q);
            CHECK(p[i] == q[0] && p[5 + i] == q[1] && p[10 + i] == q[2],
                  "array element %d: planes not at [0][i], [1][i], [2][i]", i);
        }
    }
    return check_done();
}
