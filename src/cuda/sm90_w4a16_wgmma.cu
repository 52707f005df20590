/*
 * sm90_w4a16_wgmma.cu - the grouped MoE GEMM of FC1 and FC2 (DESIGN.md sections 2 and 4) on
 * Hopper's warpgroup tensor-core instruction wgmma (sm_90a only), with the contract of
 * fp4_mma_gemm (w4a16_mma_gemm.cuh): same arguments, weight layout, grouping and outputs.
 *
 * Shape of the product: D[weight rows x tokens] = W[rows x K] * X^T[K x tokens]. The NVFP4
 * weights are the wgmma A operand, dequantized into registers (wgmma takes A from registers;
 * B must be in shared memory): each pair of the packed codes (src/gpu_pack.h) becomes a
 * bf16x2 of the values times 2^-126 (e2m1_pair: a shift or rotate and a mask), times the
 * packed block scale as bf16 times 2^119 (fp4_scale_eo: the four scales of a row's word
 * in 5 instructions, each half broadcast folded into the multiply): w * s * 2^-7, exact in
 * BF16 (e2m1 * e4m3 has at most 5 significant bits, and the product is normal); 2^7 and
 * the fp32 global scale go on the accumulator. The token rows are gathered per row index
 * with cp.async into shared memory as the K-major B operand in the 128-byte-swizzled layout
 * of the wgmma descriptor (16-byte chunk j of row r stored at chunk j ^ (r & 7)).
 * CTA: 256 threads = 2 warpgroups, 128 weight rows (64 per warpgroup) x up to 128 tokens (two
 * consecutive 64-row slots of the same expert: m64n128k16, or m64n96k16 / m64n80k16 when the
 * second slot holds at most 32 / 16 tokens; a slot alone: m64n64k16, or n48 / n32 / n24 /
 * n16 when it holds at most 48 / 32 / 24 / 16 tokens: the token width is the rows in use
 * rounded up to 16 or 8 more, so an expert's last tile pads little; the caller's grouping
 * pads every expert to an even number of slots, fp4_moe_group align 2, so a pair of slots
 * never holds two experts and its second slot is empty or in use), K tiles of 64 through a
 * cp.async ring of 84 KB (4 stages of 128 or 96 tokens, 5 of 80, 6 of 64, 7 of 48, 9 of 32,
 * 10 of 24, 12 of 16: the weight bytes in flight matter when few tokens share them), one
 * barrier per K tile with 4 or 5 stages, one per two K tiles with more (each publishes two
 * stages: half the barriers and proxy fences). Above WG_DEEP_ROWS rows per expert the gated
 * kernel's DEEP form runs its 128-token units through 5 stages (104 KB, the block scales
 * apart, 16 bytes a row per 4 K tiles), so a copy has 3 K tiles to land instead of 2; there
 * an expert's last full pair and a tail of 1-16 or 17-32 rows after it run as one unit of
 * 144 or 160 tokens (wg_tail: 4 stages, one buffer of A fragments), so the tail's weights
 * are not dequantized a second time for its own unit. Below WG_DEEP_ROWS, where k % 256 == 0
 * and ws is 16-byte aligned, every body of the gated kernel copies its scales that way too
 * (scale chunks, wg_sc_slots), into 2 or 4 slots after its stages.
 * Registers hold two K tiles of A fragments: while the wgmmas of tile kt run, the warps
 * dequantize tile kt+1 (wgmma.wait_group 1 frees the other buffer and the ring stage).
 * Gated (FC1): each warp holds gate and up rows of the same 8 columns in its accumulator rows
 * g and g+8, so the SwiGLU / SwiGLU-OAI epilogue is thread-local; bf16 out staged in shared
 * memory, 16-byte stores. With fold, each row times the next plain launch's multiplier first
 * (the pair's routing weight x FC2's global scale x 2^7, from a table of the unit's rows).
 * Plain (FC2): times global scale and the pair's routing weight (with fold: nothing, a's rows
 * carry it), fp32 rows staged in shared memory (with out_bf16 bf16 rows, already scaled),
 * 16-byte stores;
 * or, in column strips (up to WG_STRIP_ROWS rows per expert: a CTA runs WG_COLS column tiles
 * of one unit through one ring, the next tile's copies in flight across the previous tile's
 * end), stored straight from the accumulators (wg_store_cols, shared with wg_res). With
 * k <= WG_RES_K the token tile stays resident instead (wg_res) up to WG_RES_ROWS rows per
 * expert, and above WG_BIG_ROWS (a pair of 128 tokens, 96 KB, in 114 KB CTAs).
 * Every launch is a programmatic dependent of the kernel before it (device_util.cuh): a CTA
 * waits for it before its first read of the tables, then lets the next kernel launch.
 * Limits: NVFP4 weights only; k % 64 == 0, n % 64 == 0 (plain: a last half tile of 64
 * columns is masked); a and out 16-byte aligned.
 * Built for sm_90a; in other targets the kernel body traps and the launcher refuses (init).
 */
#include <cuda_bf16.h>
#include <stdint.h>

#include "sm90_w4a16_wgmma.cuh"
#include "device_util.cuh"
#include "gpu_pack.h"
#include "moe_group.cuh"
#include "wgmma_util.cuh"

#define WG_THREADS 256
#define WG_BK 64                       /* K per tile: one group of the tiled codes */
#define WG_BW 128                      /* weight rows per CTA (64 per warpgroup) */
#define WG_W_BYTES (WG_BW * WG_BK / 2) /* packed e2m1, permuted rows of 32 bytes */
#define WG_S_BYTES (WG_BW * WG_BK / 16)
#define WG_RING (4 * 21504)            /* cp.async ring: 4 stages of 128 tokens, 6 of 64;
                                          two CTAs per SM (smem and 128 registers) */
#define WG_ROWTAB (128 * 12)           /* plain: per-token output row and multiplier; gated:
                                          the fold multipliers (up to 160 tokens) */
#define WG_SMEM (WG_RING + WG_ROWTAB + 1024) /* + slack to align the base to 1 KB */
#define WG_COLS 4                      /* plain strips: column tiles per CTA */
#define WG_STRIP_ROWS FP4_WG_STRIP_ROWS /* plain strips up to this many rows per expert */
#define WG_BIG_ROWS FP4_WG_BIG_ROWS    /* (k <= WG_RES_K: up to this many, BIG above) */
#define WG_RES_K FP4_WG_RES_K          /* plain, k <= this and at most WG_RES_ROWS rows per */
#define WG_RES_ROWS FP4_WG_RES_ROWS    /* expert: token tile resident (wg_res), */
#define WG_RES_COLS 4                  /* 4 column tiles of 128 per CTA, */
#define WG_RES_FEW_ROWS 40             /* or up to this many rows per expert */
#define WG_RES_FEW_COLS 12             /* this many (fewer, longer CTAs) */
#define WG_RES_SMALL FP4_WG_RES_SMALL  /* up to this many rows per expert: the kernel with
                                          16- and 24-token bodies too */
#define WG_RING128 113664              /* the res kernel's BIG form (k <= WG_RES_K, above
                                          WG_BIG_ROWS rows per expert): a pair's 128 tokens
                                          resident (96 KB), 3 weight stages, its row table */
#define WG_SMEM128 (WG_RING128 + 1024) /* two CTAs per SM: 2 x (114688 + 1024 reserved) of
                                          the SM's 233472 bytes */
#define WG_NK 6                        /* wg_res's K loop unrolled at k = WG_NK * WG_BK (384) */
#define WG_DEEP_ROWS FP4_WG_DEEP_ROWS  /* the gated kernel's DEEP form (above this many rows
                                          per expert, k % 256 == 0): */
#define WG_DEEP_ST 5                   /* 128-token units through 5 stages of B + W (20 KB), */
#define WG_DEEP_SC 2048                /* their block scales 4 K tiles at a time (16 bytes a
                                          row, past L1) in 2 slots of this many bytes */
#define WG_RING_DEEP (WG_DEEP_ST * 20480 + 2 * WG_DEEP_SC)
#define WG_EXT_ST 4                    /* DEEP: a pair with an expert's tail (wg_tail), 144 or
                                          160 tokens: 4 stages of B + W (22 / 24 KB: 5 do not
                                          fit two CTAs per SM) */
#define WG_SMEM_DEEP (WG_RING_DEEP + WG_ROWTAB + 1024) /* two CTAs per SM (the largest
                                          carveout, so an L1 of 28 KB: why the scales go past
                                          it) */
#if WG_SMEM_DEEP > WG_SMEM128
#error "the DEEP kernel's shared memory is set up with WG_SMEM128"
#endif

#if WG_BK != 64
#error "a K tile must be one 64-element group of the tiled codes (gpu_pack.h)"
#endif

#ifdef FP4_WG_SM90

/* Scale chunks (SC, the gated kernel below WG_DEEP_ROWS where k % 256 == 0 and ws is 16-byte
 * aligned): every body copies its scales as DEEP's 128-token body does, 16 bytes a row per 4 K
 * tiles past L1, into WG_DEEP_SC slots after the stages of B + W. A slot is refilled when the
 * K tile 4 (q + S) after its chunk q is copied, NST - 1 steps ahead of its step, and the last
 * codes of chunk q are read at step 4 q + 2 (after that step's barrier), so the refill must
 * come from a later barrier: 4 S >= NST + 2 (with PUB 2, barriers every second step, that is
 * still enough; the rule keeps NST + 3 there, a margin that costs no stage). S: 2 or 4 (a
 * mask). The same stages fit beside the slots (96 tokens: 5 instead of 4); the K loop runs
 * ~20 instructions more per pair of steps (the slot and chunk arithmetic), and still the layer
 * is -1.1 to -5.1% at 14-80 rows per expert (H200, against 4-byte copies per K tile;
 * bench/NOTES.md thirtieth session). */
static __host__ __device__ constexpr int wg_sc_slots(int nst)
{
    return nst + 2 + (nst >= 6) <= 8 ? 2 : 4;
}
/* Stages of SC bodies of STAGE bytes: the most that fit WG_RING beside their slots. */
static __host__ __device__ constexpr int wg_sc_stages(int stage)
{
    int nst = WG_RING / stage;
    while (nst > 3 && nst * stage + wg_sc_slots(nst) * WG_DEEP_SC > WG_RING) nst--;
    return nst;
}

/* D[64 x N] = A[64 x 16] (registers, bf16) * B[16 x N] (shared memory via descriptor)
 * + D when acc_in != 0: wg_mma<N>::run(d, a, desc, acc_in). Operands of the asm: the N / 2
 * accumulators (DREGS, from the chunks WG_D*, 8 each), then a[0..3] (AREGS), desc, acc_in. */
template <int N> struct wg_mma;

