/*
 * gpu_pack.h - NVFP4 weights in the load-time layout every GPU kernel reads (host C, every
 * build, so that the CPU tests check it). Values are unchanged: for every element, e2m1 code
 * times block scale after packing equals the checkpoint's, exactly.
 *
 * Codes: per row and 32-byte group (64 elements, scale blocks c0..c3 of 16), lane quad t
 * (t < 4) of an mma fragment finds its 16 codes in bytes 8t .. 8t + 7, two little-endian
 * 32-bit words v = 0, 1. Pair i of word v (i < 4) is elements k0 and k0 + 1 of the group,
 * k0 = 16 (2v + i / 2) + 2t + 8 (i % 2): word v holds blocks 2v and 2v + 1, and each pair is
 * one bf16x2 of the mma A / B fragment (k 2t, 2t + 1 or 2t + 8, 2t + 9 of a k16 block). The
 * 8 code bits of a pair are spread so that a shift or rotate and one mask put them at the
 * bits of that bf16x2 (pair 3: two shifts and masks), the e2m1 values times 2^-126
 * (magnitude at 16 e + 6..8, sign at 16 e + 15 for element e): code bit b of element e sits
 * at (16 e + 6 + b, or 16 e + 15 for the sign) minus the pair's shift, modulo 32. Shifts:
 * pair 0 none, pair 1 4, pair 2 10 (a rotate), pair 3 6 for bits 0, 1, 3 and -2 for bit 2.
 * So per word: bits 6-8, 15, 22-24, 31 pair 0; 2-4, 11, 18-20, 27 pair 1; 28-30, 5, 12-14,
 * 21 pair 2; 0, 1, 10, 9, 16, 17, 26, 25 pair 3.
 * Codes are tiled: rows in blocks of 8 (FP4_WQ_ROWS), and a block's 64-element groups one after
 * the other, each its 8 rows x 32 bytes contiguous (FP4_WQ_TILE, 256 bytes): row r's group g
 * at ((r / 8) (k / 64) + g) 256 + (r % 8) 32 (fp4_wq_row). A warp that copies one group of 16
 * rows (aligned to 8) reads 2 x 256 contiguous bytes: 4 lines instead of 16 (a row's 32 bytes
 * were one sector of a line of their own). The rows of consecutive matrices (experts; gate
 * then up) continue the block count, so n % 8 == 0. H200, whole layer, against rows of k / 2
 * bytes: decode -8.9% at M=1 top-8, -8.4% at M=8; sm90-wgmma -8 to -12% at 8-20 rows per
 * expert, -1.6% at 256 (bench/NOTES.md thirty-first session).
 * Scales: in place (row, block), each the block's |scale| as unsigned e5m3 (5 exponent bits,
 * bias 10, 3 mantissa bits): every finite e4m3 value is a normal e5m3 value (subnormal e4m3
 * included), so a kernel gets bf16 of scale times 2^K (K <= 119) from code b as
 * (b << 4) + ((117 + K) << 7). Where the scale is negative the block's code signs
 * are flipped; where it is zero (either sign) the block's codes are zeroed and its e5m3 code
 * is 0. NaN scale codes (0x7f, 0xff) cannot be packed.
 */
#ifndef FP4MOE_GPU_PACK_H
#define FP4MOE_GPU_PACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_GPU_SCALE_BIAS 10 /* e5m3 exponent bias of packed scales */
#define FP4_WQ_ROWS 8         /* rows of a block of packed codes */
#define FP4_WQ_TILE 256       /* bytes of one 64-element group of a block (8 rows x 32) */

#ifdef __CUDACC__
#define FP4_WQ_HD __host__ __device__
#else
#define FP4_WQ_HD
#endif
/* Byte offset in wq of group 0 of row r (rows of the matrices before it included: a
 * multiple of 8 each) for k columns; group g of the row is g * FP4_WQ_TILE further. */
static inline FP4_WQ_HD size_t fp4_wq_row(size_t r, int k)
{
    return (r / FP4_WQ_ROWS * (size_t)(k / 64)) * FP4_WQ_TILE + r % FP4_WQ_ROWS * 32;
}

/* e5m3 code of |e4m3 value| (0 for a zero), or -1 for a NaN code. */
int fp4_gpu_scale_code(uint8_t e4m3);

/* Pack an NVFP4 linear [n, k] (k % 64 == 0, n % 8 == 0): w [n][k/2] and scale [n][k/16] as
 * in the checkpoint -> wq (n k / 2 bytes, tiled), ws [n][k/16] as above. Returns 0, -1 on a
 * NaN scale code (with *bad set to its index in scale: row * (k / 16) + block), or -2 when
 * k % 64 != 0 or n % 8 != 0. */
int fp4_gpu_pack_nvfp4(const uint8_t *w, const uint8_t *scale, int n, int k, uint8_t *wq,
                       uint8_t *ws, size_t *bad);

#ifdef __cplusplus
}
#endif

#endif
