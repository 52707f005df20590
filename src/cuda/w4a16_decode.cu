/*
 * w4a16_decode.cu - the decode-specialised grouped MoE GEMMs (FC1 + activation, FC2) for few
 * tokens per expert (DESIGN.md sections 2 and 4), portable mma.sync m16n8k16 (sm_80, sm_90a).
 * Swap AB: 16 weight rows are the M operand, dequantized from NVFP4 (or read as BF16) into
 * registers; the tokens of one expert's slot (8, 16 or 32: args.tile_t) are NB = 1, 2 or 4
 * mma n8 tiles that share each dequantized A fragment (a 32-token slot runs only the 1-4
 * tiles its tokens fill: one kernel, a main loop per count). Their B fragments are loaded into
 * registers straight from global memory (L2) when the block's 8 warps split K (KS 8: long K
 * with 8-token slots), else from the slot's token rows staged in shared memory: the whole K
 * once per block when its 8 warps are row warps (KS 1, K < 1024), or chunks of 4 groups per
 * K slice, double-buffered, when 2 K slices of 4 row warps share them (KS 2: long K with 16-
 * and 32-token slots, and 8-token slots in large grids). NVFP4 weights and scales stream
 * through a per-warp cp.async ring in shared memory, 8 groups deep, so each warp keeps ~4 KB
 * of 16-byte copies in flight while it computes (2 groups, ~1 KB, in the shallow form that
 * one-wave grids of many warps per SM take, and 2 groups of two tiles instead of 3 at RT 2:
 * dec_shallow_pays); BF16 weights (shared experts) use register batches.
 * Tiles: gated (FC1) m16 tiles hold 8 gate rows and the 8 up rows of the same intermediate
 * columns, so SwiGLU runs in registers; plain (FC2) tiles hold 16 output rows.
 * Block: 8 warps = KS k-slices x (8 / KS) row warps, each warp RT m16 tiles sharing its B
 * fragments (RT 2 unless 8-token slots at KS 8 ask for more blocks). K slices are reduced
 * through shared memory in a fixed order (deterministic; NVFP4 warps leave their partials in
 * their own ring).
 * Dequantization (exact): an e2m1 code moved to bf16 bits 6..8 (+ sign to bit 15) is the
 * code value times 2^-126 (e2m1_pair: the packing of src/gpu_pack.h puts each pair of a
 * word one shift or rotate and a mask away from one bf16x2 of the fragment); the packed
 * block scales become bf16 times 2^119 (fp4_scale_eo: two per multiply-add, the half
 * broadcast folded into the multiply); their bf16x2 product is w * s * 2^-7, normal,
 * exact; the epilogue multiplies by 2^7 and the fp32 global scale. The activations are
 * stored "paired" (fp4_dec_pair_pos, by fp4_dec_prep and by the FC1 epilogue): lane quad t
 * finds its B fragments of a 64-group (k 16j + 2t, +1, +8, +9 for blocks j = 0..3) in 32
 * contiguous bytes, one 16-byte load per two blocks.
 * Also here: the prologue kernels. fp4_dec_prep groups (token, slot) pairs into slots of 8,
 * 16 or 32 tokens and writes the paired x; for M <= 64 fp4_dec_route_prep replaces router +
 * prep with a logits kernel that reads each router row once and a one-block top-k + grouping
 * kernel into 8-token slots (warp per token, warp-reduction picks, token masks per expert,
 * parallel prefix; rows of an expert in token order, deterministic).
 * One token (args.one_token, M = 1): FC2 and the combine in one launch; the 8 warps of a block
 * run the token's (up to 8) slots over one m16 tile, one warp a slot over the whole K or, with
 * fewer slots, 2-8 a slot over parts of it (dec_ot_split); each weights its slot's rows by
 * their multipliers, and the block sums the warps in order (the split-K reduction) into the
 * token's output row.
 * Limits: K % 64 == 0; gated n % 8 == 0; plain n % 16 == 0; E <= 256.
 */
#include <cuda_bf16.h>

#include "w4a16_decode.cuh"
#include "device_util.cuh"
#include "gpu_pack.h"
#include "route_select.cuh"

#define DEC_THREADS 256
#define DEC_WARPS 8
#define PREP_THREADS 512
#define PREP_MAX_BLOCKS 1024

static __device__ __forceinline__ uint4 ld_stream_u4(const void *ptr)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(ptr));
    return v;
}

/* NVFP4 main loop, per warp: a ring of RING groups in shared memory filled by cp.async
 * (16-byte weight copies, 4-byte scale copies; RING - 1 groups in flight while one computes),
 * activations loaded into registers one group ahead (they hit L2). Ring stage of a group:
 * RR = 16 RT weight rows of 32 bytes (row rr = 16 r + 8 h + g: tile r, h 0 lo / 1 hi, row g)
 * and their RR scale words (with scale chunks, SC: a pass's RR 16-byte chunks, copied with
 * its first group, in SQ slots). The warp reads only what it copied: __syncwarp orders the
 * copies of one lane before the reads of another and the reads before the next refill.
 * The loop runs in passes of 4 groups (half the ring at RT 1, all of it at RT 2), so that
 * every stage offset and copy source is a pass base plus a constant: ~100 instructions per
 * group and warp at RT 1 (the dequantization ~68 of them), against ~127 with per-group
 * offsets. */
#define DEC_RING_GROUPS 8 /* ring depth in 64-groups at RT 1 (RT 2: half, same bytes) */
#define DEC_KS8_GROUPS 16  /* K split over the 8 warps (KS 8) from K / 64 >= this on */
#define DEC_XS_MAX_K (64 * (DEC_KS8_GROUPS - 1)) /* the largest K of a KS 1 launch */
#define DEC_XCG 4 /* KS 2: 64-groups per staged activation chunk */
/* Staged activations (NVFP4, KS 1 or 2) in dynamic shared memory: TT token rows, padded by
 * 16 bytes so the lane quads' 16-byte reads of 8 rows hit distinct banks. KS 1 (K < 1024,
 * FC2) stages the whole K once; KS 2 (long K: 16- and 32-token slots, 8-token slots in
 * large grids) stages chunks of DEC_XCG groups per K slice, two buffers per slice, each chunk
 * read by the slice's 4 row warps (instead of each warp fetching its own copy from L2). */
static __host__ __device__ constexpr bool dec_xs(int wf, int ks) { return wf == FP4_DEC_W_NVFP4 && ks <= 2; }
static __host__ __device__ constexpr int dec_xs_row_bytes(int k) { return 2 * k + 16; }
static __host__ __device__ constexpr int dec_xs_bytes(int ks, int tt, int k)
{
    return ks == 1 ? tt * dec_xs_row_bytes(k) : 2 * ks * tt * dec_xs_row_bytes(64 * DEC_XCG);
}
static __host__ __device__ constexpr int dec_max(int a, int b) { return a > b ? a : b; }
#define DEC_XS_MAX_BYTES dec_max(dec_xs_bytes(1, 32, DEC_XS_MAX_K), dec_xs_bytes(2, 32, 64 * DEC_XCG))

/* 16 bytes of activations. Plain (FC2) kernels may wait for them in the middle of the kernel
 * (weights_first): a coherent load kept after that wait (an ld.global.nc may be hoisted above
 * griddepcontrol.wait, and was: stale rows); gated kernels wait first and use the nc path. */
template <int GATED> static __device__ __forceinline__ uint4 dec_ld_x(const uint4 *ptr)
{
    if (GATED) return __ldg(ptr);
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
    return v;
}

/* Row of a that padded row prow reads, or -1 (none: zeros). Plain (FC2) rows whose output is
 * skipped read none either. */
template <int GATED>
static __device__ __forceinline__ int dec_a_row(const fp4_dec_gemm_args &p, int prow)
{
    const int arow = p.row_src ? p.row_src[prow] : (prow < p.a_rows ? prow : -1);
    return !GATED && p.row_dst && p.row_dst[prow] < 0 ? -1 : arow;
}

/* The one-token FC2's warps per slot (args.one_token): the table's a_rows / 8 slots share the
 * block's 8 warps, kh warps a slot, each on K / kh (consecutive groups); kh the largest power of
 * two with kh x slots <= 8 that divides the K groups. At top-8 one warp a slot (kh 1); at
 * top-4 two a slot, so that an SM streams with 24 warps, not 12. H200, whole layer, against
 * a warp a slot (bench/NOTES.md thirty-ninth session): I = 3072 top-4 M=1 -9.2% (48 groups a
 * slot, 24 a warp); tp8 top-4 M=1 (6 groups, 3 a warp) +0.3 / +0.8%, within the spread. */
static __host__ __device__ constexpr int dec_ot_split(int a_rows, int k)
{
    int kh = 1;
    while (2 * kh * (a_rows / 8) <= DEC_WARPS && (k / 64) % (2 * kh) == 0) kh *= 2;
    return kh;
}

/* Per-warp weight ring of a kernel: RING stages of RR weight rows (NVFP4; BF16 uses none),
 * LEAD groups in flight while one computes (RING - 1, or fewer in the shallow form).
 * SH (shallow; dec_shallow_pays says when): 4 stages (a pass of DEC_UN groups is the least
 * ring; at RT 1 half the ring) with DEC_SH_LEAD groups in flight instead of 7 (RT 1) or 3
 * (RT 2). */
#define DEC_UN 4 /* groups per pass of the NVFP4 main loop */
#define DEC_SH_LEAD 2 /* groups in flight per warp of the shallow form */
template <int WF, int RT, bool SH = false> struct dec_ring {
    static constexpr bool NV = WF == FP4_DEC_W_NVFP4;
    static constexpr int RING = NV ? DEC_RING_GROUPS / (SH && RT == 1 ? 2 : RT) : 1, RR = 16 * RT;
    static constexpr int LEAD = SH ? DEC_SH_LEAD : RING - 1;
    static_assert(!NV || (LEAD >= 1 && LEAD < RING), "a lead of 1 to RING - 1 groups");
    /* scale chunks (SC): passes whose chunks are in shared memory at once (the one read and
     * those issued LEAD groups ahead) */
    static constexpr int SQ = (LEAD + DEC_UN - 1) / DEC_UN + 1;
};
/* Scale words per warp: one per row and ring stage, or with SC (scale chunks: a pass's
 * DEC_UN block-scale words of a row come as one 16-byte copy, one scale-copy instruction per
 * pass instead of one per group; dec_scale_chunks says when) a chunk per row and pass. */