#define WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F8(i) WG_F4(i), WG_F4(i + 4)
#define WG_D0 "%0,%1,%2,%3,%4,%5,%6,%7"
#define WG_D1 "%8,%9,%10,%11,%12,%13,%14,%15"
#define WG_D2 "%16,%17,%18,%19,%20,%21,%22,%23"
#define WG_D3 "%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_D4 "%32,%33,%34,%35,%36,%37,%38,%39"
#define WG_D5 "%40,%41,%42,%43,%44,%45,%46,%47"
#define WG_D6 "%48,%49,%50,%51,%52,%53,%54,%55"
#define WG_D7 "%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_D8 "%64,%65,%66,%67,%68,%69,%70,%71"
#define WG_D9 "%72,%73,%74,%75,%76,%77,%78,%79"
#define WG_MMA(N, DREGS, AREGS, DESC, PRED, ...)                                              \
    template <> struct wg_mma<N> {                                                            \
        static __device__ __forceinline__ void run(float *d, const uint32_t *a, uint64_t desc, \
                                                   int acc_in)                                \
        {                                                                                     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                    \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "          \
                         "{" DREGS "}, {" AREGS "}, " DESC ", p, 1, 1, 0;\n}\n"             \
                         : __VA_ARGS__                                                        \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc),             \
                           "r"(acc_in));                                                      \
        }                                                                                     \
    };
WG_MMA(160, WG_D0 "," WG_D1 "," WG_D2 "," WG_D3 "," WG_D4 "," WG_D5 "," WG_D6 "," WG_D7 "," WG_D8 "," WG_D9,
       "%80,%81,%82,%83", "%84", "%85",
       WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48), WG_F8(56),
       WG_F8(64), WG_F8(72))
WG_MMA(144, WG_D0 "," WG_D1 "," WG_D2 "," WG_D3 "," WG_D4 "," WG_D5 "," WG_D6 "," WG_D7 "," WG_D8,
       "%72,%73,%74,%75", "%76", "%77",
       WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48), WG_F8(56),
       WG_F8(64))
WG_MMA(128, WG_D0 "," WG_D1 "," WG_D2 "," WG_D3 "," WG_D4 "," WG_D5 "," WG_D6 "," WG_D7,
       "%64,%65,%66,%67", "%68", "%69",
       WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48), WG_F8(56))
WG_MMA(96, WG_D0 "," WG_D1 "," WG_D2 "," WG_D3 "," WG_D4 "," WG_D5, "%48,%49,%50,%51", "%52", "%53",
       WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40))
WG_MMA(80, WG_D0 "," WG_D1 "," WG_D2 "," WG_D3 "," WG_D4, "%40,%41,%42,%43", "%44", "%45",
       WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32))
WG_MMA(64, WG_D0 "," WG_D1 "," WG_D2 "," WG_D3, "%32,%33,%34,%35", "%36", "%37",
       WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24))
WG_MMA(48, WG_D0 "," WG_D1 "," WG_D2, "%24,%25,%26,%27", "%28", "%29",
       WG_F8(0), WG_F8(8), WG_F8(16))
WG_MMA(32, WG_D0 "," WG_D1, "%16,%17,%18,%19", "%20", "%21",
       WG_F8(0), WG_F8(8))
WG_MMA(24, WG_D0 ",%8,%9,%10,%11", "%12,%13,%14,%15", "%16", "%17",
       WG_F8(0), WG_F4(8))
WG_MMA(16, WG_D0, "%8,%9,%10,%11", "%12", "%13",
       WG_F8(0))
#undef WG_MMA
#undef WG_D0
#undef WG_D1
#undef WG_D2
#undef WG_D3
#undef WG_D4
#undef WG_D5
#undef WG_D6
#undef WG_D7
#undef WG_D8
#undef WG_D9
#undef WG_F8
#undef WG_F4

/* The packed codes and block scales of one K tile that this lane dequantizes (W at w, its
 * scales at w + WG_W_BYTES): rows rg and rg + 8, 8 packed bytes of each (src/gpu_pack.h), and
 * their 4 scales. Loaded apart from wg_dequant so that the shared-memory latency hides behind
 * other work (the copy issue or the wgmma issue) instead of stalling the first shift. */
struct wg_codes {
    uint2 q0, q1;
    uint32_t s0, s1;
};

static __device__ __forceinline__ wg_codes wg_load_codes(const unsigned char *w, int rg, int t)
{
    wg_codes c;
    c.q0 = *(const uint2 *)(w + rg * 32 + t * 8);
    c.q1 = *(const uint2 *)(w + (rg + 8) * 32 + t * 8);
    c.s0 = *(const uint32_t *)(w + WG_W_BYTES + rg * 4);
    c.s1 = *(const uint32_t *)(w + WG_W_BYTES + (rg + 8) * 4);
    return c;
}

/* A fragments of one K tile from its codes: a[kk][0..3] = rows (rg, rg+8) x k (2t.., 2t+8..)
 * of k16 step kk (the mma.sync A layout, per warp 16 rows). The lane's 8 packed bytes of a
 * row: word kk / 2, nibble pairs 2 (kk & 1) (k 2t, 2t+1) and 2 (kk & 1) + 1 (k 2t+8, 2t+9)
 * (src/gpu_pack.h). Values times 2^-126 (e2m1_pair) by scales times 2^119: w s 2^-7.
 * The scales of block kk: fp4_scale_eo once per row (5 instructions for the word's four),
 * fp4_scale_half folded into the HMUL2 operand. At 16-32 rows per expert the kernels are
 * bound by the ALU pipe (52-60% busy, tensor pipe 15%, ncu 2026-11-30), where a byte
 * permute and a multiply-add per block cost 8 more ALU instructions per two K tiles: H200,
 * layer, against that form (two calls): -2.6 / -2.7% at 16 rows per expert, -1.8 / -2.4% at
 * 32, -1.3 to -2.1% at 64-256, -1.3% at I = 3072 (bench/NOTES.md twenty-fifth session).
 * WAIT: a is the buffer that the last four wgmma groups (one per k16 step) read; each a[kk]
 * is written once its group has retired. */
template <bool WAIT = false>
static __device__ __forceinline__ void wg_dequant(const wg_codes &c, uint32_t (&a)[4][4])
{
    uint32_t e0, o0, e1, o1;
    fp4_scale_eo<119>(c.s0, e0, o0);
    fp4_scale_eo<119>(c.s1, e1, o1);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t w0 = kk < 2 ? c.q0.x : c.q0.y, w1 = kk < 2 ? c.q1.x : c.q1.y;
        const uint32_t s0 = fp4_scale_half(kk & 1 ? o0 : e0, kk >> 1);
        const uint32_t s1 = fp4_scale_half(kk & 1 ? o1 : e1, kk >> 1);
        const int i0 = 2 * (kk & 1);
        if (WAIT) { /* a[kk] is read by the kk-th of the last 4 wgmma groups: retire it */
            if (kk == 0) wgmma_wait<3>();
            else if (kk == 1) wgmma_wait<2>();
            else if (kk == 2) wgmma_wait<1>();
            else wgmma_wait<0>();
        }
        a[kk][0] = bf16x2_mul(e2m1_pair(w0, i0), s0);
        a[kk][1] = bf16x2_mul(e2m1_pair(w1, i0), s1);
        a[kk][2] = bf16x2_mul(e2m1_pair(w0, i0 + 1), s0);
        a[kk][3] = bf16x2_mul(e2m1_pair(w1, i0 + 1), s1);
    }
}

/* Row of a that padded row prow reads, or -1 (zeros). */
static __device__ __forceinline__ int wg_a_row(const fp4_mma_gemm_args &p, int prow)
{
    return p.row_src ? p.row_src[prow] : (prow < p.a_rows ? prow : -1);
}

/* Plain: output row that padded row prow writes, or -1 (none). */
static __device__ __forceinline__ int wg_out_row(const fp4_mma_gemm_args &p, int prow)
{
    return p.row_dst ? p.row_dst[prow] : (prow < p.out_rows ? prow : -1);
}

/* Plain: column (within its tile of 128) of shared-memory row sr = 16 w + 8 h + g: 16 w +
 * 2 g + h, so that a warp's accumulator rows g and g + 8 hold two adjacent output columns and
 * a lane stores them as one pair (wg_store_cols, no shuffle). */
static __device__ __forceinline__ int wg_plain_col(int sr)
{
    return (sr & ~15) | ((sr & 7) << 1) | ((sr >> 3) & 1);
}

/* Weight row (within the expert) of shared-memory row sr of the CTA's 128, or -1.
 * Gated: sr = 64 v + 16 w + 8 h + g -> column c = ctile*64 + 32 v + 8 w + g, gate row c for
 * h = 0, up row n + c for h = 1 (the warp's accumulator rows g and g+8). Plain: ctile*128 +
 * wg_plain_col(sr) where the epilogue is wg_store_cols (PAIRS), else ctile*128 + sr. */
template <bool GATED, bool PAIRS>
static __device__ __forceinline__ int wg_weight_row(int sr, int ctile, int n)
{
    if (GATED) {
        int c = ctile * 64 + 32 * (sr >> 6) + 8 * ((sr >> 4) & 3) + (sr & 7);
        return (sr >> 3) & 1 ? n + c : c;
    }
    int r = ctile * WG_BW + (PAIRS ? wg_plain_col(sr) : sr);
    return r < n ? r : -1;
}

/* Plain epilogue straight from the accumulators of one column tile: token rows 8j + 2t (+1)
 * of the tile, output columns col and col + 1 of this lane (the warp's accumulator rows g and
 * g + 8: col = the tile's first column + 16 w + 2 g, wg_plain_col). srow[r]: byte address of
 * token r's output row (0: none); swt[r]: its multiplier (FOLD: none, p.fold's a rows carry
 * it: the table is not read and no value multiplied). A lane stores its two columns as one
 * pair, so a warp's store writes 16 consecutive bf16 (OBF16) or fp32 columns of 4 token rows:
 * full 32-byte sectors. n % 64 == 0: the columns a lane stores are in or out together. */
template <int NT, bool OBF16, bool FOLD = false>
static __device__ __forceinline__ void wg_store_cols(const float *acc,
                                                     const unsigned long long *srow,
                                                     const float *swt, int col, int n, int t)
{
    constexpr int OSZ = OBF16 ? 2 : 4; /* bytes per output value */
    const uint32_t col_in = col < n;
    const uint32_t cb = (uint32_t)col * OSZ;
    /* tokens 8 j + 2 t and + 1: their rows and multipliers, read one j ahead (the stores of
     * j do not wait for the shared-memory latency of j's table entries) */
    ulonglong2 rp_n = *(const ulonglong2 *)(srow + 2 * t);
    float2 f_n = FOLD ? make_float2(1.f, 1.f) : *(const float2 *)(swt + 2 * t);
#pragma unroll
    for (int j = 0; j < NT / 8; j++) {
        const ulonglong2 rp = rp_n;
        const float2 f = f_n;
        if (j + 1 < NT / 8) {
            rp_n = *(const ulonglong2 *)(srow + 8 * (j + 1) + 2 * t);
            if (!FOLD) f_n = *(const float2 *)(swt + 8 * (j + 1) + 2 * t);
        }
        float v0 = acc[4 * j], v1 = acc[4 * j + 1], v2 = acc[4 * j + 2], v3 = acc[4 * j + 3];
        if (!FOLD) v0 *= f.x, v1 *= f.y, v2 *= f.x, v3 *= f.y;
        if (OBF16) {
            st_global_b32_row(rp.x, cb, pack_bf16x2(v0, v2), col_in);
            st_global_b32_row(rp.y, cb, pack_bf16x2(v1, v3), col_in);
        } else {
            st_global_v2b32_row(rp.x, cb, __float_as_uint(v0), __float_as_uint(v2), col_in);
            st_global_v2b32_row(rp.y, cb, __float_as_uint(v1), __float_as_uint(v3), col_in);
        }
    }
}

