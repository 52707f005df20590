/*
 * moe_route.cu - the MoE router (DESIGN.md section 4 step 1), matching fp4_ref_route:
 * logits from bf16 x and the fp32 router [E, H], sigmoid or softmax scoring, top-k by
 * score + correction bias with ties to the lower expert id, weights renormalized over the
 * chosen k (if configured) and times routed_scaling_factor.
 *
 * Logits on the BF16 tensor cores at fp32 precision: the router is stored as three bf16
 * planes (fp4_gpu_router_split: hi + mid + lo == the fp32 value exactly), each product of a
 * bf16 x by a plane is exact in fp32, and mma.sync accumulates in fp32 - so a logit carries
 * the rounding of an fp32 dot product (not the reference's double), at a third of the
 * tensor-core rate instead of the fp32 FMA rate.
 *   - fp4_route_logits_kernel: a block owns 64 tokens x 64 experts and the split q of the
 *     H / 32 k-chunks; x rows and the three plane rows stream through a 3-stage cp.async
 *     ring, each warp computes 32 tokens x 32 experts (ldmatrix + m16n8k16). The S splits
 *     (from M, so that small M still fills the GPU) go to scratch [S][M][E].
 *   - fp4_route_topk_kernel: a warp per token sums the S partials pairwise in q order, then
 *     scores and top-k.
 * From ROUTE_WG_MIN_M tokens on, on sm_90a with H % 64 == 0, the logits come from the wgmma
 * kernel of route_logits_sm90.cu instead (128 experts x 256 tokens a block, one block per SM:
 * the planes read once per 256 tokens), with the same partials and the same top-k kernel.
 * Every launch is a programmatic dependent of the kernel before it (device_util.cuh).
 * Limits: E <= 256, H <= 16384 and H % 32 == 0; the 64-expert tile wastes work for E < 64.
 */
#include "moe_route.cuh"
#include "device_util.cuh"
#include "route_logits_sm90.cuh"
#include "route_select.cuh"

#define ROUTE_TM 64             /* tokens per logits block */
#define ROUTE_TE 64             /* experts per logits block */
#define ROUTE_MAX_SPLIT 32      /* most k splits of one tile */
#define ROUTE_TARGET_BLOCKS 256 /* logits blocks wanted before splitting k (2 per SM) */
#define ROUTE_MAX_H 16384
#define ROUTE_THREADS 128       /* 4 warps of 32 tokens x 32 experts */
#define ROUTE_KC 32             /* k per ring stage */
#define ROUTE_STAGES 3
#define ROUTE_PITCH 40          /* bf16 per shared row: 32 + 8 puts ldmatrix rows on distinct banks */
#define ROUTE_ROWS (ROUTE_TM + 3 * ROUTE_TE) /* shared rows a stage: x tile, then planes */
#define ROUTE_STAGE_BYTES (ROUTE_ROWS * ROUTE_PITCH * 2)
#define ROUTE_SMEM (ROUTE_STAGES * ROUTE_STAGE_BYTES)
#define ROUTE_COPIES (ROUTE_ROWS * (ROUTE_KC / 8) / ROUTE_THREADS) /* 16-byte copies a thread */
#define ROUTE_TOPK_WARPS 8
#define ROUTE_WG_MIN_M 512       /* tokens from which the wgmma logits kernel serves: the
                                    prologue at top-8 (bench/NOTES.md, thirteenth session) was
                                    +3 us at 64-128 tokens, +1.2 at 224, -2.5 at 512, -52 at 4096 */
#define ROUTE_WG_TARGET_BLOCKS 128 /* its blocks wanted before splitting k (1 per SM) */

/* The one rule for the logits kernel: wgmma from ROUTE_WG_MIN_M tokens on where it can run. */
extern "C" int fp4_moe_route_uses_wgmma(int m, int h)
{
    return m >= ROUTE_WG_MIN_M && h % 64 == 0 && fp4_route_logits_sm90_ready();
}

/* K split S (power of two, <= 32) of a logits grid of tiles blocks: the smallest that gives it
 * target blocks. Depends on m and E only, so graphs stay valid per m. */
static int route_split(long long tiles, int target)
{
    int s = 1;
    while (s < ROUTE_MAX_SPLIT && tiles * s < target) s *= 2;
    return s;
}

static long long route_tiles(int m, int n_experts, int tm, int te)
{
    return (long long)((n_experts + te - 1) / te) * ((m + tm - 1) / tm);
}

/* A bound on S * m rows of partials that never decreases with m (callers size the workspace
 * for their largest m), for either kernel: S * m <= 32 m always, and for S > 1 the split
 * stopped at S * tiles < 2 * target, so S * m <= S * TM * ceil(m / TM) < 2 * target * TM /
 * ceil(E / TE). */