template <int WF, int RT, bool SC, bool SH> static __host__ __device__ constexpr int dec_swords(void)
{
    return SC ? dec_ring<WF, RT, SH>::SQ * dec_ring<WF, RT, SH>::RR * 4
              : dec_ring<WF, RT, SH>::RING * dec_ring<WF, RT, SH>::RR;
}

/* One block's work: slot `slot` (expert `expert`) of TS padded rows, of which the first
 * 8 NB are computed (NB n8 token tiles); shared memory declared by the kernel. src_lane
 * (32-token slots only): the row of a that padded row slot TS + lane reads (dec_a_row; -1
 * none), loaded by the kernel beside the slot's expert. */
template <int WF, int GATED, int KS, int RT, int NB, int TS, bool OT, bool SC, bool SH, int NG>
static __device__ __forceinline__ void dec_block(const fp4_dec_gemm_args &p, int slot, int expert,
                                                 int src_lane, unsigned char *xs, void *wring_v,
                                                 void *sring_v, void *red_v)
{
    constexpr int RW = DEC_WARPS / KS;                     /* row warps */
    constexpr bool NV = WF == FP4_DEC_W_NVFP4;
    constexpr int U = 2;                                   /* BF16: 64-groups per load batch */
    constexpr int RING = dec_ring<WF, RT, SH>::RING, RR = dec_ring<WF, RT, SH>::RR;
    constexpr int TT = 8 * NB;                             /* tokens computed (rows staged) */
    static_assert(NV || NB == 1, "BF16 weights: one n8 token tile per slot");
    static_assert(RT * NB * 4 * 32 <= RING * RR * 8, "split-K partials reuse the warp's ring");
    constexpr bool XS = dec_xs(WF, KS); /* the slot's activations staged per block */
    constexpr bool XCH = XS && KS > 1;  /* ... in chunks of DEC_XCG groups per K slice */
    static_assert(!XCH || DEC_XCG >= RING - 2, "a chunk has landed when its ring group has");
    auto red = (float (*)[RT][4][32])red_v;
    auto wring = (uint32_t (*)[RING][RR][8])wring_v;
    auto sring = (uint32_t (*)[RING][RR])sring_v;
    static_assert(!SC || (NV && !OT), "scale chunks: NVFP4 K slices");
    constexpr int SQ = dec_ring<WF, RT, SH>::SQ, LEAD = dec_ring<WF, RT, SH>::LEAD;
    static_assert(LEAD == RING - 1 || (KS == DEC_WARPS && RING == DEC_UN),
                  "a shorter lead: KS 8 (no staged chunks) and a pass per ring");
    auto sq = (uint32_t (*)[SQ][RR][4])sring_v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ks = warp % KS, rw = warp / KS;
    const int g = lane >> 2, t = lane & 3, k = p.k, n = p.n;
    /* OT (args.one_token): warp ks runs part ks % kh of slot ks / kh's K (dec_ot_split);
     * `expert` is this warp's (-1: none, the warp computes nothing but joins the reduction) */
    static_assert(!OT || (!GATED && KS == DEC_WARPS && RT == 1 && NB == 1 && NV),
                  "one-token blocks: plain NVFP4, slots over the warps, one m16 tile");
    const int kh = OT ? dec_ot_split(p.a_rows, k) : 1;
    if constexpr (OT) slot = ks / kh;

    /* B column g of n8 tile nb: token row of a (or none: its lanes load nothing and compute
     * zeros). */
    bool xok[NB];
    const uint16_t *xrow[NB];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        const int arow = XS || (OT && expert < 0) ? -1 : dec_a_row<GATED>(p, slot * TS + 8 * nb + g);
        xok[nb] = arow >= 0;
        xrow[nb] = p.a + (size_t)(xok[nb] ? arow : 0) * k;
    }

    /* NG (dec_ng): every warp's K slice is NG groups, a constant (its loop unrolled) */
    const int ngr = NG ? NG * (OT ? 1 : KS) : k >> 6;
    const int gb0 = OT ? ngr / kh * (ks % kh) : NG ? NG * ks : ngr * ks / KS;
    const int gb1 = OT ? gb0 + ngr / kh : NG ? gb0 + NG : ngr * (ks + 1) / KS;
    const int n_tiles = GATED ? n / 8 : n / 16, n_wrows = GATED ? 2 * n : n;
    const int tile0 = (blockIdx.y * RW + rw) * RT;
    /* Weight row of tile r, half h (0: rows g, 1: rows g + 8 / the up rows), row gg. */
    auto wrow = [&](int r, int h, int gg) -> size_t {
        int tt = tile0 + r < n_tiles ? tile0 + r : 0;
        return (size_t)(expert < 0 ? 0 : expert) * n_wrows +
               (GATED ? (size_t)h * n + 8 * tt + gg : (size_t)16 * tt + 8 * h + gg);
    };
    bool tok[RT]; /* tile r exists (else its rows read as zeros, nothing written) */
    float acc[RT][NB][4];
