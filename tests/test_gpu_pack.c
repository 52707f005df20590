/*
 * test_gpu_pack.c - the load-time NVFP4 layout of the GPU kernels (src/gpu_pack.h), on the
 * CPU: every element's value must survive packing exactly. Values are computed here from the
 * bits by the OCP formulas (e2m1: s ee m, bias 1; e4m3: s eeee mmm, bias 7, no infinities),
 * independent of the library's codecs. The packed scale is expanded the way the kernels do
 * it, (b << 4) + ((117 + K) << 7) read as bf16, for K = 0 (mma, sm90-wgmma) and K = 119
 * (decode); the packed codes are read back the way the kernels do (a shift or rotate and a
 * mask per pair, the bits read as bf16 times 2^-126), each row's 32-byte group found in its
 * tile of 8 rows (the tiled layout, computed here from its description).
 * Checks: all 256 e4m3 codes (NaN refused, zero -> 0, every other value exact at both K),
 * then random rows with every scale code but NaN (zero, subnormal, negative) and random codes:
 * code * scale equal for every element (24 rows: 3 blocks), the elements' bytes covering
 * wq exactly once;
 * NaN in a row reports its index; k % 64 or n % 8 refused; input untouched.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_pack.h"

static double e2m1(int c)
{
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8 ? -1 : 1) * mag[c & 7];
}

static double e4m3(int c)
{
    int e = (c >> 3) & 15, m = c & 7;
    double v = e ? ldexp(1 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return c & 0x80 ? -v : v;
}

/* bf16 bits -> double (sign, 8-bit exponent, 7-bit mantissa, subnormals) */
static double bf16(uint32_t b)
{
    int e = (b >> 7) & 0xff, m = b & 0x7f;
    double v = e ? ldexp(1 + m / 128.0, e - 127) : ldexp(m / 128.0, -126);
    return b & 0x8000 ? -v : v;
}

