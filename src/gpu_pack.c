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

int fp4_gpu_pack_nvfp4(const uint8_t *w, const uint8_t *scale, int n, int k, uint8_t *wq,
                       uint8_t *ws, size_t *bad)
{
    static const int pos[4] = {0, 2, 1, 3}; /* byte of block j in the row's 64-group word */
    const size_t rb = (size_t)k / 2, nb = (size_t)k / 16;
    for (int r = 0; r < n; r++) {
        const uint8_t *src = w + r * rb, *sc = scale + r * nb;
        uint8_t *dst = wq + r * rb, *sd = ws + r * nb;
        for (size_t g0 = 0; g0 < rb; g0 += 32) {
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < 4; j++)
                    for (int h = 0; h < 2; h++)
                        dst[g0 + 8 * t + 2 * j + h] = src[g0 + 8 * j + t + 4 * h];
            for (int j = 0; j < 4; j++) {
                const size_t b = g0 / 8 + j;
                const int code = fp4_gpu_scale_code(sc[b]);
                if (code < 0) {
                    if (bad) *bad = r * nb + b;
                    return -1;
                }
                if (code == 0 || (sc[b] & 0x80)) /* block j's bytes are now 8 t + 2 j + h */
                    for (int t = 0; t < 4; t++)
                        for (int h = 0; h < 2; h++) {
                            uint8_t *q = &dst[g0 + 8 * t + 2 * j + h];
                            *q = code == 0 ? 0 : (uint8_t)(*q ^ 0x88); /* zero or flip signs */
                        }
                sd[g0 / 8 + pos[j]] = (uint8_t)code;
            }
        }
    }
    return 0;
}