#pragma unroll
    for (int r = 0; r < RT; r++) {
        tok[r] = tile0 + r < n_tiles;
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][nb][c] = 0.f;
    }

    if constexpr (NV) {
        /* copy roles: weight chunk lane + 32 j is row 16 j + lane / 2, bytes 16 (lane & 1);
         * scale word lane (lane < RR) is row lane */
        const uint8_t *cw[RT];
        bool cw_ok[RT];
#pragma unroll
        for (int j = 0; j < RT; j++) {
            cw[j] = p.wq + fp4_wq_row(wrow(j, lane >> 4, (lane >> 1) & 7), k) + 16 * (lane & 1);
            cw_ok[j] = tok[j];
        }
        const int sr = lane & (RR - 1);
        const uint8_t *cs = p.ws + wrow(sr >> 4, (sr >> 3) & 1, sr & 7) * (k / 16);
        const bool cs_ok = lane < RR && tile0 + (sr >> 4) < n_tiles;
        const uint32_t wdst = (uint32_t)__cvta_generic_to_shared(&wring[warp][0][lane >> 1][4 * (lane & 1)]);
        const uint32_t sdst = SC ? (uint32_t)__cvta_generic_to_shared(&sq[warp][0][sr][0])
                                   : (uint32_t)__cvta_generic_to_shared(&sring[warp][0][sr]);
        constexpr uint32_t WSTAGE = RR * 32, SSTAGE = SC ? RR * 16 : RR * 4; /* bytes per stage
                                                            (SC: per pass's scale chunk) */
        int pslot = 0; /* SC: the scale slot of the pass in progress */
        const int ng = OT && expert < 0 ? 0 : NG ? NG : gb1 - gb0;
        /* Copy sources of the pass's first group (advanced by UN groups per pass, so that a
         * copy's offset from them is a constant). */
        const uint8_t *cwp[RT];
#pragma unroll
        for (int j = 0; j < RT; j++) cwp[j] = cw[j] + FP4_WQ_TILE * gb0;
        const uint8_t *csp = cs + 4 * gb0;
        const bool s_lane = lane < RR; /* this lane copies a scale word */
        /* The codes are read once a forward: under the evict-first policy their lines are
         * the next misses' victims, not the L2's other lines (the scales keep the normal
         * policy: a row's next groups read the rest of their sector). H200, whole layer,
         * tp8 shapes, against none (bench/NOTES.md fortieth session): M=1 -5.4 / -6.0%, top-4
         * M=1 -3.2 / -3.5%, M=2 -6.1%, M=8 -3.7%, top-4 M=4 -5.7%, M=32 0, M=128 -1.5% (the
         * router's loads the same); the scales too +2.6% at M=8, +7.9% at M=32. With the
         * layer before run between the flush and the forward (bench --prev-layer): M=1 -6.1%,
         * top-4 M=1 -8.5%, M=2 -0.8%, but M=8 +3.3%; from a clean L2 (bench --flush clean,
         * with and without --prev-layer; forty-first session) M=1-32 -4.4 to +0.9%, M=8 -1.1 /
         * -2.1%. (The copy's shared address must stay a register plus a constant:
         * cp_async16_pf_hint.) */
        const uint64_t wpol = l2_evict_first();
        /* Copy group o of the pass (o < left: it exists) into ring stage st, one commit
         * either way; o and st are constants after unrolling. */
        auto issue = [&](int o, int left, int st) {
            if (o < left) {
#pragma unroll
                for (int j = 0; j < RT; j++)
                    cp_async16_pf_hint(wdst + st * WSTAGE + j * 512, cwp[j] + FP4_WQ_TILE * o,
                                       cw_ok[j] ? 16 : 0, wpol);
            }
            if constexpr (SC) {
                if (o % DEC_UN == 0 && o < left && s_lane) {
                    int q = pslot + o / DEC_UN;
                    q = q >= SQ ? q - SQ : q;
                    cp_async16(sdst + q * SSTAGE, csp + 4 * o, cs_ok ? 16 : 0);
                }
            } else if (o < left && s_lane) {
                cp_async4(sdst + st * SSTAGE, csp + 4 * o, cs_ok ? 4 : 0);
            }
            cp_async_commit();
        };
        /* Activations. From L2 (KS 8): group gb0 + i + 1 into xn while group i computes from
         * xc; lanes of no token keep zeros (set once). XS: each step reads group i from the
         * staged rows (rows of no token were staged as zeros). */
        const uint4 *xp[NB]; /* the pass's first group (advanced like the copy sources) */
#pragma unroll
        for (int nb = 0; nb < NB; nb++) xp[nb] = (const uint4 *)(xrow[nb] + 64 * gb0 + 16 * t);
        /* XS staging: chunk c (groups gb0 + XG c .., buffer c % 2 of slice ks) copied by the
         * slice's row warps: warp rw copies rows rw + RW q, lane j the 16-byte column j (+ 32
         * ...); lane q holds the source row of its warp's q-th row. */
        constexpr int XQ = TT / RW; /* rows copied per warp */
        const int XG = XCH ? DEC_XCG : ng; /* groups per chunk */
        const int xrb = dec_xs_row_bytes(64 * XG), xbuf = KS * TT * xrb; /* buffer 1 - 0 */
        const unsigned char *xsl = xs + ks * TT * xrb; /* this slice's buffer 0 */
        int xq_row = -1;
        auto find_xq = [&]() {
            if constexpr (XS) {
                if constexpr (TS == 32) /* loaded by the kernel (its tile count needs them) */
                    xq_row = __shfl_sync(0xffffffffu, src_lane, (rw + RW * lane) & 31);
                else if (lane < XQ)
                    xq_row = dec_a_row<GATED>(p, slot * TS + rw + RW * lane);
            }
        };
        auto stage = [&](int c) {
            const int g0 = gb0 + XG * c, cols = 8 * min(XG, gb1 - g0);
            const uint32_t dst = smem_u32(xsl + (c & 1) * xbuf);
#pragma unroll
            for (int q = 0; q < XQ; q++) {
                const int r = rw + RW * q, arow = __shfl_sync(0xffffffffu, xq_row, q);
                const uint16_t *src = p.a + (size_t)(arow >= 0 ? arow : 0) * k + 64 * g0;
                for (int j = lane; j < cols; j += 32)
                    cp_async16(dst + r * xrb + 16 * j, src + 8 * j, arow >= 0 ? 16 : 0);
            }
            cp_async_commit();
        };
        const int n_chunks = XCH ? (ng + DEC_XCG - 1) / DEC_XCG : 1;
        /* bar.sync of the slice's row warps (KS 1: the whole block) */
        auto slice_sync = [&]() {
            asm volatile("bar.sync %0, %1;\n" ::"r"(1 + ks), "r"(RW * 32) : "memory");
        };
        /* Dequantize group i's weights from ring stage st, multiply with its activations. */
        auto compute = [&](int st, int u, const uint4 (&xc)[NB][2]) {
#pragma unroll
            for (int r = 0; r < RT; r++) {
                const uint2 wl = *(const uint2 *)&wring[warp][st][16 * r + g][2 * t];
                const uint2 wh = *(const uint2 *)&wring[warp][st][16 * r + 8 + g][2 * t];
                uint32_t sle, slo, she, sho;
                const int rl = 16 * r + g, rh = rl + 8; /* scale rows of the lo / hi halves */
                fp4_scale_eo<119>(SC ? sq[warp][pslot][rl][u] : sring[warp][st][rl], sle, slo);
                fp4_scale_eo<119>(SC ? sq[warp][pslot][rh][u] : sring[warp][st][rh], she, sho);
#pragma unroll
                for (int j = 0; j < 4; j++) { /* k16 block j: word j / 2, nibble pairs i0, i0 + 1 */
                    const uint32_t ql = j < 2 ? wl.x : wl.y, qh = j < 2 ? wh.x : wh.y;
                    const uint32_t sl = fp4_scale_half(j & 1 ? slo : sle, j >> 1);
                    const uint32_t sh = fp4_scale_half(j & 1 ? sho : she, j >> 1);
                    const int i0 = 2 * (j & 1);
                    uint32_t a[4];
                    a[0] = bf16x2_mul(e2m1_pair(ql, i0), sl);
                    a[1] = bf16x2_mul(e2m1_pair(qh, i0), sh);
                    a[2] = bf16x2_mul(e2m1_pair(ql, i0 + 1), sl);
                    a[3] = bf16x2_mul(e2m1_pair(qh, i0 + 1), sh);
                    const int c = j >> 1;
#pragma unroll
                    for (int nb = 0; nb < NB; nb++)
                        mma_bf16(acc[r][nb], a, j & 1 ? xc[nb][c].z : xc[nb][c].x,
                                 j & 1 ? xc[nb][c].w : xc[nb][c].y);
                }
            }
        };
        /* Step of group i = the pass's first + u (left: groups from the pass's first on)
         * from stage st; group i + LEAD goes into stage ist (with the full lead the one the
         * step before read). edge: a staged chunk begins at i (i is a multiple of DEC_XCG). */
        auto step = [&](int i, int u, int left, int st, int ist, bool edge,
                        const uint4 (&xl)[NB][2], uint4 (&xn)[NB][2]) {
            cp_async_wait<LEAD - 1>(); /* this lane's copies of group i landed */
            if (XCH && edge && i > 0) {
                /* chunk i / XG landed (its copies are older than ring group i: DEC_XCG >=
                 * RING - 2) and every row warp of the slice is done with chunk i / XG - 1:
                 * its buffer takes chunk i / XG + 1 */
                slice_sync();
                if (i / DEC_XCG + 1 < n_chunks) stage(i / DEC_XCG + 1);
            } else {
                __syncwarp(); /* every lane's copies landed; stage ist read */
            }
            issue(u + LEAD, left, ist);
            if constexpr (XS) {
                const int c = XCH ? i / DEC_XCG : 0, gi = XCH ? i % DEC_XCG : i;
                uint4 xc[NB][2];
#pragma unroll
                for (int nb = 0; nb < NB; nb++) {
                    const uint4 *x = (const uint4 *)(xsl + (c & 1) * xbuf + (8 * nb + g) * xrb +
                                                     128 * gi + 32 * t);
                    xc[nb][0] = x[0];
                    xc[nb][1] = x[1];
                }
                compute(st, u, xc);
            } else {
#pragma unroll
                for (int nb = 0; nb < NB; nb++)
                    if (xok[nb] && u + 1 < left) {
                        xn[nb][0] = dec_ld_x<GATED>(xp[nb] + 8 * (u + 1));
                        xn[nb][1] = dec_ld_x<GATED>(xp[nb] + 8 * (u + 1) + 1);
                    }
                compute(st, u, xl);
            }
        };
        /* weights_first (plain): the kernel's wait for the activations comes after the first
         * weight copies; KS 1 then stages its one chunk after them too (and waits for all) */
        const bool wfirst = !GATED && p.weights_first;
        if constexpr (XCH) { /* the oldest copy groups: chunks 0 and 1 */
            if (wfirst) fp4_pdl_wait();
            find_xq();
            stage(0);
            if (n_chunks > 1) stage(1);
        } else if constexpr (XS) {
            if (!wfirst) {
                find_xq();
                stage(0);
            }
        }
#pragma unroll
        for (int i = 0; i < LEAD; i++) issue(i, ng, i);
        if constexpr (XS && !XCH) {
            if (wfirst) {
                fp4_pdl_wait();
                find_xq();
                stage(0);
            }
        } else {
            if (wfirst) fp4_pdl_wait();
        }
        if constexpr (XS) { /* this thread's copies of chunk 0 landed, then everyone's */
            if (!XCH && wfirst) cp_async_wait<0>();
            else if (n_chunks > 1) cp_async_wait<RING>();
            else cp_async_wait<RING - 1>();
            slice_sync();
        }
        uint4 xa[NB][2], xb[NB][2];
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            xa[nb][0] = xa[nb][1] = xb[nb][0] = xb[nb][1] = make_uint4(0, 0, 0, 0);
            if (!XS && xok[nb] && ng > 0) {
                xa[nb][0] = dec_ld_x<GATED>(xp[nb]);
                xa[nb][1] = dec_ld_x<GATED>(xp[nb] + 1);
            }
        }
        /* Passes of UN groups: group i + u reads stage ro + u and refills the stage before
         * it (a shorter lead, RING == UN so ro == 0: stage u + LEAD), so every ring offset is
         * the pass's base plus a constant. */
        constexpr int UN = DEC_UN;
        static_assert(RING % UN == 0 && UN % 2 == 0 && (!XCH || DEC_XCG == UN),
                      "the ring holds whole passes, a pass whole staged chunks");
        auto pass = [&](int i) {
            const int ro = i & (RING - 1), rp = (ro + RING - 1) & (RING - 1), left = ng - i;
#pragma unroll
            for (int u = 0; u < UN; u++) {
                if (u >= left) break;
                constexpr bool FULL = LEAD == RING - 1;
                const int ist = FULL ? (u ? ro + u - 1 : rp) : (u + LEAD) & (RING - 1);
                if (u & 1) step(i + u, u, left, ro + u, ist, false, xb, xa);
                else step(i + u, u, left, ro + u, ist, u == 0, xa, xb);
            }
#pragma unroll
            for (int j = 0; j < RT; j++) cwp[j] += FP4_WQ_TILE * UN;
            csp += 4 * UN;
            if constexpr (SC) pslot = pslot + 1 == SQ ? 0 : pslot + 1;
#pragma unroll
            for (int nb = 0; nb < NB; nb++) xp[nb] += 8 * UN;
        };
        if constexpr (NG > 0) {
            if (ng > 0) { /* (a one-token warp of no slot has none) */
#pragma unroll
                for (int i = 0; i < NG; i += UN) pass(i);
            }
        } else {
            for (int i = 0; i < ng; i += UN) pass(i);
        }
    } else {
        const uint16_t *wb_lo[RT], *wb_hi[RT];
#pragma unroll
        for (int r = 0; r < RT; r++) {
            wb_lo[r] = p.wb + wrow(r, 0, g) * k + 8 * t;
            wb_hi[r] = p.wb + wrow(r, 1, g) * k + 8 * t;
        }
        for (int gb = gb0; gb < gb1; gb += U) {
            uint4 xv[U][2];
            uint4 wl[U][RT][2], wh[U][RT][2];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int gi = gb + u;
                const bool in = gi < gb1;
#pragma unroll
                for (int r = 0; r < RT; r++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        if (in && tok[r]) {
                            wl[u][r][c] = ld_stream_u4(wb_lo[r] + 64 * gi + 32 * c);
                            wh[u][r][c] = ld_stream_u4(wb_hi[r] + 64 * gi + 32 * c);
                        } else {
                            wl[u][r][c] = wh[u][r][c] = make_uint4(0, 0, 0, 0);
                        }
                    }
#pragma unroll
                for (int c = 0; c < 2; c++)
                    xv[u][c] = in && xok[0] ? __ldg((const uint4 *)(xrow[0] + 64 * gi + 32 * c + 8 * t))
                                         : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (gb + u >= gb1) break;
#pragma unroll
                for (int r = 0; r < RT; r++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        uint32_t a[4] = {wl[u][r][c].x, wh[u][r][c].x, wl[u][r][c].y,
                                         wh[u][r][c].y};
                        mma_bf16(acc[r][0], a, xv[u][c].x, xv[u][c].y);
                        uint32_t a2[4] = {wl[u][r][c].z, wh[u][r][c].z, wl[u][r][c].w,
                                          wh[u][r][c].w};
                        mma_bf16(acc[r][0], a2, xv[u][c].z, xv[u][c].w);
                    }
            }
        }
    }

    if constexpr (OT) { /* every row of the slot is token 0's: weight the slot's 8 token
                          * columns (2t, 2t + 1 in this lane) by their rows' multipliers, sum
                          * them over the quad into columns 0 / 2 (rows g / g + 8); slots
                          * are then summed in order by the reduction below */
        float f[2] = {0.f, 0.f};
        if (expert >= 0) {
            const float gs = 128.f * (p.gscale ? p.gscale[expert] : 1.f); /* undo the 2^-7 */
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int pr = slot * TS + 2 * t + j;
                f[j] = p.row_dst[pr] >= 0 ? gs * p.row_w[pr] : 0.f;
            }
        }
        float lo = f[0] * acc[0][0][0] + f[1] * acc[0][0][1];
        float hi = f[0] * acc[0][0][2] + f[1] * acc[0][0][3];
        lo += __shfl_xor_sync(0xffffffffu, lo, 1), hi += __shfl_xor_sync(0xffffffffu, hi, 1);
        lo += __shfl_xor_sync(0xffffffffu, lo, 2), hi += __shfl_xor_sync(0xffffffffu, hi, 2);
        acc[0][0][0] = lo, acc[0][0][2] = hi, acc[0][0][1] = acc[0][0][3] = 0.f;
    }
    if (KS > 1) { /* slice s of row warp rw is warp rw * KS + s: sum slices 0, 1, ... */
        /* partial (r, nb, c) of warp w at rbase(w)[((r * NB + nb) * 4 + c) * 32 + lane] */
        auto rbase = [&](int w) -> float * {
            return NV ? (float *)&wring[w][0][0][0] : &red[w][0][0][0];
        };
        __syncwarp(); /* NVFP4: every lane of this warp is done reading its ring */
        float *mine = rbase(warp);
#pragma unroll
        for (int r = 0; r < RT; r++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) mine[((r * NB + nb) * 4 + c) * 32 + lane] = acc[r][nb][c];
        __syncthreads();
        if (ks != 0) return;
#pragma unroll
        for (int s = 1; s < KS; s++) {
            const float *o = rbase(warp + s);
#pragma unroll
            for (int r = 0; r < RT; r++)
#pragma unroll
                for (int nb = 0; nb < NB; nb++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[r][nb][c] += o[((r * NB + nb) * 4 + c) * 32 + lane];
        }
    }

    if constexpr (OT) { /* out [n] fp32: token 0's sum over its slots (and rows) */
        if (t == 0 && tok[0]) {
            float *y = (float *)p.out;
            const int o = 16 * tile0 + g;
            y[o] = (p.accumulate ? y[o] : 0.f) + acc[0][0][0];
            y[o + 8] = (p.accumulate ? y[o + 8] : 0.f) + acc[0][0][2];
        }
        return;
    }
    /* Epilogue. acc[r][nb][c]: weight row g (c < 2) or g + 8 (c >= 2) of tile r, token
     * column 8 nb + 2t + (c & 1) of the slot. */
    const float wscale = WF == FP4_DEC_W_NVFP4 ? 128.f : 1.f; /* undo the 2^-7 */
    if (GATED) {
        float gs_g = wscale, gs_u = wscale;
        if (p.gscale) {
            gs_g *= p.gscale[2 * expert];
            gs_u *= p.gscale[2 * expert + 1];
        }
        uint16_t *out = (uint16_t *)p.out;
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int pr = slot * TS + 8 * nb + 2 * t + j;
            const bool ok = p.row_src ? p.row_src[pr] >= 0 : pr < p.out_rows;
            if (!ok) continue;
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (!tok[r]) continue;
                const int i = 8 * (tile0 + r) + g;
                const int col = WF == FP4_DEC_W_NVFP4 ? fp4_dec_pair_pos(i) : i;
                float v = act_fn(p.act, p.limit, p.alpha, acc[r][nb][j] * gs_g,
                                 acc[r][nb][2 + j] * gs_u);
                out[(size_t)pr * n + col] = bf16_bits(v);
            }
        }
    } else {
        const float gs = wscale * (p.gscale ? p.gscale[expert] : 1.f);
        float *out = (float *)p.out;
        uint16_t *outh = (uint16_t *)p.out;
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int pr = slot * TS + 8 * nb + 2 * t + j;
            const int dst = p.row_dst ? p.row_dst[pr] : (pr < p.out_rows ? pr : -1);
            if (dst < 0) continue;
            const float f = gs * (p.row_w ? p.row_w[pr] : 1.f);
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (!tok[r]) continue;
                const size_t o = (size_t)dst * n + 16 * (tile0 + r) + g;
                if (p.out_bf16) {
                    outh[o] = bf16_bits(acc[r][nb][j] * f);
                    outh[o + 8] = bf16_bits(acc[r][nb][2 + j] * f);
                } else {
                    out[o] = acc[r][nb][j] * f;
                    out[o + 8] = acc[r][nb][2 + j] * f;
                }
            }
        }
    }
}