/* The kernels' expansion of a packed scale code: bf16 of scale * 2^k. */
static double expand(int b, int k)
{
    return bf16(((uint32_t)b << 4) + ((uint32_t)(117 + k) << 7));
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t next32(void) { return check_next32(&rng); }

static void check_codes(void)
{
    for (int c = 0; c < 256; c++) {
        int b = fp4_gpu_scale_code((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            CHECK(b == -1, "e4m3 0x%02x is NaN: code %d, expected -1", c, b);
            continue;
        }
        CHECK(b >= 0 && b < 256, "e4m3 0x%02x: code %d out of range", c, b);
        if ((c & 0x7f) == 0) {
            CHECK(b == 0, "e4m3 0x%02x is zero: code %d, expected 0", c, b);
            continue;
        }
        CHECK((b >> 3) >= 1, "e4m3 0x%02x: code 0x%02x is not normal", c, b);
        for (int k = 0; k <= 119; k += 119) {
            double want = ldexp(fabs(e4m3(c)), k), got = expand(b, k);
            CHECK(got == want, "e4m3 0x%02x K=%d: expanded %.17g, expected %.17g", c, k, got,
                  want);
        }
    }
}

/* The kernels' extraction of pair p of a packed word (e2m1_pair in src/cuda/device_util.cuh,
 * written again here): a bf16x2 of the two values times 2^-126. */
static uint32_t kernel_pair(uint32_t q, int p)
{
    const uint32_t mask = 0x81c081c0u;
    if (p == 0) return q & mask;
    if (p == 1) return (q << 4) & mask;
    if (p == 2) return ((q << 10) | (q >> 22)) & mask;
    return ((q << 6) & 0x80c080c0u) | ((q >> 2) & 0x01000100u);
}

/* Offset of row r's 32 bytes of group g in a packed matrix of kc columns: in the tile of 8
 * rows x 32 bytes of rows 8 (r / 8) .. 8 (r / 8) + 7, the tiles of one block of rows
 * following each other along K (written here from gpu_pack.h's text, not with fp4_wq_row). */
static size_t tiled_off(int r, int kc, int g)
{
    return ((size_t)(r / 8) * (kc / 64) + g) * 256 + (size_t)(r % 8) * 32;
}

/* Value of element elem of row r of a packed matrix of kc columns as the kernels read it:
 * in the row's 32 bytes of group elem / 64 (tiled_off), pair i of word v of lane quad t, where
 * the element's k16 block is j = 2 v + i / 2 and its offset 2 t + 8 (i % 2) (+ 1: the high
 * half); bf16 bits times 2^126. Bits outside the value's are an error. */
static double packed_value(const uint8_t *wq, int r, int kc, int elem)
{
    int k = elem % 64, j = k / 16, rem = k % 16, h = rem / 8, t = (rem % 8) / 2, odd = rem % 2;
    int v = j / 2, i = (j % 2) * 2 + h;
    const uint8_t *wb = wq + tiled_off(r, kc, elem / 64) + 8 * t + 4 * v;
    uint32_t q = wb[0] | (uint32_t)wb[1] << 8 | (uint32_t)wb[2] << 16 | (uint32_t)wb[3] << 24;
    uint32_t half = kernel_pair(q, i) >> (16 * odd) & 0xffff;
    CHECK((half & ~0x81c0u) == 0, "elem %d: pair bits 0x%04x outside sign and magnitude", elem,
          half);
    return ldexp(bf16(half), 126);
}

static void check_rows(void)
{
    enum { N = 24, K = 256, NB = K / 16 }; /* 3 blocks of 8 rows, 4 groups a row */
    static uint8_t w[N * K / 2], s[N * NB], w0[N * K / 2], s0[N * NB], wq[N * K / 2], ws[N * NB];
    for (int rep = 0; rep < 40; rep++) {
        for (size_t i = 0; i < sizeof w; i++) w[i] = (uint8_t)next32();
        for (size_t i = 0; i < sizeof s; i++) {
            uint8_t c = (uint8_t)next32();
            if ((c & 0x7f) == 0x7f) c ^= 1;       /* no NaN here */
            if (rep == 0) c = (uint8_t)(i % 8 == 0 ? 0x80 : i % 8 == 1 ? 0 : c); /* zeros */
            s[i] = c;
        }
        memcpy(w0, w, sizeof w);
        memcpy(s0, s, sizeof s);
        size_t bad = 12345;
        int rc = fp4_gpu_pack_nvfp4(w, s, N, K, wq, ws, &bad);
        CHECK(rc == 0, "rep %d: pack returned %d (bad %zu)", rep, rc, bad);
        CHECK(!memcmp(w, w0, sizeof w) && !memcmp(s, s0, sizeof s), "rep %d: input changed", rep);
        int wrong = 0;
        for (int r = 0; r < N; r++)
            for (int e = 0; e < K; e++) {
                int b = e / 16;
                int code = w[r * K / 2 + e / 2] >> (4 * (e & 1)) & 15;
                double want = e2m1(code) * e4m3(s[r * NB + b]);
                double pv = packed_value(wq, r, K, e);
                int sc = ws[r * NB + b];
                for (int k = 0; k <= 119; k += 119) {
                    double got = pv * ldexp(sc ? expand(sc, k) : 0.0, -k);
                    if (got != want && wrong++ < 5)
                        CHECK(0, "rep %d row %d elem %d (code %x, scale 0x%02x) K=%d: %.17g, "
                              "expected %.17g", rep, r, e, code, s[r * NB + b], k, got, want);
                }
            }
        CHECK(wrong == 0, "rep %d: %d elements differ", rep, wrong);
    }
    /* the words read above (row r, group g, lane quad t, word v) cover wq once each */
    static uint8_t seen[N * K / 2];
    int twice = 0, missed = 0;
    for (int r = 0; r < N; r++)
        for (int g = 0; g < K / 64; g++)
            for (int q = 0; q < 8; q++) { /* word q = 2 t + v: bytes 4 q .. 4 q + 3 */
                const size_t off = tiled_off(r, K, g) + 4 * q;
                for (int b = 0; b < 4; b++) twice += seen[off + b]++ > 0;
            }
    for (size_t i = 0; i < sizeof seen; i++) missed += seen[i] == 0;
    CHECK(twice == 0 && missed == 0, "tiled offsets: %d bytes read twice, %d never", twice,
          missed);
}

static void check_nan(void)
{
    enum { N = 8, K = 128, NB = K / 16 };
    static uint8_t w[N * K / 2], s[N * NB], wq[N * K / 2], ws[N * NB];
    for (size_t i = 0; i < sizeof s; i++) s[i] = 0x38;
    s[2 * NB + 5] = 0x7f;
    size_t bad = 0;
    int rc = fp4_gpu_pack_nvfp4(w, s, N, K, wq, ws, &bad);
    CHECK(rc == -1 && bad == 2 * NB + 5, "NaN scale: rc %d, bad %zu, expected -1, %d", rc, bad,
          2 * NB + 5);
    rc = fp4_gpu_pack_nvfp4(w, s, 8, 96, wq, ws, &bad);
    CHECK(rc == -2, "k = 96 (not whole 64-groups): rc %d, expected -2", rc);
    rc = fp4_gpu_pack_nvfp4(w, s, 7, 128, wq, ws, &bad);
    CHECK(rc == -2, "n = 7 (not whole blocks of 8 rows): rc %d, expected -2", rc);
}

int main(void)
{
    check_codes();
    check_rows();
    check_nan();
    return check_done();
}