/* FC2's per-token multiplier: routing weight x global scale x 128 (undoes the 2^-7 of the
 * dequantization); NULLs: 1. Applied by the plain launch, or with fold by the gated one. */
static __device__ __forceinline__ float wg_row_mul(const float *row_w, const float *gscale,
                                                   int prow, int expert)
{
    return (row_w ? row_w[prow] : 1.f) * 128.f * (gscale ? gscale[expert] : 1.f);
}

/* Plain: the per-token table of wg_store_cols for token rows prow0 .. prow0 + NT, osz bytes
 * per output value (threads < NT write one entry each; read after the next barrier). The
 * multiplier: wg_row_mul, or with fold 1 (a's rows carry it: wg_fold_table). */
template <int NT>
static __device__ __forceinline__ void wg_row_table(const fp4_mma_gemm_args &p, int expert,
                                                    int prow0, unsigned long long *srow,
                                                    float *swt, int osz)
{
    const int tid = threadIdx.x;
    if (tid < NT) {
        const int prow = prow0 + tid, dst = wg_out_row(p, prow);
        srow[tid] = dst >= 0 ? (unsigned long long)((char *)p.out + (size_t)dst * p.n * osz) : 0ull;
        swt[tid] = p.fold ? 1.f : wg_row_mul(p.row_w, p.gscale, prow, expert);
    }
}

/* Gated: the multiplier of token rows prow0 .. prow0 + NT for the epilogue, past the ring
 * (threads < NT; read after the loop's barriers). With fold the plain launch's (wg_row_mul of
 * fold_gscale), else 1: the product is exact and the output the same bit for bit. */
template <int NT>
static __device__ __forceinline__ void wg_fold_table(const fp4_mma_gemm_args &p, int expert,
                                                     int prow0, float *smul)
{
    const int tid = threadIdx.x;
    if (tid < NT)
        smul[tid] = p.fold ? wg_row_mul(p.row_w, p.fold_gscale, prow0 + tid, expert) : 1.f;
}

/* One work unit: NT tokens (padded rows slot0*64 ..) of one expert x nct column tiles of
 * 128 weight rows from ctile0 (gated: nct 1). The ring runs across the column tiles: the
 * copies of tile ct + 1 (its weights, the same token rows again from K tile 0) are in flight
 * while tile ct finishes, and the plain epilogue stores straight from the accumulators in the
 * loop (wg_store_cols), so a CTA fills its pipeline once per unit, not once per column tile. */