/* B4: registers held to 64 a thread so that 4 blocks fit an SM (dec_four_pays; the KS 8 RT 2
 * kernels take 69-75 otherwise, 3 blocks per SM, and fit 64 without spills). The 16-token
 * kernels of long K (KS 2, NB 2) are held to 80 so that 3 fit (87-90 registers otherwise, 2
 * blocks per SM; no spills at 80). NG (dec_ng: a K loop unrolled) keeps its kernel's blocks
 * per SM: left alone ptxas gives it up to 128 registers (2 blocks), held it fits without
 * spills (KS 1 NB 1: 62-63, 4 blocks; the others 72-80, 3). */
template <int WF, int GATED, int KS, int RT, int NB, bool OT = false, bool SC = false,
          bool SH = false, bool B4 = false, int NG = 0>
__global__ void __launch_bounds__(DEC_THREADS, B4 || (NG && KS == 1 && NB == 1) ? 4
                                               : NG || (KS == 2 && NB == 2)     ? 3
                                                                                : 2)
    fp4_dec_kernel(const fp4_dec_gemm_args p)
{
    constexpr bool NV = WF == FP4_DEC_W_NVFP4;
    constexpr int RING = dec_ring<WF, RT, SH>::RING, RR = dec_ring<WF, RT, SH>::RR;
    constexpr int TS = 8 * NB; /* padded rows per slot */
    /* split-K partials: BF16 here, NVFP4 in the warp's own ring once its main loop is done */
    __shared__ float red[!NV && KS > 1 ? DEC_WARPS : 1][RT][4][32];
    extern __shared__ __align__(16) unsigned char xs[]; /* XS: dec_xs_bytes(KS, TS, k) */
    __shared__ __align__(16) uint32_t wring[NV ? DEC_WARPS : 1][RING][RR][8];
    __shared__ __align__(16) uint32_t sring[NV ? DEC_WARPS : 1][dec_swords<WF, RT, SC, SH>()];
    /* The slot table and activations come from the kernels before. weights_first (plain
     * NVFP4): the table's writer has completed before this kernel could launch (the header
     * says when), so the wait for the activations is deferred past the first weight copies
     * (dec_block). */
    if (!(NV && !GATED && p.weights_first)) fp4_pdl_wait();
    fp4_pdl_trigger();
    const int slot = blockIdx.x, lane = threadIdx.x & 31;
    /* 32-token slots: every lane loads the source of one padded row of the slot, beside the
     * slot's expert (one round trip before the tile count is known; grid <= n_slots) */
    int src = -1;
    if (NB == 4 && lane < TS) src = dec_a_row<GATED>(p, slot * TS + lane);
    int expert = 0;
    if constexpr (OT) { /* warp w takes slot w / kh of the table (a_rows / 8 slots; kh:
                           dec_ot_split); -1: none */
        const int sl = (threadIdx.x >> 5) / dec_ot_split(p.a_rows, p.k);
        expert = sl * TS < p.a_rows ? p.tile_expert[sl] : -1;
    } else if (p.tile_expert) {
        expert = p.tile_expert[slot];
        if (expert < 0) return;
    } else if (slot * TS >= p.a_rows) {
        return;
    }
    static_assert(NB != 4 || dec_xs(WF, KS), "32-token slots are staged (their tile count "
                                             "comes from the staging sources)");
    if constexpr (NB == 4) { /* 32-token slots: only the n8 tiles that hold tokens run (the
                                grouping fills a slot from row 0; a row of no token reads -1) */
        const unsigned used = __ballot_sync(0xffffffffu, src >= 0);
        const int nbu = used ? (31 - __clz((int)used)) / 8 + 1 : 1;
        if (nbu == 1) return dec_block<WF, GATED, KS, RT, 1, TS, OT, SC, SH, NG>(p, slot, expert, src, xs, wring, sring, red);
        if (nbu == 2) return dec_block<WF, GATED, KS, RT, 2, TS, OT, SC, SH, NG>(p, slot, expert, src, xs, wring, sring, red);
        if (nbu == 3) return dec_block<WF, GATED, KS, RT, 3, TS, OT, SC, SH, NG>(p, slot, expert, src, xs, wring, sring, red);
    }
    dec_block<WF, GATED, KS, RT, NB, TS, OT, SC, SH, NG>(p, slot, expert, src, xs, wring, sring, red);
}

/* x [m, h] natural -> xp paired: units (row, 64-group, lane quad t) of 16 elements. */
static __device__ __forceinline__ void pair_x(const uint16_t *__restrict__ x,
                                              uint16_t *__restrict__ xp, int m, int h,
                                              long long first, long long stride)
{
    const long long units = (long long)m * (h / 64) * 4;
    for (long long u = first; u < units; u += stride) {
        const long long base = (u >> 2) * 64; /* row * h + 64 * group */
        const int t = (int)(u & 3);
        const uint32_t *src = (const uint32_t *)(x + base);
        uint4 *dst = (uint4 *)(xp + base + 16 * t);
#pragma unroll
        for (int c = 0; c < 2; c++) /* k pairs 32c + {2t, 8 + 2t, 16 + 2t, 24 + 2t} */
            dst[c] = make_uint4(src[16 * c + t], src[16 * c + t + 4], src[16 * c + t + 8],
                                src[16 * c + t + 12]);
    }
}

/* Exclusive prefix over experts of their slot counts (v: thread e's count, e < n_experts)
 * into tstart[0..n_experts] by warp scans; blockDim.x >= FP4_DEC_MAX_EXPERTS, all threads. */