extern "C" size_t fp4_moe_route_scratch_bytes(int m, int n_experts)
{
    if (m < 1 || n_experts < 1) return 0;
    long long cap = 2LL * ROUTE_TARGET_BLOCKS * ROUTE_TM / ((n_experts + ROUTE_TE - 1) / ROUTE_TE);
    long long cap_wg = 2LL * ROUTE_WG_TARGET_BLOCKS * FP4_RW_TOKENS /
                       ((n_experts + FP4_RW_EXPERTS - 1) / FP4_RW_EXPERTS);
    if (cap_wg > cap) cap = cap_wg;
    long long rows = m > cap ? m : cap;
    if (rows > (long long)ROUTE_MAX_SPLIT * m) rows = (long long)ROUTE_MAX_SPLIT * m;
    return (size_t)rows * (size_t)n_experts * sizeof(float);
}

__global__ void __launch_bounds__(ROUTE_THREADS, 3) /* 3 per SM: shared memory */
fp4_route_logits_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ planes,
                        int m, int h, int n_experts, int split, float *__restrict__ part)
{
    extern __shared__ __align__(16) uint16_t route_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int e0 = blockIdx.x * ROUTE_TE, t0 = blockIdx.y * ROUTE_TM, q = blockIdx.z;
    const int nk = h / ROUTE_KC;
    const int c0 = (int)((long long)nk * q / split), c1 = (int)((long long)nk * (q + 1) / split);
    const size_t plane = (size_t)n_experts * h;
    fp4_pdl_wait();
    fp4_pdl_trigger();

    /* copy roles: 16-byte chunk tid + 128 j of a stage is shared row r = tid / 4 + 32 j
     * (x rows 0..63, then planes 0..2 x 64 experts), bytes 16 (tid % 4) of its 64 */
    const uint16_t *src[ROUTE_COPIES];
    int nbytes[ROUTE_COPIES];
    const uint32_t base = smem_u32(route_smem);
    const uint32_t dst0 = base + (uint32_t)(((tid >> 2) * ROUTE_PITCH + 8 * (tid & 3)) * 2);
#pragma unroll
    for (int j = 0; j < ROUTE_COPIES; j++) {
        const int r = (tid >> 2) + 32 * j, col = 8 * (tid & 3);
        bool ok;
        if (r < ROUTE_TM) {
            ok = t0 + r < m;
            src[j] = x + (size_t)(ok ? t0 + r : 0) * h + col;
        } else {
            const int p = (r - ROUTE_TM) / ROUTE_TE, e = e0 + (r - ROUTE_TM) % ROUTE_TE;
            ok = e < n_experts;
            src[j] = planes + p * plane + (size_t)(ok ? e : 0) * h + col;
        }
        nbytes[j] = ok ? 16 : 0;
    }
    auto issue = [&](int c) { /* chunk c into its stage, one commit either way */
        if (c < c1) {
            const uint32_t d = dst0 + (uint32_t)(((c - c0) % ROUTE_STAGES) * ROUTE_STAGE_BYTES);
#pragma unroll
            for (int j = 0; j < ROUTE_COPIES; j++)
                cp_async16(d + j * 32 * ROUTE_PITCH * 2, src[j] + (size_t)c * ROUTE_KC, nbytes[j]);
        }
        cp_async_commit();
    };

    /* warp tile: tokens 32 (warp & 1) .. + 32 (two m16 tiles) x experts 32 (warp >> 1) .. + 32
     * (four n8 tiles); acc[mt][nt] */
    const int wt = 32 * (warp & 1), we = 32 * (warp >> 1);
    float acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mt][i][c] = 0.f;
    /* ldmatrix rows: A (x, 16 x 16) and B (two n8 tiles of a plane, [expert][k]) */
    const int a_row = wt + (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int b_row = we + (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;

#pragma unroll
    for (int i = 0; i < ROUTE_STAGES - 1; i++) issue(c0 + i);
    for (int c = c0; c < c1; c++) {
        cp_async_wait<ROUTE_STAGES - 2>();
        __syncthreads(); /* chunk c landed for every thread; stage of c - 1 free */
        issue(c + ROUTE_STAGES - 1);
        const uint32_t sb = base + (uint32_t)(((c - c0) % ROUTE_STAGES) * ROUTE_STAGE_BYTES);
#pragma unroll
        for (int kk = 0; kk < ROUTE_KC / 16; kk++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldmatrix_x4(a[mt], sb + (uint32_t)(((a_row + 16 * mt) * ROUTE_PITCH + 16 * kk + a_col) * 2));
#pragma unroll
            for (int p = 0; p < 3; p++)
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    uint32_t b[4];
                    const int row = ROUTE_TM + ROUTE_TE * p + 16 * np + b_row;
                    ldmatrix_x4(b, sb + (uint32_t)((row * ROUTE_PITCH + 16 * kk + b_col) * 2));
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma_bf16(acc[mt][2 * np], a[mt], b[0], b[1]);
                        mma_bf16(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
                    }
                }
        }
    }
    cp_async_wait<0>();

    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int tok = t0 + wt + 16 * mt + g + (c >= 2 ? 8 : 0);
                const int e = e0 + we + 8 * nt + 2 * t + (c & 1);
                if (tok < m && e < n_experts)
                    part[((size_t)q * m + tok) * n_experts + e] = acc[mt][nt][c];
            }
}