template <int NT, bool GATED, bool STRIPS, bool DEEP = false, bool SC = false, bool FOLD = false>
static __device__ __forceinline__ void wg_tile(const fp4_mma_gemm_args &p, unsigned char *sm,
                                               int expert, int slot0, int ctile0, int nct)
{
    constexpr int BCH = (NT * 8 + WG_THREADS - 1) / WG_THREADS; /* 16-byte B chunks per thread
                                                                  per tile (NT 16: half) */
    constexpr bool BALL = NT * 8 % WG_THREADS == 0; /* every thread copies BCH chunks */
    constexpr int BB = NT * 128;              /* B bytes per stage: NT rows x 64 bf16 */
    /* stage = B + W + S rounded up to 1 KB (B stays 1 KB aligned for the 128B swizzle).
     * DC (the DEEP form's 128-token body, DD, or any body with scale chunks, SC): B + W, the
     * scales in NSC slots of WG_DEEP_SC past the stages, each 4 K tiles of the 128 rows (16
     * bytes a row, copied with the stage of the first of the 4: a slot is refilled only from
     * a barrier after its last codes were read, wg_sc_slots) */
    constexpr bool DD = DEEP && GATED && NT >= 128; /* 128, or 144 / 160 with a tail */
    constexpr bool DC = DD || (SC && GATED);          /* ... or any body with scale chunks */
    static_assert(!DEEP || GATED, "DEEP: the gated kernel only");
    static_assert(!SC || GATED, "scale chunks: the gated kernel's bodies");
    static_assert(!FOLD || (STRIPS && !GATED), "FOLD: the strips' stores (p.fold)");
    constexpr int STAGE =
        DC ? BB + WG_W_BYTES : (BB + WG_W_BYTES + WG_S_BYTES + 1023) / 1024 * 1024;
    constexpr int NST = DD ? (NT > 128 ? WG_EXT_ST : WG_DEEP_ST)
                      : DC ? wg_sc_stages(STAGE) /* as below, but 96 tokens: 5 */
                           : WG_RING / STAGE; /* 4 for 128 tokens, 6 for 64: bytes in flight;
                                                 DEEP 5 (4 with a tail) */
    constexpr int NSC = wg_sc_slots(NST); /* DC: scale slots (DEEP's 5 or 4 stages: 2) */
    static_assert(!DD || NST * STAGE + NSC * WG_DEEP_SC <= WG_RING_DEEP, "DEEP ring");
    static_assert(NT * (GATED ? 4 : 12) <= WG_ROWTAB, "the row table past the ring");
    static_assert(!DC || DD || NST * STAGE + NSC * WG_DEEP_SC <= WG_RING, "scale-chunk ring");
    static_assert(!DC || 4 * NSC >= NST + 2 + (NST >= 6), "a scale slot refilled too early");
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
    const int g = lane >> 2, t = lane & 3;
    const int k = p.k, n = p.n, nk = k / WG_BK, n_wrows = GATED ? 2 * n : n;
    /* STRIPS (plain): the bodies up to 96 tokens run nct column tiles, the 128-token one a
     * single tile (the kernel loops over the columns; run as a strip, its column change
     * spilled the copy sources into the loop) */
    constexpr bool STRIP = STRIPS && !GATED && NT < 128;
    const int steps = (STRIP ? nct : 1) * nk;
    const int prow0 = slot0 * 64;
    const uint32_t sbase = smem_u32(sm);
    /* plain: per token, the address of its output row (0: none) and its multiplier, past the
     * ring (read by the epilogue after the loop's barriers) */
    unsigned long long *srow = (unsigned long long *)(sm + WG_RING);
    float *swt = (float *)(srow + NT);
    if (!GATED) wg_row_table<NT>(p, expert, prow0, srow, swt, p.out_bf16 ? 2 : 4);
    /* gated: the rows' multipliers (fold), there too, or past the DEEP form's longer ring */
    float *smul = (float *)(sm + (DD ? WG_RING_DEEP : WG_RING));
    if (GATED) wg_fold_table<NT>(p, expert, prow0, smul);

    /* Copy plan. B: chunk c = tid + 256 i is token row c >> 3, 16-byte part c & 7. The
     * sources point at the next K tile to copy (the ring is filled in K order; a new column
     * tile starts the token rows again from K tile 0). */
    /* OFF32 (the bodies with scale chunks, DEEP's included: gated, one column tile, so the
     * copies run in K order): the sources as 32-bit byte offsets from a_kc, K tile kc of p.a
     * (the launcher's a_rows k < 2^31), and the destinations 4 KB apart (chunk c + 256 is row
     * r + 32, same swizzle). A copy's address is then one 64-bit add to a uniform base, where
     * the 64-bit sources were copied into an aligned pair and stepped: DEEP's pair of steps
     * 334 / 361 / 417 -> 315 / 346 / 339 instructions (128 / 144 / 160 tokens), spills out
     * of the 144 / 160 loops, tid no longer re-read; the 16-64-token bodies' loop of four
     * steps 1-5% shorter. */
    constexpr bool OFF32 = DD || (DC && NT >= 32);
    const uint16_t *b_src[OFF32 ? 1 : BCH];
    uint32_t b_off[OFF32 ? BCH : 1];
    uint32_t b_dst[BCH];
    int b_bytes[BCH];
#pragma unroll
    for (int i = 0; i < BCH; i++) {
        int c = tid + WG_THREADS * i, r = c >> 3, j = c & 7, prow = prow0 + r;
        int src = wg_a_row(p, prow);
        b_bytes[i] = src >= 0 ? 16 : 0;
        if constexpr (OFF32) b_off[i] = ((uint32_t)(src >= 0 ? src : 0) * (uint32_t)k + j * 8) * 2;
        else b_src[i] = p.a + (size_t)(src >= 0 ? src : 0) * k + j * 8;
        b_dst[i] = OFF32 && i > 0 ? b_dst[0] + i * (WG_THREADS / 8 * 128)
                                  : r * 128 + ((j ^ (r & 7)) << 4);
    }
    /* W: row tid >> 1, half tid & 1. S: row tid (threads < 128). aim() points them at K tile 0
     * of column tile ct (rows past the weight rows: row 0 and no bytes). */
    const uint8_t *w_src, *s_src = 0;
    int w_bytes, s_bytes = 0, l_kt = 0, l_ct = ctile0;
    auto aim = [&](int ct) {
        const int wr = wg_weight_row<GATED, STRIP>(tid >> 1, ct, n);
        w_bytes = wr >= 0 ? 16 : 0;
        w_src = p.wq + fp4_wq_row((size_t)expert * n_wrows + (wr >= 0 ? wr : 0), k) +
                (tid & 1) * 16; /* the tiled codes (gpu_pack.h) */
        if (tid < WG_BW) {
            const int sr = wg_weight_row<GATED, STRIP>(tid, ct, n);
            s_bytes = sr >= 0 ? 4 : 0;
            s_src = p.ws + ((size_t)expert * n_wrows + (sr >= 0 ? sr : 0)) * (k / 16);
        }
    };
    aim(l_ct);
    /* The next K tile (kc: its index; DC bodies are gated, one column tile, so the copies run
     * in K order from 0 and kc counts them) into the stage at byte offset off. */
    const char *a_kc = (const char *)p.a; /* OFF32: K tile kc of p.a (a running pointer:
                                              from kc, the compiler formed each address in
                                              64 bits from the offset and kc, 4 instructions) */
    auto load_stage = [&](uint32_t off, int kc) {
        const uint32_t base = sbase + off;
#pragma unroll
        for (int i = 0; i < BCH; i++)
            if (BALL || tid + WG_THREADS * i < NT * 8) {
                if constexpr (OFF32) {
                    cp_async16(base + b_dst[i], a_kc + b_off[i], b_bytes[i]);
                } else {
                    cp_async16(base + b_dst[i], b_src[i], b_bytes[i]);
                    b_src[i] += WG_BK;
                }
            }
        if constexpr (OFF32) a_kc += WG_BK * 2;
        cp_async16(base + BB + tid * 16, w_src, w_bytes);
        w_src += FP4_WQ_TILE;
        if (DC) { /* K tiles kc .. kc + 3: their scales into slot (kc / 4) % NSC */
            if (tid < WG_BW && (kc & 3) == 0) {
                cp_async16(sbase + NST * STAGE + ((kc >> 2) & (NSC - 1)) * WG_DEEP_SC +
                               tid * 16,
                           s_src, s_bytes * 4);
                s_src += 4 * (WG_BK / 16);
            }
        } else if (tid < WG_BW) {
            cp_async4(base + BB + WG_W_BYTES + tid * 4, s_src, s_bytes);
            s_src += WG_BK / 16;
        }
        if (STRIP && ++l_kt == nk) { /* the next column tile */
            l_kt = 0;
#pragma unroll
            for (int i = 0; i < BCH; i++)
                if constexpr (!OFF32) b_src[i] -= k;
            aim(++l_ct);
        }
    };

    const int rg = 64 * wg + 16 * wq + g; /* the warp's first weight row */
    /* the codes of the K tile kt in the stage at off */
    auto codes = [&](uint32_t off, int kt) {
        if (!DC) return wg_load_codes(sm + off + BB, rg, t);
        const unsigned char *w = sm + off + BB;
        const unsigned char *sc =
            sm + NST * STAGE + ((kt >> 2) & (NSC - 1)) * WG_DEEP_SC + (kt & 3) * 4;
        wg_codes c;
        c.q0 = *(const uint2 *)(w + rg * 32 + t * 8);
        c.q1 = *(const uint2 *)(w + (rg + 8) * 32 + t * 8);
        c.s0 = *(const uint32_t *)(sc + rg * 16);
        c.s1 = *(const uint32_t *)(sc + (rg + 8) * 16);
        return c;
    };

    float acc[NT / 2]; /* each column tile's first wgmma starts it (acc_in 0) */
#pragma unroll
    for (int i = 0; i < NT / 2; i++) acc[i] = 0.f;
    /* With a tail (NT > 128: 72 or 80 accumulators) one buffer of A fragments: two would leave
     * ptxas short of registers, and it then serializes every wgmma of the kernel (C7512).
     * There each k16 step's wgmma is a group of its own, and step s + 1's fragment kk is
     * written once step s's group kk has retired (the copies and the barrier run under
     * them, and the later groups under the first fragments' dequantization). */
    constexpr bool ONEBUF = NT > 128;
    uint32_t abuf0[4][4], abuf1_[4][4];
    uint32_t(&abuf1)[4][4] = ONEBUF ? abuf0 : abuf1_;

    /* Step s (plain: column tile ctile0 + s / nk, K tile s % nk): issue its wgmmas (A = cur),
     * retire step s-1's, publish, refill, dequantize step s+1 into nxt while s's wgmmas run;
     * the last K tile of a column tile retires its wgmmas and stores (plain) before the next
     * tile's first. With 6 or more stages (NT <= 64) a barrier publishes two stages at even s
     * (s+1, s+2) and refills the two that s-2 and s-1 used: half the barriers, and the proxy
     * fence (a MEMBAR that waits for this thread's copies still in flight) finds the youngest
     * copies two steps old instead of one. With 4 or 5 stages, one per step (with 5, two per
     * barrier would wait for copies issued only 2 steps earlier instead of 4). */
    constexpr int PUB = NST >= 6 ? 2 : 1; /* stages published per barrier */
    constexpr int PRE = NST - 1 - PUB;    /* stages loaded before the loop, after stage 0 */
#pragma unroll
    for (int st = 0; st <= PRE; st++) {
        if (st < steps) load_stage(st * STAGE, st);
        cp_async_commit();
    }
    cp_async_wait<PRE>();
    fence_proxy_async();
    __syncthreads();
    wg_dequant(codes(0, 0), abuf0);

    /* The codes of step s+1 are read as soon as its stage is published: at the top when an
     * earlier barrier published it (the odd steps with PUB 2), else right after this step's
     * barrier, before the copies are issued. With 80 tokens or more (64 accumulators and
     * more) the live codes would spill: there they are read after the copies. */
    constexpr bool EARLY = NT <= 64;
    uint32_t o_cur = 0; /* byte offset of step s's stage */
    int c_kt = 0; /* step s's K tile */
    int c_col = ctile0 * WG_BW + 64 * wg + 16 * wq + 2 * g; /* plain: the lane's first column */
    auto step = [&](int s, uint32_t(&cur)[4][4], uint32_t(&nxt)[4][4], bool publish,
                    bool tail) __attribute__((always_inline)) { /* a call: C7510 */
        const uint32_t o_nxt = o_cur + STAGE == NST * STAGE ? 0u : o_cur + STAGE;
        /* gated: one column tile, step s is K tile s (so that the unrolled loop below knows
         * s % 4 from s) */
        const int kt = GATED ? s : c_kt;
        c_kt = GATED ? s + 1 : kt + 1 == nk ? 0 : kt + 1;
        wg_codes c1;
        if (!publish && (!tail || s + 1 < steps)) c1 = codes(o_nxt, c_kt);
        const uint64_t desc = wg_desc(sbase + o_cur);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            wg_mma<NT>::run(acc, cur[kk], desc + 2 * kk, GATED || kk > 0 || kt > 0);
            if (ONEBUF) wgmma_commit(); /* a group per k16 step */
        }
        if (!ONEBUF) wgmma_commit();
        if (ONEBUF) {
            wgmma_wait<4>(); /* step s - 1's groups */
        } else if (STRIP && kt == nk - 1) { /* the column tile's last K tile: store it */
            wgmma_wait<0>();
            wg_fence_acc<NT / 2>(acc);
            if (p.out_bf16) wg_store_cols<NT, true, FOLD>(acc, srow, swt, c_col, n, t);
            else wg_store_cols<NT, false, FOLD>(acc, srow, swt, c_col, n, t);
            c_col += WG_BW;
        } else {
            wgmma_wait<1>();
        }
        if (publish) { /* every step (PUB 1) or even s (PUB 2; a constant after inlining) */
            /* committed: stages 0 .. s + PRE; wanted: up to s + PUB */
            cp_async_wait<PRE - PUB>();
            fence_proxy_async();
            __syncthreads();
            if (EARLY && (!tail || s + 1 < steps)) c1 = codes(o_nxt, c_kt);
#pragma unroll
            for (int i = 0; i < PUB; i++) {
                const int ks = s + NST - PUB + i; /* into the stage of s - PUB + i */
                const int o = (int)o_cur - (PUB - i) * STAGE;
                if (!tail || ks < steps) load_stage(o < 0 ? o + NST * STAGE : o, ks);
                cp_async_commit();
            }
        }
        if (!EARLY && publish && (!tail || s + 1 < steps)) c1 = codes(o_nxt, c_kt);
        if (!tail || s + 1 < steps) wg_dequant<ONEBUF>(c1, nxt); /* ONEBUF: nxt is cur */
        o_cur = o_nxt;
    };
    /* The steps run in pairs. With tail false (a constant after inlining) neither step of a
     * pair is past the last (s + 1 < steps) nor copies past it (ks <= s + NST < steps): those
     * tests and their branches go from the main loop, and the last NST or so steps run with
     * them. PEEL: the bodies up to 64 tokens, whose loops lose 10-15% of their instructions
     * (16 tokens: 267 -> 240 per pair). The strips' loop called a function once its copy was
     * there (C7510: every wgmma of the kernel serialized); peeling the 128-token bodies too
     * added spills to every kernel and serialized the BIG kernel's wgmmas (C7512). */
    constexpr bool PEEL = NT <= 64 && !STRIP;
    int s = 0;
    if constexpr (PEEL && DC) {
        /* Four steps an iteration from s = 0: s % 4 is a constant in each, so the scale-chunk
         * copy (K tiles 4j) and the scale reads' offset within a chunk are too, instead of a
         * predicated copy and run-time offsets in every step: 16 -> 64 tokens, 32.1-35.4 ->
         * 27.4-30.4 instructions a wgmma in the loop; H200, the layer at M = 192 / 256 / 512 /
         * 1024 top-8 -2.4 / -2.2 / -1.5 / -0.5%, top-4 512 / 1024 -2.3 / -0.9% (bench/NOTES.md
         * forty-first session). Both step and the kernel's small-unit dispatch are inlined by
         * force: left to the inliner, the dispatch became a call (C7510). */
        int q = 0;
        for (; 4 * q + 2 + NST < steps; q++) {
            step(4 * q, abuf0, abuf1, true, false);
            step(4 * q + 1, abuf1, abuf0, PUB == 1, false);
            step(4 * q + 2, abuf0, abuf1, true, false);
            step(4 * q + 3, abuf1, abuf0, PUB == 1, false);
        }
        s = 4 * q;
    }
    if constexpr (PEEL) {
        for (; s + NST < steps; s += 2) {
            step(s, abuf0, abuf1, true, false);
            step(s + 1, abuf1, abuf0, PUB == 1, false);
        }
    }
    for (; s < steps; s += 2) {
        step(s, abuf0, abuf1, true, true);
        if (s + 1 < steps) step(s + 1, abuf1, abuf0, PUB == 1, true);
    }
    wgmma_wait<0>();
    cp_async_wait<0>();
    __syncthreads();

    /* Gated epilogue. acc[4j + c]: accumulator row g (c < 2) or g+8 (c >= 2) of this warp,
     * token 8j + 2t + (c & 1). Each warp holds gate and up rows of the same 8 columns, so the
     * activation is thread-local; bf16 staged in shared memory, 16-byte stores. */
    if (GATED) {
        const float gs_g = 128.f * (p.gscale ? p.gscale[2 * expert] : 1.f); /* undo 2^-7 */
        const float gs_u = 128.f * (p.gscale ? p.gscale[2 * expert + 1] : 1.f);
        __nv_bfloat16 *so = (__nv_bfloat16 *)sm; /* [NT][72] */
        const int c = 32 * wg + 8 * wq + g;
#pragma unroll
        for (int j = 0; j < NT / 8; j++) {
            int tok = 8 * j + 2 * t;
            const float2 f = *(const float2 *)(smul + tok); /* the rows' fold multipliers */
            so[tok * 72 + c] = __float2bfloat16_rn(
                act_fn(p.act, p.limit, p.alpha, acc[4 * j] * gs_g, acc[4 * j + 2] * gs_u) * f.x);
            so[(tok + 1) * 72 + c] = __float2bfloat16_rn(
                act_fn(p.act, p.limit, p.alpha, acc[4 * j + 1] * gs_g, acc[4 * j + 3] * gs_u) *
                f.y);
        }
        __syncthreads();
        uint16_t *out = (uint16_t *)p.out;
#pragma unroll
        for (int i = 0; i < BCH; i++) {
            int cc = tid + WG_THREADS * i, r = cc >> 3, j = cc & 7, prow = prow0 + r;
            if ((BALL || r < NT) && prow < p.out_rows)
                *(uint4 *)(out + (size_t)prow * n + ctile0 * 64 + j * 8) =
                    *(const uint4 *)(so + r * 72 + j * 8);
        }
    } else if (!STRIP && p.out_bf16) {
        /* bf16 rows, each value times its token's multiplier first (rounded once, as the
         * fp32 path's store): staged [NT][136], a warp stores two rows of 256 bytes per
         * iteration in 16-byte pieces. */
        __nv_bfloat16 *so = (__nv_bfloat16 *)sm;
        const int c = 64 * wg + 16 * wq + g;
#pragma unroll
        for (int j = 0; j < NT / 8; j++) {
            int tok = 8 * j + 2 * t;
            const float f0 = swt[tok], f1 = swt[tok + 1];
            so[tok * 136 + c] = __float2bfloat16_rn(acc[4 * j] * f0);
            so[(tok + 1) * 136 + c] = __float2bfloat16_rn(acc[4 * j + 1] * f1);
            so[tok * 136 + c + 8] = __float2bfloat16_rn(acc[4 * j + 2] * f0);
            so[(tok + 1) * 136 + c + 8] = __float2bfloat16_rn(acc[4 * j + 3] * f1);
        }
        __syncthreads();
        const int col = ctile0 * WG_BW + 8 * (lane & 15);
        for (int r = 2 * (tid >> 5) + (lane >> 4); r < NT; r += WG_THREADS / 16) {
            const unsigned long long rp = srow[r];
            if (!rp || col >= n) continue;
            *(uint4 *)(rp + (size_t)col * 2) = *(const uint4 *)(so + r * 136 + 8 * (lane & 15));
        }
    } else if (!STRIP) {
        float *so = (float *)sm; /* [NT][132] */
        const int c = 64 * wg + 16 * wq + g;
#pragma unroll
        for (int j = 0; j < NT / 8; j++) {
            int tok = 8 * j + 2 * t;
            so[tok * 132 + c] = acc[4 * j];
            so[(tok + 1) * 132 + c] = acc[4 * j + 1];
            so[tok * 132 + c + 8] = acc[4 * j + 2];
            so[(tok + 1) * 132 + c + 8] = acc[4 * j + 3];
        }
        __syncthreads();
        const int col = ctile0 * WG_BW + 4 * lane;
        for (int r = tid >> 5; r < NT; r += WG_THREADS / 32) {
            const unsigned long long rp = srow[r];
            if (!rp || col >= n) continue;
            const float f = swt[r];
            float4 v = *(const float4 *)(so + r * 132 + 4 * lane);
            v.x *= f, v.y *= f, v.z *= f, v.w *= f;
            *(float4 *)(rp + (size_t)col * 4) = v;
        }
    } else {
        fence_proxy_async(); /* the wgmma reads of the ring before the next unit's copies */
    }
    __syncthreads(); /* the ring (and the row table) are the next unit's */
}