static __device__ void scan_tiles(int v, int n_experts, int *tstart)
{
    __shared__ int wsum[FP4_DEC_MAX_EXPERTS / 32];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    int incl = v;
    if (tid < FP4_DEC_MAX_EXPERTS) {
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        if (lane == 31) wsum[wid] = incl;
    }
    __syncthreads();
    if (tid < n_experts) {
        int off = 0;
        for (int i = 0; i < wid; i++) off += wsum[i];
        tstart[tid] = off + incl - v;
        if (tid == n_experts - 1) tstart[n_experts] = off + incl;
    }
    __syncthreads();
}

/* Slot table (expert per slot, -1 past the last used slot) and every padded row emptied. */
static __device__ void fill_slots(int n_experts, int n_slots, int tile_t, const int *tstart,
                                  int32_t *tile_expert, int32_t *row_src, int32_t *row_dst,
                                  float *row_w)
{
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int s = tid; s < n_slots; s += nt) tile_expert[s] = fp4_slot_expert(s, n_experts, tstart);
    const long long n_rows = (long long)n_slots * tile_t;
    for (long long r = tid; r < n_rows; r += nt) {
        row_src[r] = -1;
        row_dst[r] = -1;
        row_w[r] = 0.f;
    }
}

/* Grouping of the m*k pairs into slots of tile_t tokens by one whole block (the algorithm of
 * moe_group.cu: any ids, order inside an expert's segment by shared-memory atomics).
 * ids / w may have been written earlier in the same kernel by this block: plain loads. */
static __device__ void group_pairs(const int32_t *ids, const float *w, int n_pairs, int k,
                                   int n_experts, int n_slots, int tile_t,
                                   int32_t *tile_expert, int32_t *row_src, int32_t *row_dst,
                                   float *row_w)
{
    __shared__ int cnt[FP4_DEC_MAX_EXPERTS], tstart[FP4_DEC_MAX_EXPERTS + 1];
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int e = tid; e < n_experts; e += nt) cnt[e] = 0;
    __syncthreads();
    for (int q = tid; q < n_pairs; q += nt) {
        int e = ids[q];
        if (e >= 0 && e < n_experts) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    int v = tid < n_experts ? (cnt[tid] + tile_t - 1) / tile_t : 0;
    scan_tiles(v, n_experts, tstart);
    for (int e = tid; e < n_experts; e += nt) cnt[e] = 0; /* now the scatter cursor */
    fill_slots(n_experts, n_slots, tile_t, tstart, tile_expert, row_src, row_dst, row_w);
    __syncthreads();
    for (int q = tid; q < n_pairs; q += nt) {
        int e = ids[q];
        if (e < 0 || e >= n_experts) continue;
        int pos = tstart[e] * tile_t + atomicAdd(&cnt[e], 1);
        row_src[pos] = q / k;
        row_dst[pos] = q;
        row_w[pos] = w[q];
    }
}

/* Block 0 groups; blocks 1.. write the paired x. */
__global__ void __launch_bounds__(PREP_THREADS)
fp4_dec_prep_kernel(const int32_t *ids, const float *w, int n_pairs, int k, int n_experts,
                    int n_slots, int tile_t, int32_t *tile_expert, int32_t *row_src, int32_t *row_dst,
                    float *row_w, const uint16_t *__restrict__ x, int m, int h,
                    uint16_t *__restrict__ xp)
{
    fp4_pdl_wait();
    fp4_pdl_trigger();
    if (blockIdx.x > 0) {
        pair_x(x, xp, m, h, (long long)(blockIdx.x - 1) * PREP_THREADS + threadIdx.x,
               (long long)(gridDim.x - 1) * PREP_THREADS);
        return;
    }
    group_pairs(ids, w, n_pairs, k, n_experts, n_slots, tile_t, tile_expert, row_src, row_dst,
                row_w);
}

extern "C" cudaError_t fp4_dec_prep(const int32_t *ids, const float *w, int m, int k,
                                    int n_experts, int n_slots, int tile_t, int32_t *tile_expert,
                                    int32_t *row_src, int32_t *row_dst, float *row_w,
                                    const uint16_t *x, int h, uint16_t *xp, cudaStream_t stream)
{
    long long pairs = (long long)m * k;
    if (!ids || !w || !tile_expert || !row_src || !row_dst || !row_w || m < 1 || k < 1 ||
        n_experts < 1 || n_experts > FP4_DEC_MAX_EXPERTS || pairs > 0x7fffffff ||
        (tile_t != 8 && tile_t != 16 && tile_t != 32) ||
        n_slots != (int)((pairs + tile_t - 1) / tile_t) + n_experts ||
        (xp && (!x || h < 64 || h % 64)))
        return cudaErrorInvalidValue;
    long long blocks = 1;
    if (xp) {
        long long units = (long long)m * (h / 64) * 4;
        long long nb = (units + PREP_THREADS - 1) / PREP_THREADS;
        blocks += nb < PREP_MAX_BLOCKS ? nb : PREP_MAX_BLOCKS;
    }
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = fp4_pdl_config(dim3((unsigned)blocks), dim3(PREP_THREADS), 0,
                                            stream, at);
    return cudaLaunchKernelEx(&cfg, fp4_dec_prep_kernel, ids, w, (int)pairs, k, n_experts,
                              n_slots, tile_t, tile_expert, row_src, row_dst, row_w, x, m, h, xp);
}

/* ---- small-M router: logits by many blocks, then top-k + grouping by one ---------------- */
#define RL_THREADS 256
#define RL_TOK 4 /* tokens per pass of the logits kernel (x loads in flight together) */

/* Block (e, token group of 8): logits[t][e] for its tokens, the router row read once into
 * registers (warp w owns a contiguous H/8 slice); per-warp sums reduced in a fixed order.
 * All blocks also write the paired x. The router is a constant of the layer, so its loads
 * may be issued before the PDL wait (with __ldg they were; under the evict-first policy the
 * compiler puts them after it, as measured); the paired x is written after the logits, so
 * that its loads do not hold the router's back (the top-k kernel waits for the slowest
 * block). */
__global__ void __launch_bounds__(RL_THREADS)
fp4_dec_logits_kernel(const uint16_t *__restrict__ x, const float *__restrict__ router, int m,
                      int h, int n_experts, float *__restrict__ logits,
                      uint16_t *__restrict__ xp)
{
    __shared__ float part[RL_THREADS / 32][FP4_DEC_TILE_T];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int e = blockIdx.x, t0 = blockIdx.y * FP4_DEC_TILE_T;
    const long long bid = (long long)blockIdx.y * gridDim.x + blockIdx.x;

    const int n4 = h / 4, i0 = warp * n4 / 8, i1 = (warp + 1) * n4 / 8;
    const float4 *rr = (const float4 *)(router + (size_t)e * h);
    float4 rv[FP4_DEC_ROUTE_MAX_H / 1024];
    const uint64_t rpol = l2_evict_first(); /* read once a forward */
#pragma unroll
    for (int j = 0; j < FP4_DEC_ROUTE_MAX_H / 1024; j++) {
        int i = i0 + lane + 32 * j;
        rv[j] = i < i1 ? ld_nc_f4_hint(rr + i, rpol) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    fp4_pdl_wait();
    fp4_pdl_trigger();
    const int nt = m - t0 < FP4_DEC_TILE_T ? m - t0 : FP4_DEC_TILE_T;
    for (int tb = 0; tb < nt; tb += RL_TOK) {
        float acc[RL_TOK];
        uint2 xv[RL_TOK][FP4_DEC_ROUTE_MAX_H / 1024];
#pragma unroll
        for (int q = 0; q < RL_TOK; q++) {
            const uint2 *xx = (const uint2 *)(x + (size_t)(t0 + tb + q) * h);
#pragma unroll
            for (int j = 0; j < FP4_DEC_ROUTE_MAX_H / 1024; j++) {
                int i = i0 + lane + 32 * j;
                xv[q][j] = tb + q < nt && i < i1 ? __ldg(xx + i) : make_uint2(0, 0);
            }
        }
#pragma unroll
        for (int q = 0; q < RL_TOK; q++) {
            float a = 0.f;
#pragma unroll
            for (int j = 0; j < FP4_DEC_ROUTE_MAX_H / 1024; j++) {
                a = fmaf(rv[j].x, __uint_as_float(xv[q][j].x << 16), a);
                a = fmaf(rv[j].y, __uint_as_float(xv[q][j].x & 0xffff0000u), a);
                a = fmaf(rv[j].z, __uint_as_float(xv[q][j].y << 16), a);
                a = fmaf(rv[j].w, __uint_as_float(xv[q][j].y & 0xffff0000u), a);
            }
            for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            acc[q] = a;
        }
        if (lane == 0)
#pragma unroll
            for (int q = 0; q < RL_TOK; q++)
                if (tb + q < nt) part[warp][tb + q] = acc[q];
    }
    __syncthreads();
    if (tid < nt) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < RL_THREADS / 32; w++) s += part[w][tid];
        logits[(size_t)(t0 + tid) * n_experts + e] = s;
    }
    pair_x(x, xp, m, h, bid * RL_THREADS + tid, (long long)gridDim.x * gridDim.y * RL_THREADS);
}

#define TG_THREADS 1024 /* the top-k + grouping block: one warp per token */
#define TG_TOK (FP4_DEC_ROUTE_MAX_M / (TG_THREADS / 32)) /* tokens per warp, at most */
static_assert(FP4_DEC_ROUTE_MAX_M <= 64, "token masks per expert are 64-bit");
static_assert(FP4_DEC_ROUTE_MAX_M % (TG_THREADS / 32) == 0, "whole token rounds per warp");