/* Sum of N subtree partials p[0], p[stride], ... as the complete binary tree in order. */
template <int N> struct route_tree {
    static __device__ __forceinline__ float sum(const float *p, size_t stride)
    {
        return route_tree<N / 2>::sum(p, stride) + route_tree<N / 2>::sum(p + (N / 2) * stride, stride);
    }
};
template <> struct route_tree<1> {
    static __device__ __forceinline__ float sum(const float *p, size_t) { return *p; }
};

/* Warp per token: logits from the S partials (summed pairwise in q order), then the routing
 * rule (route_select.cuh). */
template <int S>
__global__ void __launch_bounds__(ROUTE_TOPK_WARPS * 32)
fp4_route_topk_kernel(const float *__restrict__ part, const float *__restrict__ bias, int m,
                      int n_experts, int k, int scoring, int norm_topk, float scaling,
                      int32_t *__restrict__ ids, float *__restrict__ w)
{
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * ROUTE_TOPK_WARPS + (threadIdx.x >> 5);
    if (t >= m) return;
    constexpr int J = FP4_ROUTE_LANE_EXPERTS;
    float bv[J];
    route_bias_lane(bv, bias, n_experts); /* a constant of the layer: before the wait */
    fp4_pdl_wait();
    fp4_pdl_trigger();
    const size_t stride = (size_t)m * n_experts;
    float pv[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = lane + 32 * j;
        pv[j] = e < n_experts ? route_tree<S>::sum(part + (size_t)t * n_experts + e, stride) : 0.f;
    }
    int sel_id;
    float sel_w;
    route_select_warp(pv, bv, n_experts, k, scoring, norm_topk, scaling, ids + (size_t)t * k,
                      w + (size_t)t * k, sel_id, sel_w);
}

extern "C" cudaError_t fp4_moe_route_init(void)
{
    /* the wgmma kernel exists only on sm_90: elsewhere its init fails and it never serves */
    if (fp4_route_logits_sm90_init() != cudaSuccess) (void)cudaGetLastError();
    return cudaFuncSetAttribute(fp4_route_logits_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                ROUTE_SMEM);
}

extern "C" cudaError_t fp4_moe_route(const uint16_t *x, const uint16_t *planes, const float *bias,
                                     int m, int h, int n_experts, int k, int scoring,
                                     int norm_topk, float scaling, void *scratch,
                                     size_t scratch_bytes, int32_t *ids, float *w,
                                     cudaStream_t stream)
{
    if (!x || !planes || !ids || !w || !scratch || m < 1 || h < ROUTE_KC || h % ROUTE_KC ||
        h > ROUTE_MAX_H || n_experts < 1 || n_experts > FP4_ROUTE_MAX_EXPERTS || k < 1 ||
        k > n_experts || scratch_bytes < fp4_moe_route_scratch_bytes(m, n_experts) ||
        ((uintptr_t)planes & 15) || ((uintptr_t)x & 15))
        return cudaErrorInvalidValue;
    float *part = (float *)scratch;
    cudaError_t err;
    int s;
    if (fp4_moe_route_uses_wgmma(m, h)) {
        s = route_split(route_tiles(m, n_experts, FP4_RW_TOKENS, FP4_RW_EXPERTS),
                        ROUTE_WG_TARGET_BLOCKS);
        while (s > h / 64) s /= 2; /* every split at least one K tile */
        err = fp4_route_logits_sm90(x, planes, m, h, n_experts, s, part, stream);
    } else {
        s = route_split(route_tiles(m, n_experts, ROUTE_TM, ROUTE_TE), ROUTE_TARGET_BLOCKS);
        dim3 grid((unsigned)((n_experts + ROUTE_TE - 1) / ROUTE_TE),
                  (unsigned)((m + ROUTE_TM - 1) / ROUTE_TM), (unsigned)s);
        cudaLaunchAttribute at[1];
        cudaLaunchConfig_t cfg = fp4_pdl_config(grid, dim3(ROUTE_THREADS), ROUTE_SMEM, stream, at);
        err = cudaLaunchKernelEx(&cfg, fp4_route_logits_kernel, x, planes, m, h, n_experts, s,
                                 part);
    }
    if (err != cudaSuccess) return err;
    const unsigned tb = (unsigned)((m + ROUTE_TOPK_WARPS - 1) / ROUTE_TOPK_WARPS);
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = fp4_pdl_config(dim3(tb), dim3(ROUTE_TOPK_WARPS * 32), 0, stream, at);
#define ROUTE_TOPK(S)                                                                      \
    err = cudaLaunchKernelEx(&cfg, fp4_route_topk_kernel<S>, (const float *)part, bias, m,  \
                             n_experts, k, scoring, norm_topk, scaling, ids, w)
    switch (s) {
    case 1: ROUTE_TOPK(1); break;
    case 2: ROUTE_TOPK(2); break;
    case 4: ROUTE_TOPK(4); break;
    case 8: ROUTE_TOPK(8); break;
    case 16: ROUTE_TOPK(16); break;
    default: ROUTE_TOPK(32); break;
    }
#undef ROUTE_TOPK
    return err;
}