/* Plain (FC2) work unit with short K (k <= WG_RES_K): NT tokens of one expert (a slot of
 * <= 64, or with RING = WG_RING128 a pair of 128) x nct column tiles of 128 weight rows from
 * ctile0. The token tile is copied once and stays resident (nk K tiles of B: 48 KB at most
 * for 64 tokens, 96 KB for 128); only weights stream, through a ring of W + S stages (RING
 * bytes less the tile and the row table) that runs across the column tiles, so the copies of
 * tile ct + 1 are in flight while tile ct finishes and its epilogue stores. Epilogue straight
 * from the accumulators (wg_store_cols).
 * NK > 0: k == NK * WG_BK, n % WG_BW == 0 and p.fold (the launcher's check; FC2 of the tp8
 * shapes, k = 384: NK 6), so its stores multiply nothing (wg_store_cols' FOLD; the run-time
 * loop multiplies by 1). The loop then runs a column tile's NK steps unrolled, so every K
 * tile, the B descriptor, the epilogue's step and each copy's place (which column tile ahead,
 * which K tile) are constants; the copies come from one pair of sources per column tile at
 * constant offsets, with no row masks; where NK % NST == 0 (the 128-token body's 3 stages)
 * the stage offsets too. The same wgmmas on the same operands in the same order: the output
 * is the run-time loop's bit for bit (fp4_sm90_wgmma_set_k_unroll). */
template <int NT, bool OBF16, int RING, int NK>
static __device__ __forceinline__ void wg_res(const fp4_mma_gemm_args &p, unsigned char *sm,
                                              int expert, int slot0, int ctile0, int nct)
{
    constexpr int BCH = (NT * 8 + WG_THREADS - 1) / WG_THREADS;
    constexpr bool BALL = NT * 8 % WG_THREADS == 0;
    constexpr int BB = NT * 128;                            /* B bytes per K tile */
    constexpr int BRES = WG_RES_K / WG_BK * BB;             /* resident B, 1 KB multiple */
    constexpr int STAGE = WG_W_BYTES + WG_S_BYTES;          /* W + S of one K tile */
    constexpr int NST = (RING - BRES - NT * 12) / STAGE;    /* WG_RING: 7 (NT 64) .. 15 (16);
                                                               WG_RING128: 3 (128) .. 19 (32) */
    constexpr int OSZ = OBF16 ? 2 : 4;                      /* bytes per output value */
    static_assert(NST >= 3, "ring too short");
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
    const int g = lane >> 2, t = lane & 3;
    const int k = p.k, n = p.n, nk = k / WG_BK, steps = nct * nk;
    const int prow0 = slot0 * 64;
    const uint32_t sbase = smem_u32(sm), rbase = sbase + BRES;
    /* per token: the address of its output row (0: none) and its multiplier */
    unsigned long long *srow = (unsigned long long *)(sm + BRES + NST * STAGE);
    float *swt = (float *)(srow + NT);

    wg_row_table<NT>(p, expert, prow0, srow, swt, OSZ);
    /* The next copy: K tile l_kt of column tile l_ct; W: row tid >> 1 of the column tile, half
     * tid & 1; S: row s_row = 16 w + lane of warp w's lanes 0-15 (s_copy); rows past n: row 0
     * and no bytes. So each warp copies exactly the rows it dequantizes (rg, rg + 8: W from
     * threads 32 w .. 32 w + 31, S from its lanes 0-15) and the ring needs no CTA barrier:
     * a warp waits for its own copies and syncs its lanes (head). Up to 64 tokens the
     * sources are pointers that advance by one K tile per copy (aim() points them at K tile 0
     * of a column tile). In the 128-token body they are computed from the two counters at each
     * copy: kept from copy to copy they spilled (5 local loads per step, on the path from the
     * barrier to the copies). TIGHT: that body, 64 accumulators and 32 A registers of 128. */
    constexpr bool TIGHT = NT > 64;
    const int s_row = 16 * (tid >> 5) + (lane & 15);
    const bool s_copy = lane < 16;
    int l_kt = 0, l_ct = ctile0;
    const uint8_t *w_src = 0, *s_src = 0;
    int w_bytes = 0, s_bytes = 0;
    auto aim = [&](int ct) {
        const int wr = ct * WG_BW + wg_plain_col(tid >> 1),
                  sr = ct * WG_BW + wg_plain_col(s_row);
        w_bytes = wr < n ? 16 : 0;
        s_bytes = sr < n ? 4 : 0;
        w_src = p.wq + fp4_wq_row((size_t)expert * n + (wr < n ? wr : 0), k) + (tid & 1) * 16;
        s_src = p.ws + ((size_t)expert * n + (sr < n ? sr : 0)) * (k / 16);
    };
    if constexpr (!TIGHT && NK == 0) aim(l_ct);
    /* NK: the W and S sources of K tile 0 of column tile ct (from ctile0, one column tile a
     * time); column tile ct + d, K tile kc is d CTW + kc FP4_WQ_TILE (d CTS + kc WG_BK / 16)
     * further (gpu_pack.h: 128 rows are 16 whole 8-row blocks) */
    static_assert(NK == 0 || (NK % 2 == 0 && NK * WG_BK <= WG_RES_K), "NK: even, k <= WG_RES_K");
    constexpr long long CTW = (long long)WG_BW * NK * WG_BK / 2, CTS = WG_BW * NK * WG_BK / 16;
    const uint8_t *cw = 0, *cs = 0;
    if constexpr (NK > 0) {
        const size_t r0 = (size_t)expert * n + (size_t)ctile0 * WG_BW;
        cw = p.wq + fp4_wq_row(r0 + wg_plain_col(tid >> 1), k) + (tid & 1) * 16;
        cs = p.ws + (r0 + wg_plain_col(s_row)) * (k / 16);
    }
    auto load_at = [&](uint32_t off, int d, int kc) __attribute__((always_inline)) {
        cp_async16(rbase + off + tid * 16, cw + d * CTW + kc * FP4_WQ_TILE, 16);
        if (s_copy)
            cp_async4(rbase + off + WG_W_BYTES + s_row * 4, cs + d * CTS + kc * (WG_BK / 16), 4);
    };
    auto load_next = [&](uint32_t off) { /* the next step's weights into the stage at off */
        if constexpr (TIGHT) {
            const int wr = l_ct * WG_BW + wg_plain_col(tid >> 1),
                      sr = l_ct * WG_BW + wg_plain_col(s_row);
            const size_t e_row = (size_t)expert * n;
            cp_async16(rbase + off + tid * 16,
                       p.wq + fp4_wq_row(e_row + (wr < n ? wr : 0), k) + l_kt * FP4_WQ_TILE +
                           (tid & 1) * 16,
                       wr < n ? 16 : 0);
            if (s_copy)
                cp_async4(rbase + off + WG_W_BYTES + s_row * 4,
                          p.ws + (e_row + (sr < n ? sr : 0)) * (k / 16) + l_kt * (WG_BK / 16),
                          sr < n ? 4 : 0);
            if (++l_kt == nk) l_kt = 0, l_ct++;
        } else {
            cp_async16(rbase + off + tid * 16, w_src, w_bytes);
            if (s_copy) cp_async4(rbase + off + WG_W_BYTES + s_row * 4, s_src, s_bytes);
            if (++l_kt == nk) l_kt = 0, aim(++l_ct);
            else w_src += FP4_WQ_TILE, s_src += WG_BK / 16;
        }
    };
    auto next_stage = [](uint32_t off) { return off + STAGE == NST * STAGE ? 0u : off + STAGE; };
    /* The token tile, every K tile, with the first weight stage (B chunk c = tid + 256 i: row
     * c >> 3, 16-byte part c & 7, 128-byte swizzle as in wg_tile). */
#pragma unroll
    for (int i = 0; i < BCH; i++) {
        int c = tid + WG_THREADS * i, r = c >> 3, j = c & 7, prow = prow0 + r;
        if (!BALL && c >= NT * 8) continue;
        int src = wg_a_row(p, prow);
        const uint16_t *b_src = p.a + (size_t)(src >= 0 ? src : 0) * k + j * 8;
        const uint32_t b_dst = sbase + r * 128 + ((j ^ (r & 7)) << 4);
        for (int kt = 0; kt < nk; kt++)
            cp_async16(b_dst + kt * BB, b_src + kt * WG_BK, src >= 0 ? 16 : 0);
    }
    const int rg = 64 * wg + 16 * wq + g;

    float acc[NT / 2]; /* each column tile's first wgmma starts it (acc_in 0) */
#pragma unroll
    for (int i = 0; i < NT / 2; i++) acc[i] = 0.f;
    uint32_t abuf0[4][4], abuf1[4][4];
#pragma unroll
    for (int st = 0; st < NST; st++) {
        if (st < steps) {
            if constexpr (NK > 0) load_at(st * STAGE, st / NK, st % NK);
            else load_next(st * STAGE);
        }
        cp_async_commit();
    }
    cp_async_wait<NST - 1>();
    fence_proxy_async();
    __syncthreads();
    wg_dequant(wg_load_codes(sm + BRES, rg, t), abuf0);

    /* Step s (column tile ctile0 + s / nk, K tile s % nk): as wg_tile's step, with B at K
     * tile kt of the resident copy; the last K tile of a column tile retires its wgmmas and
     * stores before the next tile's first. */
    int c_kt = 0; /* this step's K tile */
    int c_col = ctile0 * WG_BW + 64 * wg + 16 * wq + 2 * g; /* the lane's first column */
    uint32_t o_cur = 0; /* the stage of step s (its codes were read at step s - 1) */
    /* A step's head (K tile kt, A = cur): its wgmmas, then those of the step before retired
     * (the column tile's last K tile: its own too, and the epilogue), then the barrier. */
    auto head = [&](int kt, uint32_t(&cur)[4][4]) __attribute__((always_inline)) {
        const uint64_t desc = wg_desc(sbase + kt * BB);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wg_mma<NT>::run(acc, cur[kk], desc + 2 * kk, kk > 0 || kt > 0);
        wgmma_commit();
        if (kt == (NK > 0 ? NK : nk) - 1) {
            wgmma_wait<0>();
            wg_fence_acc<NT / 2>(acc);
            wg_store_cols<NT, OBF16, (NK > 0)>(acc, srow, swt, c_col, n, t);
            c_col += WG_BW;
        } else {
            wgmma_wait<1>();
        }
        /* The ring holds W and S only, read by ld.shared (generic proxy): no proxy fence. A
         * warp reads only what its own lanes copied (load_next), so its lanes' own waits and a
         * warp barrier publish step s + 1 to it, and the stage of step s (read by this warp at
         * step s - 1) is free for the copies of step s + NST after that barrier: a copy has
         * two steps to land with 3 stages (the 128-token body), not one. No CTA barrier: the
         * warpgroups run apart between a unit's start and end. */
        cp_async_wait<NST - 2>(); /* committed: up to step s + NST - 1; wanted: s + 1 */
        __syncwarp();
    };
    auto step = [&](int s, uint32_t(&cur)[4][4], uint32_t(&nxt)[4][4], bool tail) {
        const int kt = c_kt;
        c_kt = kt + 1 == nk ? 0 : kt + 1;
        head(kt, cur);
        /* The next step's codes are read before the copies are issued (their latency hides
         * behind them), but after them in the 128-token body: live across the copies they
         * spilled the copy state there (6 local loads and 2 stores per step). */
        const uint32_t o_nxt = next_stage(o_cur);
        wg_codes c1;
        if (!TIGHT && (!tail || s + 1 < steps)) c1 = wg_load_codes(sm + BRES + o_nxt, rg, t);
        if (!tail || s + NST < steps) load_next(o_cur);
        cp_async_commit();
        if (TIGHT && (!tail || s + 1 < steps)) c1 = wg_load_codes(sm + BRES + o_nxt, rg, t);
        o_cur = o_nxt;
        if (!tail || s + 1 < steps) wg_dequant(c1, nxt);
    };
    if constexpr (NK > 0) {
        /* Step kt of column tile ct (copy: step s + NST is in this CTA's range; more: step s + 1
         * is): as step above with kt, the stage (SST) and the copy's column tile d ahead and K
         * tile a constant. */
        constexpr bool SST = NK % NST == 0;
        auto ustep = [&](int kt, uint32_t(&cur)[4][4], uint32_t(&nxt)[4][4], bool copy,
                         bool more) __attribute__((always_inline)) {
            head(kt, cur);
            const uint32_t oc = SST ? kt % NST * STAGE : o_cur;
            const uint32_t on = SST ? (kt + 1) % NST * STAGE : next_stage(o_cur);
            wg_codes c1;
            if (!TIGHT && more) c1 = wg_load_codes(sm + BRES + on, rg, t);
            if (copy) load_at(oc, (kt + NST) / NK, (kt + NST) % NK);
            cp_async_commit();
            if (TIGHT && more) c1 = wg_load_codes(sm + BRES + on, rg, t);
            if (!SST) o_cur = on;
            if (more) wg_dequant(c1, nxt);
        };
        for (int ct = 0; ct < nct; ct++) {
            const int left = (nct - ct) * NK; /* steps from this tile's first on */
#pragma unroll
            for (int kt = 0; kt < NK; kt += 2) {
                ustep(kt, abuf0, abuf1, kt + NST < left, true);
                ustep(kt + 1, abuf1, abuf0, kt + 1 + NST < left, kt + 2 < left);
            }
            cw += CTW;
            cs += CTS;
        }
    } else {
        /* As in wg_tile: the pairs of steps that need no test (s + 1 + NST < steps: both
         * copy), then the rest with the tests. Up to 64 tokens (16 tokens: 390 -> 374
         * instructions per pair); the 128-token body (the BIG kernel) keeps one loop
         * (wg_tile's note). */
        constexpr bool PEEL = NT <= 64;
        int s = 0;
        if constexpr (PEEL) {
            for (; s + 1 + NST < steps; s += 2) {
                step(s, abuf0, abuf1, false);
                step(s + 1, abuf1, abuf0, false);
            }
        }
        for (; s < steps; s += 2) {
            step(s, abuf0, abuf1, true);
            if (s + 1 < steps) step(s + 1, abuf1, abuf0, true);
        }
    }
    wgmma_wait<0>(); /* retired at the last step already; ptxas cannot tell */
    cp_async_wait<0>();
    fence_proxy_async(); /* the wgmma reads of the resident tile before the next unit's copies */
    __syncthreads();     /* the resident tile and ring are the next unit's */
}