/* One block of TG_THREADS: warp per token, the routing rule of route_select.cuh, ids / w [m, k];
 * the tokens that chose each expert as a 64-bit mask; then the grouping of fp4_dec_prep,
 * with a pair's place inside its expert's segment = its rank in token order (deterministic).
 * A latency chain, so whatever does not need the logits runs before the PDL wait: the bias
 * loads, the mask reset and the emptying of every padded row (the kernel before waits for
 * its own predecessor before it lets this one launch, so no earlier kernel still reads the
 * rows). Each warp keeps its tokens' first 32 choices in registers for the scatter, whose
 * place for a pair is its token's rank among the expert's tokens. A token left with fewer
 * than k non-NaN scores takes expert 0 for each missing choice (route_select.cuh), so its ids
 * repeat and a rank per token no longer gives each pair a row: if any token fell back, the
 * block groups by pair counts instead (group_pairs; the order inside a segment is then that
 * of shared-memory atomics). One token (k <= 32) takes a shorter path to the same table:
 * warp 0 chooses, and lane s puts choice s into slot (rank of its expert among the k ids),
 * row 0; the empty slots are marked before the wait. No masks, scan or search: the chain
 * after the choice is a few shuffles and four stores. Few tokens (m <= 8: at most 8 pairs
 * per expert, one slot each) skip the scan and the search: a pair's slot is the number of
 * chosen experts below its own (a bitmap of E bits), and the pair with row 0 names it. */
__global__ void __launch_bounds__(TG_THREADS)
fp4_dec_topk_group_kernel(const float *logits, const float *__restrict__ bias,
                          int m, int n_experts, int k, int scoring, int norm_topk,
                          float scaling, int32_t *ids, float *w, int n_slots,
                          int32_t *tile_expert, int32_t *row_src, int32_t *row_dst,
                          float *row_w)
{
    __shared__ unsigned long long tmask[FP4_DEC_MAX_EXPERTS]; /* bit t: token t chose e */
    __shared__ int tstart[FP4_DEC_MAX_EXPERTS + 1];
    __shared__ int fell_back; /* some token took expert 0 for a missing choice */
    __shared__ unsigned emask[FP4_DEC_MAX_EXPERTS / 32]; /* few tokens: bit e, e was chosen */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int J = FP4_ROUTE_LANE_EXPERTS;
    float bv[J];
    route_bias_lane(bv, bias, n_experts);
    if (tid == 0) fell_back = 0;
    for (int e = tid; e < n_experts; e += TG_THREADS) tmask[e] = 0ull;
    for (int r = tid; r < n_slots * FP4_DEC_TILE_T; r += TG_THREADS) {
        row_src[r] = -1;
        row_dst[r] = -1;
        row_w[r] = 0.f;
    }
    /* one token: its slots are the first k (its experts in id order), the rest are empty */
    const bool one = m == 1 && k <= 32;
    if (one)
        for (int s = k + tid; s < n_slots; s += TG_THREADS) tile_expert[s] = -1;
    /* few tokens (m <= 8): an expert has at most 8 pairs, so one slot, the rank of its id
     * among the chosen (emask); the slots past them stay empty */
    const bool few = m <= FP4_DEC_TILE_T;
    if (few && !one) {
        for (int s = tid; s < n_slots; s += TG_THREADS) tile_expert[s] = -1;
        if (tid < FP4_DEC_MAX_EXPERTS / 32) emask[tid] = 0u;
    }
    __syncthreads();
    fp4_pdl_wait();
    fp4_pdl_trigger();
    if (one) { /* warp 0: its lane s holds choice s; the slot of an expert is its rank by id */
        if (warp == 0) {
            float pv[J];
#pragma unroll
            for (int j = 0; j < J; j++) {
                int e = lane + 32 * j;
                pv[j] = e < n_experts ? logits[e] : 0.f;
            }
            int id, r = 0;
            float wt;
            if (route_select_warp(pv, bv, n_experts, k, scoring, norm_topk, scaling, ids, w, id,
                                  wt)) {
                if (lane == 0) fell_back = 1;
            } else { /* no fallback: the k ids differ */
                for (int o = 0; o < k; o++) r += __shfl_sync(0xffffffffu, id, o) < id;
                if (lane < k) {
                    tile_expert[r] = id;
                    row_src[FP4_DEC_TILE_T * r] = 0;
                    row_dst[FP4_DEC_TILE_T * r] = lane;
                    row_w[FP4_DEC_TILE_T * r] = wt;
                }
            }
        }
        __syncthreads();
        if (fell_back) /* repeated ids: the general grouping (every slot and row rewritten) */
            group_pairs(ids, w, k, k, n_experts, n_slots, FP4_DEC_TILE_T, tile_expert, row_src,
                        row_dst, row_w);
        return;
    }
    int sel_id[TG_TOK];
    float sel_w[TG_TOK];
#pragma unroll
    for (int i = 0; i < TG_TOK; i++) {
        const int t = warp + (TG_THREADS / 32) * i;
        sel_id[i] = 0, sel_w[i] = 0.f;
        if (t >= m) break;
        float pv[J];
#pragma unroll
        for (int j = 0; j < J; j++) {
            int e = lane + 32 * j;
            pv[j] = e < n_experts ? logits[(size_t)t * n_experts + e] : 0.f;
        }
        if (route_select_warp(pv, bv, n_experts, k, scoring, norm_topk, scaling,
                              ids + (size_t)t * k, w + (size_t)t * k, sel_id[i], sel_w[i]) &&
            lane == 0)
            fell_back = 1;
        for (int s = lane; s < k; s += 32) {
            const int e = s < 32 ? sel_id[i] : ids[(size_t)t * k + s];
            atomicOr(&tmask[e], 1ull << t);
            if (few) atomicOr(&emask[e >> 5], 1u << (e & 31));
        }
    }
    __syncthreads(); /* the masks of all tokens; ids / w written by this block */
    if (fell_back) { /* repeated ids: rows by pair counts (rows emptied again, harmless) */
        group_pairs(ids, w, m * k, k, n_experts, n_slots, FP4_DEC_TILE_T, tile_expert, row_src,
                    row_dst, row_w);
        return;
    }
    if (!few) {
        scan_tiles(tid < n_experts ? (__popcll(tmask[tid]) + FP4_DEC_TILE_T - 1) / FP4_DEC_TILE_T
                                   : 0,
                   n_experts, tstart);
        for (int s = tid; s < n_slots; s += TG_THREADS) tile_expert[s] = fp4_slot_expert(s, n_experts, tstart);
    }
    /* first slot of expert e: few, the chosen experts below e (no scan, no search) */
    auto first_slot = [&](int e) -> int {
        if (!few) return tstart[e];
        int r = __popc(emask[e >> 5] & ((1u << (e & 31)) - 1u));
#pragma unroll
        for (int q = 0; q < FP4_DEC_MAX_EXPERTS / 32; q++)
            if (q < (e >> 5)) r += __popc(emask[q]);
        return r;
    };
    /* the scatter: pair (t, s) into its expert's segment at its rank in token order */
#pragma unroll
    for (int i = 0; i < TG_TOK; i++) {
        const int t = warp + (TG_THREADS / 32) * i;
        if (t >= m) break;
        const unsigned long long before = (1ull << t) - 1ull;
        for (int s = lane; s < k; s += 32) {
            const int e = s < 32 ? sel_id[i] : ids[(size_t)t * k + s];
            const int row = __popcll(tmask[e] & before), slot = first_slot(e);
            if (few && row == 0) tile_expert[slot] = e;
            const int pos = slot * FP4_DEC_TILE_T + row;
            row_src[pos] = t;
            row_dst[pos] = t * k + s;
            row_w[pos] = s < 32 ? sel_w[i] : w[(size_t)t * k + s];
        }
    }
}

extern "C" cudaError_t fp4_dec_route_prep(const uint16_t *x, const float *router,
                                          const float *bias, int m, int h, int n_experts,
                                          int k, int scoring, int norm_topk, float scaling,
                                          float *logits, int32_t *ids, float *w, int n_slots,
                                          int32_t *tile_expert, int32_t *row_src,
                                          int32_t *row_dst, float *row_w, uint16_t *xp,
                                          cudaStream_t stream)
{
    if (!x || !router || !logits || !ids || !w || !tile_expert || !row_src || !row_dst ||
        !row_w || !xp || m < 1 || m > FP4_DEC_ROUTE_MAX_M || h < 64 || h % 64 ||
        h > FP4_DEC_ROUTE_MAX_H || n_experts < 1 || n_experts > FP4_DEC_MAX_EXPERTS || k < 1 ||
        k > n_experts || n_slots != (m * k + FP4_DEC_TILE_T - 1) / FP4_DEC_TILE_T + n_experts)
        return cudaErrorInvalidValue;
    dim3 grid((unsigned)n_experts, (unsigned)((m + FP4_DEC_TILE_T - 1) / FP4_DEC_TILE_T));
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = fp4_pdl_config(grid, dim3(RL_THREADS), 0, stream, at);
    cudaError_t err = cudaLaunchKernelEx(&cfg, fp4_dec_logits_kernel, x, router, m, h, n_experts,
                                         logits, xp);
    if (err != cudaSuccess) return err;
    cfg = fp4_pdl_config(dim3(1), dim3(TG_THREADS), 0, stream, at);
    return cudaLaunchKernelEx(&cfg, fp4_dec_topk_group_kernel, (const float *)logits, bias, m,
                              n_experts, k, scoring, norm_topk, scaling, ids, w, n_slots,
                              tile_expert, row_src, row_dst, row_w);
}

/* Dynamic shared memory (beyond the kernel's static rings) that holds a grid of one wave to
 * ceil(blocks / SMs) blocks per SM where registers would let an SM take more, so that no SM
 * runs more of the grid's blocks than the even share. 0: the grid is not one wave, or the
 * share is already the limit. H200, tp8 shapes, M=1 (FC1 384 / 192 blocks and the one-token
 * FC2 384, 4 per SM by registers; bench/NOTES.md eighteenth session): layer -0.9 to -2.1%
 * top-8, -0.9 to -1.2% top-4, -4.2% at I = 3072. For the kernels without staged activations
 * (KS 8, and BF16 weights: their dynamic shared memory is unused). A few runtime queries per
 * launch (host). */
/* m16 tiles of one block: its row warps x their tiles (the grid's y is the tiles over this) */
static constexpr int dec_block_tiles(int ks, int rt) { return DEC_WARPS / ks * rt; }

/* The current device and its SM count (0 where a query fails) for the launch rules below. */
static int dec_sm_count(int *dev)
{
    int n_sm;
    return cudaGetDevice(dev) ||
                   cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, *dev)
               ? 0
               : n_sm;
}

