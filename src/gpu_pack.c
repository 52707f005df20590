/*
 * gpu_pack.c - NVFP4 weights in the GPU kernels' load-time layout (gpu_pack.h).
 */
#include "gpu_pack.h"

#include <string.h>

int fp4_gpu_scale_code(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return -1; /* NaN */
    if (e == 0) {                     /* subnormal m * 2^-9: normalize */
        if (m == 0) return 0;
        int sh = m >= 4 ? 2 : m >= 2 ? 1 : 0; /* m = 1.f * 2^sh */
        int frac = (m << (3 - sh)) & 7;       /* the 3 bits after the leading one */
        return ((sh - 9 + FP4_GPU_SCALE_BIAS) << 3) | frac;
    }
    return ((e - 7 + FP4_GPU_SCALE_BIAS) << 3) | m;
}

/* Word bits of pair i from the checkpoint byte of its two elements (low nibble first):
 * code bit b of element e goes where the kernel's shift of pair i (gpu_pack.h) takes it to
 * bf16 bit 16 e + 6 + b (magnitude) or 16 e + 15 (sign). */
static uint32_t pair_bits(int i, uint8_t codes)
{
    static const int shift[4][4] = {{0, 0, 0, 0}, {4, 4, 4, 4}, {10, 10, 10, 10}, {6, 6, -2, 6}};
    uint32_t word = 0;
    for (int e = 0; e < 2; e++)
        for (int b = 0; b < 4; b++) {
            const int target = 16 * e + (b < 3 ? 6 + b : 15);
            const int pos = (target - shift[i][b] + 32) % 32;
            word |= (uint32_t)(codes >> (4 * e + b) & 1) << pos;
        }
    return word;
}

int fp4_gpu_pack_nvfp4(const uint8_t *w, const uint8_t *scale, int n, int k, uint8_t *wq,
                       uint8_t *ws, size_t *bad)
{
    if (n < 0 || k < 0 || k % 64 || n % FP4_WQ_ROWS) return -2; /* whole groups and blocks */
    const size_t rb = (size_t)k / 2, nb = (size_t)k / 16;
    for (int r = 0; r < n; r++) {
        const uint8_t *src = w + r * rb, *sc = scale + r * nb;
        uint8_t *dst = wq + fp4_wq_row((size_t)r, k), *sd = ws + r * nb;
        for (size_t g0 = 0; g0 < rb; g0 += 32) {
            uint8_t tmp[32]; /* the group's codes, block j in bytes 8 j .. 8 j + 7 */
            memcpy(tmp, src + g0, 32);
            for (int j = 0; j < 4; j++) {
                const size_t b = g0 / 8 + j;
                const int code = fp4_gpu_scale_code(sc[b]);
                if (code < 0) {
                    if (bad) *bad = r * nb + b;
                    return -1;
                }
                for (int i = 0; i < 8; i++) /* zero scale: zero codes; negative: flip signs */
                    tmp[8 * j + i] = code == 0 ? 0 : (sc[b] & 0x80) ? tmp[8 * j + i] ^ 0x88 : tmp[8 * j + i];
                sd[b] = (uint8_t)code;
            }
            for (int t = 0; t < 4; t++)
                for (int v = 0; v < 2; v++) {
                    uint32_t word = 0;
                    for (int i = 0; i < 4; i++) {
                        const int k0 = 16 * (2 * v + (i >> 1)) + 2 * t + 8 * (i & 1);
                        word |= pair_bits(i, tmp[k0 / 2]); /* elements k0, k0 + 1 */
                    }
                    for (int b = 0; b < 4; b++) /* group g0 / 32 of the row's block */
                        dst[g0 / 32 * FP4_WQ_TILE + 8 * t + 4 * v + b] = (uint8_t)(word >> (8 * b));
                }
        }
    }
    return 0;
}