#endif /* FP4_WG_SM90 */

#ifdef FP4_WG_SM90
/* The rule of an expert's tail (EXT, the DEEP kernel): the even slot s is one when slots
 * s - 2, s - 1 and s hold the same expert (e_a, e_b, e_s), row 48 of slot s - 1 is in use
 * (so the unit before s is a pair of 128 tokens) and the rows in use of s are 1 .. 32 (row 0
 * in use, row 32 not). That pair then runs 144 tokens (row 16 of s not in use) or 160, the
 * tail's rows included (a slot's rows follow the previous slot's in the padded row space):
 * the width returned, 0 for no tail. The tail's unit runs nothing: its weights are
 * dequantized once instead of twice. Both units evaluate this on the same table entries,
 * so they agree for any table (an odd slot is never a tail). H200, layer, skipping the
 * tails' units altogether (wrong numbers, a bound): -17.6% at M=2048 top-8, -10.3% at
 * 4096, -16.4% at top-4 M=4096; the 144-token form against none: -5.3 / -3.3 / -5.3%, and
 * 160 beside it: -2.1 / -0.6 / -2.4% more (2026-12-01, bench/NOTES.md twenty-eighth
 * session). */
static __device__ __forceinline__ int wg_tail(int e_a, int e_b, int e_s, int row_b48, int row0,
                                              int row16, int row32)
{
    if (!(e_s >= 0 && e_a == e_s && e_b == e_s && row_b48 >= 0 && row0 >= 0 && row32 < 0))
        return 0;
    return row16 < 0 ? 144 : 160;
}

/* Unit `unit` of a launch: slots 2 unit and 2 unit + 1. pair(e, s0, nt) when both hold
 * tokens of expert e (one tile of nt = 128, 96 or 80 tokens: the first slot full, the second
 * holding more than 32, 17-32 or 1-16), else alone(e, s, nt) for each slot in use, nt = 64,
 * 48, 32, 24 or 16: a slot's rows in use are a prefix (the grouping fills an expert's
 * segment from its start), so rows 16, 24, 32 and 48 tell how many. The second slot of an
 * expert's last pair may be empty: then the first runs alone. EXT (the DEEP kernel): a pair
 * followed by its expert's tail runs as 144 or 160 tokens and the tail's unit nothing
 * (wg_tail). */
template <bool EXT, class Pair, class Alone>
static __device__ __forceinline__ void wg_unit(const fp4_mma_gemm_args &p, int unit, Pair pair,
                                               Alone alone)
{
    const int s0 = 2 * unit, s1 = s0 + 1;
    int e0, e1;
    if (p.tile_expert) {
        e0 = p.tile_expert[s0];
        e1 = s1 < p.n_tiles_m ? p.tile_expert[s1] : -1;
    } else {
        e0 = (long long)s0 * 64 < p.a_rows ? 0 : -1;
        e1 = s1 < p.n_tiles_m && (long long)s1 * 64 < p.a_rows ? 0 : -1;
    }
    /* Rows 0, 16, 24, 32 and 48 of both slots in use? Loaded together (one latency, not a
     * chain of dependent loads). */
    const int32_t *rmap = p.row_src ? p.row_src : p.row_dst; /* -1: padding */
    const int off[5] = {0, 16, 24, 32, 48};
    const long long r0 = (long long)s0 * 64, r1 = (long long)s1 * 64;
    const bool has1 = s1 < p.n_tiles_m;
    int v0[5], v1[5];
#pragma unroll
    for (int i = 0; i < 5; i++) {
        v0[i] = rmap ? rmap[r0 + off[i]] : (r0 + off[i] < p.a_rows ? 0 : -1);
        v1[i] = !has1 ? -1 : rmap ? rmap[r1 + off[i]] : (r1 + off[i] < p.a_rows ? 0 : -1);
    }
    int n0 = 0, n1 = 0; /* probes in use: a count, since the rows in use are a prefix */
#pragma unroll
    for (int i = 0; i < 5; i++) n0 += v0[i] >= 0, n1 += v1[i] >= 0;
    auto width = [](int n) { return n >= 5 ? 64 : n == 4 ? 48 : n == 3 ? 32 : n == 2 ? 24 : 16; };
    /* EXT: is slot s0 + 2 a tail that this pair runs, or s0 one that the pair before runs
     * (wg_tail)? */
    int tail_next = 0, tail_self = 0;
    if (EXT && p.tile_expert && rmap) {
        if (s0 + 2 < p.n_tiles_m) {
            const long long r2 = (long long)(s0 + 2) * 64;
            tail_next = wg_tail(e0, e1, p.tile_expert[s0 + 2], v1[4], rmap[r2], rmap[r2 + 16],
                                rmap[r2 + 32]);
        }
        if (s0 >= 2)
            tail_self = wg_tail(p.tile_expert[s0 - 2], p.tile_expert[s0 - 1], e0,
                                rmap[r0 - 16], v0[0], v0[1], v0[3]);
    }
    if (e0 >= 0 && e0 == e1 && n1 > 0) {
        pair(e0, s0, tail_next ? tail_next : n1 >= 4 ? 128 : n1 >= 2 ? 96 : 80);
    } else {
        if (e0 >= 0 && !tail_self) alone(e0, s0, width(n0));
        if (e1 >= 0 && e1 != e0) alone(e1, s1, width(n1));
    }
}