static size_t dec_spread_bytes(const void *kern, long long blocks)
{
    int dev, smem_sm, optin, reserved, natural, got;
    const int n_sm = dec_sm_count(&dev);
    cudaFuncAttributes fa;
    /* any query that fails (cudaSuccess is 0): no padding */
    if (n_sm < 1 ||
        cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ||
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) ||
        cudaFuncGetAttributes(&fa, kern) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&natural, kern, DEC_THREADS, 0))
        return 0;
    const long long cap = (blocks + n_sm - 1) / n_sm;
    if (cap >= natural) return 0;
    /* a block just over 1 / (cap + 1) of the SM's shared memory: cap of them fit, not cap + 1 */
    const long long stat = (long long)fa.sharedSizeBytes;
    const long long pad = smem_sm / (cap + 1) + 1 - reserved - stat;
    if (pad <= 0 || pad + stat > optin) return 0;
    /* raised once per kernel; not a stream operation */
    if (pad > fa.maxDynamicSharedSizeBytes &&
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pad))
        return 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, kern, DEC_THREADS, (size_t)pad) ||
        got != cap)
        return 0;
    return (size_t)pad;
}

/* 8-token slots of long K at KS 2 (staged activations, 4 row warps x RT 2 per K slice)
 * instead of KS 8: when that grid has at least dec_ks2_per_sm blocks per SM (at H = 6144, I =
 * 3072 FC1 and FC2 have the same grid: 48 blocks per slot). H200, whole layer, against KS 8
 * (bench/NOTES.md nineteenth session): every 8-token long-K launch at KS 2 lost 2-7% at I =
 * 3072 M=1-4 (3-13 blocks per SM) and 10-16% at tp8 (I = 384) M=2 / 8 (2-7 per SM), ranged
 * -2 to +3% at tp8 M=32-64 (15-17 per SM) and won from I = 3072 M=8 on (26 per SM: -4%; 52-70:
 * -8 to -12%). At the bound 24: I = 3072 top-8 M=8 -4.1%, 16 -8.3%, 64 -12.1%, top-4 M=16
 * -5.1%, 64 -9.2%; at 32, M=8 and top-4 M=16 (26 per SM) stay at KS 8. A few long blocks lose
 * to many short ones until there are enough of them. With the codes in 8-row tiles
 * (thirty-first session, bench/problems_ks2r.txt) the bound 12 against 24: I = 3072 M=4 (13
 * per SM) -3.0%, tp8 M=16-96 and top-4 M=128 / 192 -0.3 to +0.5%; 40: I = 3072 M=8 +6.4%. */
static int dec_ks2_per_sm = 12;

/* The launcher's switches (tests set them before any forward) and its reports of the last
 * launch (relaxed atomics: every launch writes). */
static int dec_switch(int *sw, int v)
{
    const int old = *sw;
    *sw = v;
    return old;
}
static int dec_report(const int *last) { return __atomic_load_n(last, __ATOMIC_RELAXED); }

extern "C" int fp4_dec_set_ks2_per_sm(int per_sm) { return dec_switch(&dec_ks2_per_sm, per_sm); }

static bool dec_ks2_pays(long long blocks)
{
    int dev;
    const int n_sm = dec_sm_count(&dev);
    return n_sm > 0 && blocks >= (long long)dec_ks2_per_sm * n_sm;
}

static int dec_last_sc; /* fp4_dec_last_scale_chunks (relaxed atomics: every launch writes) */

/* The shallow ring (SH in dec_ring: 2 groups in flight per warp instead of 7) for the KS 8
 * RT 1 kernels, the one-token FC2 included, where the grid is one wave (at most 4 blocks per
 * SM, the registers' limit) and at least 24 warps per SM stream weights (3 blocks of 8; the
 * one-token FC2 streams with its slots' warps, dec_ot_split: all 8 at top-8, and at top-4
 * where K has an even number of groups). At M=1 top-8
 * (tp8: FC1 and the one-token FC2, 384 blocks each) a warp's first groups then land sooner,
 * since the SMs ask for less at once, and its work starts earlier (bench/micro/dram_pattern
 * --ahead: 2-3 groups ahead best at 24 warps per SM). H200, whole layer, against the deep
 * ring (bench/NOTES.md thirty-fifth session): SH for every RT 1 launch -5.4% at tp8 top-8
 * M=1, -1.2% at I = 3072 M=1, +1.2% top-4 M=1 (FC1 at 2 blocks per SM, the one-token FC2 at
 * 4 warps a block), +0.9% at M=8 (FC1 over several waves); for FC1 and the one-token FC2 in
 * one-wave grids of 3-4 blocks per SM -5.7% top-8 M=1, -1.4% at I = 3072 M=1, top-4 M=1 -0.7
 * and +3.5% in two calls; either kernel alone -1.9% / +0.9% at top-8 M=1 (those with 3 groups
 * in flight; 2 against 3, thirty-eighth session: top-8 M=1 -2.3%, 8 passes). dec_shallow_force:
 * 0 the rule, 1 every launch that has the shallow form, 2 none (tests: same products, bit for
 * bit).
 * The KS 8 RT 2 kernels (FC1 at M = 2-64 on tp8 shapes, FC2 where I >= 1024) take their
 * shallow form, 2 groups of two tiles in flight per warp instead of 3 (their ring stays 4
 * groups: a pass), in every grid: against 3, whole layer, tp8 top-8 M=2-64 -0.5 to -2.9%
 * over two calls (M=8 +0.3% in one of them), top-4 M=4 / 32 -0.9 to -1.5%, I = 3072 M=1-8
 * +-0.2%; a lead of 1 lost (+0.1 to +6.6%). */
static int dec_shallow_force;
static int dec_last_sh; /* fp4_dec_last_shallow (relaxed atomics: every launch writes) */

extern "C" int fp4_dec_set_shallow_ring(int force) { return dec_switch(&dec_shallow_force, force); }

extern "C" int fp4_dec_last_shallow(void) { return dec_report(&dec_last_sh); }

static bool dec_shallow_pays(int rt, int warps, long long blocks)
{
    if (dec_shallow_force) return dec_shallow_force == 1;
    if (rt == 2) return true;
    int dev;
    const int n_sm = dec_sm_count(&dev);
    const long long per_sm = n_sm > 0 ? (blocks + n_sm - 1) / n_sm : 0;
    return per_sm >= 1 && per_sm <= 4 && per_sm * warps >= 3 * DEC_WARPS;
}

/* Four blocks per SM for the shallow KS 8 RT 2 kernels (B4 in fp4_dec_kernel) in grids of 20
 * or more blocks per SM. H200, whole layer, tp8 shapes, against 3 per SM (both with the
 * shorter lead; bench/NOTES.md thirty-sixth session): top-8 M=16 / 32 / 64 (26-35 blocks per
 * SM) -1.5 / -3.0 / -3.8%, top-4 M=32 -2.9%, I = 3072 M=2 -5.7% (FC2 at 25 per SM, FC1 at
 * 12); but M=2 / 4 (3 and 6.5 per SM) +3.8 / +6.2%, top-4 M=4 +3.5%, M=8 (13 per SM) +0.7 /
 * +2.2%: below ~20 per SM the fourth block makes the waves (or the one wave) uneven. */
static bool dec_four_pays(long long blocks)
{
    int dev;
    const int n_sm = dec_sm_count(&dev);
    return n_sm > 0 && blocks >= 20LL * n_sm;
}

/* Groups per warp compiled as a constant (NG in dec_block: its passes unrolled, every ring
 * stage and copy offset an immediate) in the RT 2 kernels of KS 1 and 8: 6 and 12, the K
 * slices of the tp8 shapes (FC2 K = 384 at KS 1, FC1 K = 6144 and the I = 3072 FC2 at KS 8);
 * 0: K at run time. */
template <int WF, int KS, int RT, int NB, bool OT> static constexpr bool dec_ng_kernels(void)
{
    return WF == FP4_DEC_W_NVFP4 && RT == 2 && NB <= 2 && !OT && (KS == 1 || KS == DEC_WARPS);
}
static int dec_ng_on = 1;
static int dec_last_ng; /* fp4_dec_last_ng (relaxed atomics: every launch writes) */

extern "C" int fp4_dec_set_ng(int on) { return dec_switch(&dec_ng_on, on != 0); }
extern "C" int fp4_dec_last_ng(void) { return dec_report(&dec_last_ng); }

/* for the kernels dec_ng_kernels admits: the constant of their K loop, or 0 */
template <int KS> static int dec_ng(const fp4_dec_gemm_args *p)
{
    const int groups = p->k / 64;
    if (!dec_ng_on || groups % KS) return 0;
    const int per_warp = groups / KS;
    return per_warp == 6 || (per_warp == 12 && KS == DEC_WARPS) ? per_warp : 0;
}

template <int WF, int GATED, int KS, int RT, int NB, bool OT, bool SC, bool SH, bool B4 = false>
static cudaError_t launch_grid(const fp4_dec_gemm_args *p, dim3 grid, cudaStream_t stream)
{
    __atomic_store_n(&dec_last_sc, (int)SC, __ATOMIC_RELAXED);
    __atomic_store_n(&dec_last_sh, (int)SH, __ATOMIC_RELAXED);
    auto kern = fp4_dec_kernel<WF, GATED, KS, RT, NB, OT, SC, SH, B4>;
    int ng = 0;
    if constexpr (dec_ng_kernels<WF, KS, RT, NB, OT>()) {
        ng = dec_ng<KS>(p);
        if (ng == 6) kern = fp4_dec_kernel<WF, GATED, KS, RT, NB, OT, SC, SH, B4, 6>;
        if constexpr (KS == DEC_WARPS)
            if (ng == 12) kern = fp4_dec_kernel<WF, GATED, KS, RT, NB, OT, SC, SH, B4, 12>;
    }
    __atomic_store_n(&dec_last_ng, ng, __ATOMIC_RELAXED);
    const long long blocks = (long long)grid.x * grid.y;
    const size_t xs = dec_xs(WF, KS) ? (size_t)dec_xs_bytes(KS, 8 * NB, p->k)
                                     : dec_spread_bytes((const void *)kern, blocks);
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = fp4_pdl_config(grid, dim3(DEC_THREADS), xs, stream, at);
    return cudaLaunchKernelEx(&cfg, kern, *p);
}