/* A CTA of either kernel: its shared memory (the dynamic base aligned to 1 KB for the 128-byte
 * swizzle) and its place in the grid (unit, first column tile, column tiles), blocks being
 * units x groups of cols column tiles, group fastest. */
struct wg_cta {
    unsigned char *sm;
    int unit, ctile, nct;
};

static __device__ __forceinline__ wg_cta wg_cta_of(unsigned char *smem_raw, int ny, int cols)
{
    wg_cta c;
    c.sm = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const int nyg = (ny + cols - 1) / cols;
    c.ctile = (int)(blockIdx.x % (unsigned)nyg) * cols;
    c.unit = (int)(blockIdx.x / (unsigned)nyg);
    c.nct = min(cols, ny - c.ctile);
    return c;
}

/* The FC1 -> FC2 hand-off (p.handoff, sm90_w4a16_wgmma.cuh). wg_start: before a CTA reads
 * what an earlier kernel wrote; a plain launch with handoff waits only for the gated CTAs of
 * its unit and of the unit before (thread 0 polls with acquire loads, then a CTA barrier
 * orders every thread's reads after them), any other for the whole previous grid. wg_end: a
 * gated launch's CTA publishes its unit (a barrier after every thread's stores, then thread
 * 0's release add); the plain launch's last CTA waits for the gated grid, so that the plain
 * grid completes after it. */
static __device__ __forceinline__ int wg_ld_acquire(const int32_t *c)
{
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(c) : "memory");
    return v;
}

template <bool GATED>
static __device__ __forceinline__ void wg_start(const fp4_mma_gemm_args &p, int unit)
{
    if (GATED || !p.handoff) {
        fp4_pdl_wait();
    } else {
        if (threadIdx.x == 0) {
            const int need = p.k / 64; /* the gated launch's CTAs per unit (its n / 64) */
            const int32_t *c = p.handoff + (size_t)unit * FP4_GROUP_DONE_STRIDE;
            while (wg_ld_acquire(c) < need) __nanosleep(256);
            if (unit > 0)
                while (wg_ld_acquire(c - FP4_GROUP_DONE_STRIDE) < need) __nanosleep(256);
        }
        __syncthreads();
    }
    fp4_pdl_trigger();
}

template <bool GATED>
static __device__ __forceinline__ void wg_end(const fp4_mma_gemm_args &p, int unit)
{
    if (!p.handoff) return;
    if (GATED) {
        __syncthreads();
        if (threadIdx.x == 0)
            asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(
                             p.handoff + (size_t)unit * FP4_GROUP_DONE_STRIDE)
                         : "memory");
    } else if (blockIdx.x == gridDim.x - 1) {
        fp4_pdl_wait();
    }
}
#endif

/* Grid: units of two consecutive slots x groups of cols column tiles (the launcher's: 1, or
 * WG_COLS with STRIPS), column fastest (the units of one expert and the column tiles of one
 * unit share weights / token rows in L2). STRIPS (plain only): the bodies below 128 tokens run
 * their group as one strip (wg_tile), for up to WG_STRIP_ROWS rows per expert (H200 A/B of
 * 2026-11-30: -4.2 to -4.6% on the layer at 64 rows per expert, -0.5% at 96, but +0.9 to +1.8%
 * at 128-256, where the units are 128-token pairs, so a kernel of its own; the launcher's
 * bound against the BIG form moved to 84 with the tiled codes, and to WG_BIG_ROWS with BIG's
 * unrolled K loop). */
template <bool GATED, bool STRIPS, bool DEEP = false, bool SC = false, bool FOLD = false>
__global__ void __launch_bounds__(WG_THREADS, 2)
fp4_sm90_wgmma_kernel(const __grid_constant__ fp4_mma_gemm_args p, int ny, int cols)
{
#ifdef FP4_WG_SM90
    extern __shared__ unsigned char smem_raw[];
    const wg_cta cta = wg_cta_of(smem_raw, ny, cols);
    unsigned char *sm = cta.sm;
    const int unit = cta.unit, ctile = cta.ctile, nct = cta.nct;
    wg_start<GATED>(p, unit);
    wg_unit<DEEP>(
        p, unit,
        [&](int e, int s, int nt) {
            if constexpr (DEEP) {
                if (nt == 144) {
                    wg_tile<144, GATED, STRIPS, DEEP>(p, sm, e, s, ctile, 1);
                    return;
                }
                if (nt == 160) {
                    wg_tile<160, GATED, STRIPS, DEEP>(p, sm, e, s, ctile, 1);
                    return;
                }
            }
            if (nt == 128 && !STRIPS) wg_tile<128, GATED, STRIPS, DEEP, SC>(p, sm, e, s, ctile, 1);
            else if (nt == 128) /* one column tile per call (wg_tile's STRIP) */
                for (int c = 0; c < nct; c++)
                    wg_tile<128, GATED, STRIPS>(p, sm, e, s, ctile + c, 1);
            else if (nt == 96)
                wg_tile<96, GATED, STRIPS, false, SC, FOLD>(p, sm, e, s, ctile, nct);
            else wg_tile<80, GATED, STRIPS, false, SC, FOLD>(p, sm, e, s, ctile, nct);
        },
        [&](int e, int s, int nt) __attribute__((always_inline)) { /* a call: C7510 */
            if (nt == 64) wg_tile<64, GATED, STRIPS, false, SC, FOLD>(p, sm, e, s, ctile, nct);
            else if (nt == 48)
                wg_tile<48, GATED, STRIPS, false, SC, FOLD>(p, sm, e, s, ctile, nct);
            else if (nt == 32)
                wg_tile<32, GATED, STRIPS, false, SC, FOLD>(p, sm, e, s, ctile, nct);
            else if (nt == 24)
                wg_tile<24, GATED, STRIPS, false, SC, FOLD>(p, sm, e, s, ctile, nct);
            else wg_tile<16, GATED, STRIPS, false, SC, FOLD>(p, sm, e, s, ctile, nct);
        });
    wg_end<GATED>(p, unit);
#else
    __trap(); /* not built for sm_90a: the launcher never gets here (init refuses) */
#endif
}

/* Plain launches with k <= WG_RES_K and rows_per_expert <= WG_RES_ROWS, or (BIG) above
 * WG_BIG_ROWS. Grid: units x groups of cols column tiles (the launcher's WG_RES_COLS,
 * WG_RES_FEW_COLS or WG_COLS), group fastest. Every slot runs its group as one wg_res unit
 * (token tile resident); a pair as two (its weights dequantized twice) or, BIG, as one unit of
 * 128 tokens (96 KB resident, WG_SMEM128: the rows of a pair are copied once per column group
 * instead of once per column tile, as the one-tile kernel does). A slot runs as 64, 48 or 32
 * tokens (<= 32 in use: 32), and with SMALL (up to WG_RES_SMALL rows per expert) also as 24
 * or 16 (the rows in use rounded up as in wg_unit). The 16 / 24 bodies gain 1-2.5% at 14-20
 * rows per expert but cost 0.5-1.5% at 32-48 when in the kernel (A/B of 2026-11-30), hence
 * separate kernels. A kernel of its own, apart from wg_tile's bodies: with them in the same
 * kernel ptxas ran short of registers and serialized every wgmma of the kernel (C7511;
 * wg_res<16> did too before the copy sources and output rows were staged). */
template <bool OBF16, bool SMALL, bool BIG, int NK = 0> /* OBF16: p.out_bf16 as a constant; */
__global__ void __launch_bounds__(WG_THREADS, 2)      /* NK: wg_res's (k == NK * WG_BK) */
fp4_sm90_wgmma_res_kernel(const __grid_constant__ fp4_mma_gemm_args p, int ny, int cols)
{
#ifdef FP4_WG_SM90
    constexpr int RING = BIG ? WG_RING128 : WG_RING;
    extern __shared__ unsigned char smem_raw[];
    const wg_cta cta = wg_cta_of(smem_raw, ny, cols);
    unsigned char *sm = cta.sm;
    const int unit = cta.unit, ctile = cta.ctile, nct = cta.nct;
    wg_start<false>(p, unit);
    wg_unit<false>(
        p, unit,
        [&](int e, int s, int) {
            if constexpr (BIG) {
                wg_res<128, OBF16, RING, NK>(p, sm, e, s, ctile, nct);
            } else {
                wg_res<64, OBF16, RING, NK>(p, sm, e, s, ctile, nct);
                wg_res<64, OBF16, RING, NK>(p, sm, e, s + 1, ctile, nct);
            }
        },
        [&](int e, int s, int nt) {
            if (nt > 48) wg_res<64, OBF16, RING, NK>(p, sm, e, s, ctile, nct);
            else if (nt > 32) wg_res<48, OBF16, RING, NK>(p, sm, e, s, ctile, nct);
            else if (!SMALL || nt > 24) wg_res<32, OBF16, RING, NK>(p, sm, e, s, ctile, nct);
            else if (nt > 16) wg_res<24, OBF16, RING, NK>(p, sm, e, s, ctile, nct);
            else wg_res<16, OBF16, RING, NK>(p, sm, e, s, ctile, nct);
        });
    wg_end<false>(p, unit);
#else
    __trap();
#endif
}

static int wg_ready[WG_MAX_DEVICES];

extern "C" cudaError_t fp4_sm90_wgmma_gemm_init(void)
{
    /* the BIG and DEEP kernels first, without a flag: wg_ready is set only when every kernel
     * is ready. Two of their CTAs need nearly all of the SM's shared memory: ask for the
     * largest carveout. */
    const void *big[5] = {(const void *)fp4_sm90_wgmma_res_kernel<false, false, true>,
                          (const void *)fp4_sm90_wgmma_res_kernel<true, false, true>,
                          (const void *)fp4_sm90_wgmma_res_kernel<true, false, true, WG_NK>,
                          (const void *)fp4_sm90_wgmma_kernel<true, false, true>,
                          (const void *)fp4_sm90_wgmma_kernel<true, false, true, true>};
    cudaError_t err = wg_kernels_init(NULL, big, 5, WG_SMEM128); /* >= WG_SMEM_DEEP */
    for (int i = 0; i < 5 && err == cudaSuccess; i++)
        err = cudaFuncSetAttribute(big[i], cudaFuncAttributePreferredSharedMemoryCarveout,
                                   cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    const void *kern[11] = {(const void *)fp4_sm90_wgmma_kernel<true, false>,
                            (const void *)fp4_sm90_wgmma_kernel<true, false, false, true>,
                            (const void *)fp4_sm90_wgmma_kernel<false, false>,
                            (const void *)fp4_sm90_wgmma_kernel<false, true>,
                            (const void *)fp4_sm90_wgmma_kernel<false, true, false, false, true>,
                            (const void *)fp4_sm90_wgmma_res_kernel<false, false, false>,
                            (const void *)fp4_sm90_wgmma_res_kernel<true, false, false>,
                            (const void *)fp4_sm90_wgmma_res_kernel<false, true, false>,
                            (const void *)fp4_sm90_wgmma_res_kernel<true, true, false>,
                            (const void *)fp4_sm90_wgmma_res_kernel<true, false, false, WG_NK>,
                            (const void *)fp4_sm90_wgmma_res_kernel<true, true, false, WG_NK>};
    return wg_kernels_init(wg_ready, kern, 11, WG_SMEM);
}

/* Scale chunks in the gated bodies below 128 tokens (wg_sc_slots) and the res kernels' K loop
 * unrolled at k == WG_NK * WG_BK: on unless a test turns them off to compare. wg_last: the
 * FP4_WG_RAN_* flags of the last launch (a test's check; relaxed atomics, since every launch
 * writes it). */
static int wg_sc_on = 1, wg_nk_on = 1, wg_last;

extern "C" int fp4_sm90_wgmma_last_launch(void)
{
    return __atomic_load_n(&wg_last, __ATOMIC_RELAXED);
}

extern "C" int fp4_sm90_wgmma_set_scale_chunks(int on)
{
    const int old = wg_sc_on;
    wg_sc_on = on != 0;
    return old;
}

extern "C" int fp4_sm90_wgmma_set_k_unroll(int on)
{
    const int old = wg_nk_on;
    wg_nk_on = on != 0;
    return old;
}

extern "C" int fp4_sm90_wgmma_gemm_serves(const fp4_mma_gemm_args *p)
{
    return p && wg_device_ready(wg_ready) && p->wfmt == FP4_MMA_W_NVFP4 && p->k >= WG_BK &&
           p->k % WG_BK == 0 && p->n >= 64 && p->n % 64 == 0;
}

extern "C" cudaError_t fp4_sm90_wgmma_gemm(const fp4_mma_gemm_args *p, cudaStream_t stream)
{
    __atomic_store_n(&wg_last, 0, __ATOMIC_RELAXED); /* a refused call ran nothing */
    if (!wg_device_ready(wg_ready)) return cudaErrorInvalidDeviceFunction;
    if (!p) return cudaErrorInvalidValue;
    if (p->wfmt != FP4_MMA_W_NVFP4) return cudaErrorNotSupported;
    if (!p->a || !p->out || !p->wq || !p->ws || p->k < WG_BK || p->k % WG_BK || p->n < 64 ||
        p->n % 64 || p->n_tiles_m < 1 || p->n_tiles_m > 0x7fffffff / 64 ||
        (!p->tile_expert && p->row_dst) || ((uintptr_t)p->a & 15) || ((uintptr_t)p->out & 15))
        return cudaErrorInvalidValue;
    long long ny = p->gated ? p->n / 64 : (p->n + WG_BW - 1) / WG_BW;
    /* token tile resident (wg_res) */
    const int res_any = !p->gated && p->k <= WG_RES_K && p->rows_per_expert > 0;
    /* column groups of slots: up to WG_RES_ROWS rows per expert (most experts one slot;
     * above, wg_res's pairs dequantize their weights twice: +4% at 64 rows per expert, the
     * A/B of 2026-11-29, against -2% at 48, -4% at 32 and -7% at 4-16; with the codes in 8-row
     * tiles, 2026-12-01: up to 64 +8.7 / +7.7% at 64, up to 32 +4.6 / +3.9% at 40 / 48; with
     * the unrolled K loop and fold, 2026-12-02: against the strips, up to 56 -3.1 / -2.8% at
     * 52 / 56, top-4 -1.4% at 56; but against BIG, up to 56 +0.2 / -0.2 / +2.1 / +1.4% at 50
     * / 52 / 54 / 56, top-4 -0.6 / +1.6% at 52 / 56) */
    const int res = res_any && p->rows_per_expert <= WG_RES_ROWS;
    /* above WG_BIG_ROWS (k <= WG_RES_K): the res kernel's BIG form, pairs as 128-token units
     * (H200, layer, against the one-tile kernel: -5.0 to -6.8% at 128-1024 rows per expert;
     * 2026-11-30). The bound, against strips: with the codes in 8-row tiles (2026-12-01) BIG
     * +0.6% at 84 rows per expert, -0.7 / -1.0% at 88 (top-8 / top-4), -3.5% at 92, -4.6 /
     * -4.7% at 96, strips -2.6% at 80; with BIG's K loop unrolled and fold (2026-12-02), BIG
     * above 64 against above 84: -1.8 / -1.6 / -1.7 / -2.3 / -3.9% at 68 / 72 / 76 / 80 / 84,
     * top-4 -1.1 / -2.0% at 72 / 80; above 56 against above 64 (strips at 57-64): -3.4 / -2.8
     * / -2.6 / -2.3% at 58 / 60 / 62 / 64, top-4 -2.9 / -2.5 / -1.8% at 58 / 60 / 64, where
     * res up to 64 lost +2.0 / +3.6 / +5.0% at 60 / 62 / 64. So at k <= WG_RES_K no strips:
     * BIG right above res (WG_BIG_ROWS == WG_RES_ROWS). */
    const int big = res_any && p->rows_per_expert > WG_BIG_ROWS;
    /* between (and with longer k up to WG_STRIP_ROWS): column strips (fp4_sm90_wgmma_kernel's
     * STRIPS) */
    const int strips = !p->gated && !res && !big && p->rows_per_expert > 0 &&
                       p->rows_per_expert <= WG_STRIP_ROWS;
    /* column tiles per CTA (the kernels' cols): the res kernel 12 up to 40 rows per expert, 4
     * above (H200, layer, against 4 everywhere: 12 -1.1 to -1.9% at 14-20 rows per expert,
     * -0.6 / -0.7% at 32, +0.4% at 48; 8 about half of that; 2026-11-30. The bound 40 against
     * 32: -1.7 / -2.3 / -1.8% at 34 / 36 / 40 rows (top-8), -2.1% top-4 at 40, 44 unchanged,
     * 12 up to 48 +5.4% at 48; 2026-12-01). Only the strip and
     * res kernels run more than one; the gated and one-tile kernels must get 1 (they run
     * ctile alone). */
    int cols = res ? (p->rows_per_expert <= WG_RES_FEW_ROWS ? WG_RES_FEW_COLS : WG_RES_COLS)
                   : strips || big ? WG_COLS : 1;
    const long long groups = (ny + cols - 1) / cols;
    long long blocks = (long long)fp4_moe_group_units(p->n_tiles_m) * groups;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)blocks);
    const void *kern = (const void *)fp4_sm90_wgmma_kernel<false, false>;
    int smem = WG_SMEM;
    /* gated above WG_DEEP_ROWS rows per expert: the DEEP form (5 stages for the 128-token
     * units; its scales are copied 16 bytes a row, hence k % 256 and ws 16-byte aligned).
     * H200, layer, against the 4-stage form (2026-11-30): -2.1 / -1.8% at 96 rows per expert
     * (M=1536 top-8, M=3072 top-4), -1.9 / -2.1% at 128, -2.9% at 256; but +1.0% at 80 and
     * +5% at 64, where most tiles are narrower and run the common bodies, whose 4-byte scale
     * copies go through an L1 of 28 KB under the DEEP form's carveout. 81-95: not measured.
     * With the scale chunks in every body (2026-12-01) DEEP from 49 rows still lost: +1.3 /
     * +2.3% at 64 rows per expert (top-8 / top-4), +2.2% at 80; so not the L1. */
    /* 16-byte chunks of a row's scales per 4 K tiles (DEEP, and scale chunks below it);
     * those bodies take their token rows from 32-bit byte offsets (wg_tile's OFF32) */
    const int chunks = p->k % 256 == 0 && !((uintptr_t)p->ws & 15) &&
                       (unsigned long long)p->a_rows * (unsigned long long)p->k < (1ull << 31);
    const int deep = p->gated && p->rows_per_expert > WG_DEEP_ROWS && chunks;
    const int sc = p->gated && chunks && wg_sc_on;
    /* the res kernels (bf16 out, fold: as the pipeline's FC2) with the K loop unrolled and no
     * multiplier in their stores: k = 384 */
    const int nk = (res || big) && p->out_bf16 && p->fold && p->k == WG_NK * WG_BK &&
                   p->n % WG_BW == 0 && wg_nk_on;
    __atomic_store_n(&wg_last,
                     (sc ? FP4_WG_RAN_SC : 0) | (deep ? FP4_WG_RAN_DEEP : 0) |
                         (nk ? FP4_WG_RAN_NK : 0),
                     __ATOMIC_RELAXED);
    if (deep) { /* its bodies below 128 tokens with scale chunks too (sc): H200, layer,
                 * -1.3 / -1.4% at 96 rows per expert, -0.2 to -0.5% at 128-256 */
        kern = sc ? (const void *)fp4_sm90_wgmma_kernel<true, false, true, true>
                  : (const void *)fp4_sm90_wgmma_kernel<true, false, true>;
        smem = WG_SMEM_DEEP;
    } else if (sc) { /* below: scale chunks (wg_sc_slots) */
        kern = (const void *)fp4_sm90_wgmma_kernel<true, false, false, true>;
    } else if (p->gated) kern = (const void *)fp4_sm90_wgmma_kernel<true, false>;
    else if (strips) /* with fold, stores that multiply nothing (the 128-token body by 1) */
        kern = p->fold ? (const void *)fp4_sm90_wgmma_kernel<false, true, false, false, true>
                       : (const void *)fp4_sm90_wgmma_kernel<false, true>;
    else if (big) {
        kern = nk            ? (const void *)fp4_sm90_wgmma_res_kernel<true, false, true, WG_NK>
               : p->out_bf16 ? (const void *)fp4_sm90_wgmma_res_kernel<true, false, true>
                             : (const void *)fp4_sm90_wgmma_res_kernel<false, false, true>;
        smem = WG_SMEM128;
    } else if (res && p->rows_per_expert <= WG_RES_SMALL)
        kern = nk            ? (const void *)fp4_sm90_wgmma_res_kernel<true, true, false, WG_NK>
               : p->out_bf16 ? (const void *)fp4_sm90_wgmma_res_kernel<true, true, false>
                             : (const void *)fp4_sm90_wgmma_res_kernel<false, true, false>;
    else if (res)
        kern = nk            ? (const void *)fp4_sm90_wgmma_res_kernel<true, false, false, WG_NK>
               : p->out_bf16 ? (const void *)fp4_sm90_wgmma_res_kernel<true, false, false>
                             : (const void *)fp4_sm90_wgmma_res_kernel<false, false, false>;
    int nyi = (int)ny;
    void *args[3] = {(void *)p, &nyi, &cols};
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = fp4_pdl_config(grid, dim3(WG_THREADS), smem, stream, at);
    return cudaLaunchKernelExC(&cfg, kern, args);
}