template <int WF, int GATED, int KS, int RT, int NB, bool OT = false, bool SC = false>
static cudaError_t launch(const fp4_dec_gemm_args *p, cudaStream_t stream)
{
    const int n_tiles = GATED ? p->n / 8 : p->n / 16, per_block = dec_block_tiles(KS, RT);
    const int grid_y = (n_tiles + per_block - 1) / per_block; /* KS 8 RT 1: one tile a block */
    if (grid_y > 65535) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)p->n_slots, (unsigned)grid_y);
    /* warps of a block that stream weights; the one-token FC2: dec_ot_split's per slot of the
     * table (its a_rows / 8 slots: an upper bound of those in use) */
    const int warps = OT ? p->a_rows / 8 * dec_ot_split(p->a_rows, p->k) : DEC_WARPS;
    const long long blocks = (long long)grid.x * grid.y;
    if constexpr (WF == FP4_DEC_W_NVFP4 && KS == DEC_WARPS && NB == 1)
        if (dec_shallow_pays(RT, warps, blocks)) {
            if constexpr (RT == 2)
                if (dec_four_pays(blocks))
                    return launch_grid<WF, GATED, KS, RT, NB, OT, SC, true, true>(p, grid, stream);
            return launch_grid<WF, GATED, KS, RT, NB, OT, SC, true>(p, grid, stream);
        }
    return launch_grid<WF, GATED, KS, RT, NB, OT, SC, false>(p, grid, stream);
}

/* The staged-activation kernels (NVFP4, KS 1 and 2: the ones launch_nv instantiates) may take
 * up to DEC_XS_MAX_BYTES of dynamic shared memory beside their static rings. */
template <int GATED> static cudaError_t xs_init(void)
{
    const int NV = FP4_DEC_W_NVFP4;
    const void *kern[] = {(const void *)fp4_dec_kernel<NV, GATED, 1, 1, 1>,
                          (const void *)fp4_dec_kernel<NV, GATED, 1, 2, 1>,
                          (const void *)fp4_dec_kernel<NV, GATED, 1, 2, 2>,
                          (const void *)fp4_dec_kernel<NV, GATED, 1, 2, 4>,
                          (const void *)fp4_dec_kernel<NV, GATED, 2, 2, 1>,
                          (const void *)fp4_dec_kernel<NV, GATED, 2, 2, 2>,
                          (const void *)fp4_dec_kernel<NV, GATED, 2, 2, 4>,
                          (const void *)fp4_dec_kernel<NV, GATED, 2, 2, 1, false, true>,
                          (const void *)fp4_dec_kernel<NV, GATED, 2, 2, 2, false, true>,
                          (const void *)fp4_dec_kernel<NV, GATED, 2, 2, 4, false, true>,
                          (const void *)fp4_dec_kernel<NV, GATED, 1, 2, 1, false, false, false, false, 6>,
                          (const void *)fp4_dec_kernel<NV, GATED, 1, 2, 2, false, false, false, false, 6>};
    for (size_t i = 0; i < sizeof kern / sizeof kern[0]; i++) {
        cudaError_t err = cudaFuncSetAttribute(kern[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               DEC_XS_MAX_BYTES);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

extern "C" cudaError_t fp4_dec_gemm_init(void)
{
    cudaError_t err = xs_init<0>();
    return err != cudaSuccess ? err : xs_init<1>();
}

/* Scale chunks (SC in dec_block): a K slice's scale words of DEC_UN groups are one 16-byte
 * copy per row where every chunk is 16-byte aligned: K slices of the K-split kernels (KS 2 and
 * 8; KS 1 has no long K) that start at a multiple of 4 groups ((k / 64) % (4 KS) == 0, so k %
 * 256 == 0 too) and a 16-byte aligned scale array. The products are the same (the same
 * scale words reach the same instructions), so the output is bit for bit the per-group
 * copies' (test_gpu_scale_chunks compares them with the switch below). H200, whole layer,
 * against per-group 4-byte copies (bench/NOTES.md thirtieth session): -3.0% at tp8 top-8
 * M=1, -2.1% top-4 M=1, -2.1% at M=8 and 16, -3.5 to -4.7% at M=32-192, -3.4% top-4 M=128,
 * -2.0% at I = 3072 M=8 (its FC2, k = 3072 at KS 8, is not aligned: per group); M=2 +0.5 /
 * +1.5% in two calls. With every scale copy removed (wrong numbers, a bound) M=8 was -6%: the copies'
 * count, not their bytes (1/8 of the weights'), is what costs. */
static int dec_sc_on = 1;

extern "C" int fp4_dec_set_scale_chunks(int on) { return dec_switch(&dec_sc_on, on != 0); }
extern "C" int fp4_dec_last_scale_chunks(void) { return dec_report(&dec_last_sc); }

static bool dec_scale_chunks(const fp4_dec_gemm_args *p, int ks)
{
    return dec_sc_on && ks >= 2 && (p->k / 64) % (4 * ks) == 0 && ((uintptr_t)p->ws & 15) == 0;
}

template <int GATED, int KS, int RT, int NB>
static cudaError_t launch_sc(const fp4_dec_gemm_args *p, cudaStream_t stream)
{
    const int NV = FP4_DEC_W_NVFP4;
    if constexpr (KS >= 2)
        if (dec_scale_chunks(p, KS)) return launch<NV, GATED, KS, RT, NB, false, true>(p, stream);
    return launch<NV, GATED, KS, RT, NB>(p, stream);
}

/* NVFP4: wider slots share one A fragment over NB n8 tiles. RT 2 (two m16 tiles share each
 * B fragment: half the activation re-reads) when asked, and always for 16- and 32-token
 * slots (they come with KS 1 or 2: staged activations, no prefetch registers). 8-token slots
 * run at any KS (at KS 2 with RT 2), wider ones at KS 1 and 2 only. */
template <int GATED, int KS>
static cudaError_t launch_nv(const fp4_dec_gemm_args *p, int rt2, cudaStream_t stream)
{
    if constexpr (KS <= 2) {
        if (p->tile_t == 16) return launch_sc<GATED, KS, 2, 2>(p, stream);
        if (p->tile_t == 32) return launch_sc<GATED, KS, 2, 4>(p, stream);
    }
    if (p->tile_t == 8 || !p->tile_t) {
        if constexpr (KS == 2) /* RT 2 always (dec_ks2_pays) */
            return launch_sc<GATED, KS, 2, 1>(p, stream);
        else
            return rt2 ? launch_sc<GATED, KS, 2, 1>(p, stream) : launch_sc<GATED, KS, 1, 1>(p, stream);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t fp4_dec_gemm(const fp4_dec_gemm_args *p, cudaStream_t stream)
{
    __atomic_store_n(&dec_last_sc, 0, __ATOMIC_RELAXED); /* a refused call ran nothing */
    __atomic_store_n(&dec_last_ng, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&dec_last_sh, 0, __ATOMIC_RELAXED);
    if (!p || !p->a || !p->out || p->k < 64 || p->k % 64 || p->n < 16 ||
        p->n % (p->gated ? 8 : 16) || p->n_slots < 1 || p->a_rows < 1 ||
        p->tiles_per_warp < 0 || p->tiles_per_warp > 2 ||
        (!p->tile_expert && (p->row_src || p->row_dst)))
        return cudaErrorInvalidValue;
    const int tt = p->tile_t ? p->tile_t : FP4_DEC_TILE_T;
    if ((tt != 8 && (tt != 16 && tt != 32 || p->wfmt != FP4_DEC_W_NVFP4)) ||
        p->n_slots > 0x7fffffff / tt)
        return cudaErrorInvalidValue;
    if (p->wfmt == FP4_DEC_W_NVFP4 ? (!p->wq || !p->ws) : (p->wfmt != FP4_DEC_W_BF16 || !p->wb))
        return cudaErrorInvalidValue;
    /* the cp.async ring copies 16-byte weight chunks and 4-byte scale words */
    if (p->wfmt == FP4_DEC_W_NVFP4 && (((uintptr_t)p->wq & 15) || ((uintptr_t)p->ws & 3)))
        return cudaErrorInvalidValue;
    /* Long K (FC1: K = H) is split over the 8 warps of a block so that a few slots still
     * fill the machine; with 16- or 32-token slots (several tokens per expert on average, so
     * most experts are hit), or 8-token slots in a grid large enough (dec_ks2_pays), over 2 K
     * slices of 4 row warps that share staged activations. Short K (FC2 at I < 1024) runs
     * whole per warp, 8 row warps per block. */
    if (p->one_token) { /* one token's slots, one per warp (one_token in the header) */
        if (p->wfmt != FP4_DEC_W_NVFP4 || p->gated || !p->tile_expert || !p->row_dst ||
            !p->row_w || p->row_src || p->n_slots != 1 || tt != 8 || p->tiles_per_warp > 1 ||
            p->a_rows % 8 || p->a_rows > 8 * DEC_WARPS || p->out_bf16)
            return cudaErrorInvalidValue;
        return launch<FP4_DEC_W_NVFP4, 0, DEC_WARPS, 1, 1, true>(p, stream);
    }
    const int ks_long = p->k / 64 >= DEC_KS8_GROUPS;
    const int rt2 = p->tiles_per_warp == 2;
    const int n_tiles = p->gated ? p->n / 8 : p->n / 16;
    const int ks2 = ks_long && p->wfmt == FP4_DEC_W_NVFP4 &&
                    (tt > 8 || dec_ks2_pays((long long)p->n_slots *
                                            ((n_tiles + dec_block_tiles(2, 2) - 1) /
                                             dec_block_tiles(2, 2))));
    const int ks8 = ks_long && !ks2;
    if (p->wfmt == FP4_DEC_W_NVFP4) {
        if (p->gated)
            return ks8 ? launch_nv<1, 8>(p, rt2, stream)
                       : ks2 ? launch_nv<1, 2>(p, rt2, stream) : launch_nv<1, 1>(p, rt2, stream);
        return ks8 ? launch_nv<0, 8>(p, rt2, stream)
                   : ks2 ? launch_nv<0, 2>(p, rt2, stream) : launch_nv<0, 1>(p, rt2, stream);
    }
    /* BF16 weights (shared experts only): one tile per warp (two spill), 8-token slots. */
    const int BF = FP4_DEC_W_BF16;
    if (p->gated) return ks8 ? launch<BF, 1, 8, 1, 1>(p, stream) : launch<BF, 1, 1, 1, 1>(p, stream);
    return ks8 ? launch<BF, 0, 8, 1, 1>(p, stream) : launch<BF, 0, 1, 1, 1>(p, stream);
}
