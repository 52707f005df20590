/*
 * moe_route.cu - the MoE router (DESIGN.md section 4 step 1), matching fp4_ref_route:
 * fp32 logits from bf16 x and the fp32 router [E, H], sigmoid or softmax scoring, top-k by
 * score + correction bias with ties to the lower expert id, weights renormalized over the
 * chosen k (if configured) and times routed_scaling_factor.
 *
 * Logits are bit-identical to the original one-block-per-token kernel (and so every routing
 * decision is the same): that kernel gave lane l of a warp the float4 columns i = l, l+32,
 * l+64, ... of the dot (a "chain": fmaf over x, y, z, w in that order, i ascending) and
 * summed the 32 chains with a shfl_xor butterfly (16, 8, 4, 2, 1). The butterfly is the
 * complete binary tree over the chains taken in bit-reversed lane order, so here:
 *   - fp4_route_logits_kernel: a block owns 64 tokens x 64 experts and a run of chains
 *     c = q*C .. q*C+C-1 (lane l = bitrev5(c)); per chain it streams float4 columns
 *     32 j + l of 64 router rows and 64 x rows through shared memory (8 columns a stage,
 *     double buffered) and each thread keeps 4 tokens x 4 experts of fmaf chains; a finished
 *     chain joins its subtree through a binary counter whose per-level partial sums live in
 *     shared memory. Columns past a chain's end are zeros: fmaf(0, 0, acc) == acc for every
 *     acc but -0 (which it turns into +0), so a logit can differ at most in the sign of a
 *     zero, which no score, comparison or weight can see.
 *     The S = 32 / C subtrees (split from M so that small M still fills the GPU) go to
 *     scratch [S][M][E].
 *   - fp4_route_topk_kernel: a warp per token sums the S subtrees pairwise in q order (the
 *     rest of the same tree), then scores and top-k exactly as the original kernel.
 * Limits: E <= 256, H <= 16384 and H % 4 == 0; the 64-expert tile wastes work for E < 64.
 */
#include "moe_route.cuh"

#define ROUTE_THREADS 256
#define ROUTE_TM 64             /* tokens per logits block */
#define ROUTE_TE 64             /* experts per logits block */
#define ROUTE_JS 8              /* float4 columns of one chain per shared-memory stage */
#define ROUTE_CHAINS 32         /* lanes of the original kernel's warp */
#define ROUTE_TARGET_BLOCKS 256 /* logits blocks wanted before splitting chains (2 per SM) */
#define ROUTE_MAX_H 16384
#define ROUTE_STAGE_BYTES (2 * ROUTE_JS * (ROUTE_TM + ROUTE_TE) * 16) /* two buffers */
#define ROUTE_SLOT_BYTES (ROUTE_THREADS * 16 * 4)                      /* one tree level */
#define ROUTE_TOPK_WARPS 8

/* Chain split S (power of two, <= 32) for m tokens: the smallest that gives the logits grid
 * ROUTE_TARGET_BLOCKS blocks. Depends on m and E only, so graphs stay valid per m. */
static int route_split(int m, int n_experts)
{
    long long tiles = (long long)((n_experts + ROUTE_TE - 1) / ROUTE_TE) *
                      ((m + ROUTE_TM - 1) / ROUTE_TM);
    int s = 1;
    while (s < ROUTE_CHAINS && tiles * s < ROUTE_TARGET_BLOCKS) s *= 2;
    return s;
}

/* A bound on route_split(m, E) * m rows that never decreases with m (callers size the
 * workspace for their largest m): S * m <= 32 m always, and for S > 1 the split stopped at
 * S * tiles < 2 * TARGET, so S * m <= S * TM * ceil(m / TM) < 2 * TARGET * TM / ceil(E / TE). */
extern "C" size_t fp4_moe_route_scratch_bytes(int m, int n_experts)
{
    if (m < 1 || n_experts < 1) return 0;
    long long cap = 2LL * ROUTE_TARGET_BLOCKS * ROUTE_TM / ((n_experts + ROUTE_TE - 1) / ROUTE_TE);
    long long rows = m > cap ? m : cap;
    if (rows > (long long)ROUTE_CHAINS * m) rows = (long long)ROUTE_CHAINS * m;
    return (size_t)rows * (size_t)n_experts * sizeof(float);
}

static __device__ __forceinline__ float bf16_bits_to_float(uint16_t b)
{
    return __uint_as_float(((uint32_t)b) << 16);
}

/* a beats b when its score is larger, or equal with a lower id. */
static __device__ __forceinline__ int route_better(float sa, int ia, float sb, int ib)
{
    return sa > sb || (sa == sb && ia < ib);
}

/* Stage loads of one thread: float4 column f = 32 j + l of 2 x rows and 2 router rows. */
struct route_stage {
    float4 x[2], r[2];
};

static __device__ __forceinline__ void route_load(route_stage &st, const uint16_t *__restrict__ x,
                                                  const float *__restrict__ router, int m, int h,
                                                  int n_experts, int t0, int e0, int l, int js,
                                                  int tid)
{
    const int n4 = h >> 2;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int i = tid + u * ROUTE_THREADS, jj = i / ROUTE_TM, row = i % ROUTE_TM;
        const int f = 32 * (js + jj) + l;
        const int t = t0 + row, e = e0 + row;
        float4 xv = make_float4(0.f, 0.f, 0.f, 0.f), rv = xv;
        if (f < n4 && t < m) {
            const uint16_t *p = x + (size_t)t * h + 4 * (size_t)f;
            xv = make_float4(bf16_bits_to_float(__ldg(p)), bf16_bits_to_float(__ldg(p + 1)),
                             bf16_bits_to_float(__ldg(p + 2)), bf16_bits_to_float(__ldg(p + 3)));
        }
        if (f < n4 && e < n_experts) rv = __ldg((const float4 *)(router + (size_t)e * h) + f);
        st.x[u] = xv;
        st.r[u] = rv;
    }
}

__global__ void __launch_bounds__(ROUTE_THREADS, 2)
fp4_route_logits_kernel(const uint16_t *__restrict__ x, const float *__restrict__ router, int m,
                        int h, int n_experts, int chains_per_block, float *__restrict__ part)
{
    extern __shared__ float4 route_smem[];
    float4 *xs = route_smem;                             /* [2][JS][TM] */
    float4 *rs = route_smem + 2 * ROUTE_JS * ROUTE_TM;   /* [2][JS][TE] */
    float *slots = (float *)(rs + 2 * ROUTE_JS * ROUTE_TE); /* [levels][16][THREADS] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int e0 = blockIdx.x * ROUTE_TE, t0 = blockIdx.y * ROUTE_TM, q = blockIdx.z;
    const int wt0 = (warp >> 2) * 32, we0 = (warp & 3) * 16; /* warp tile 32 tok x 16 exp */
    const int tg = lane & 7, eg = lane >> 3;                 /* tokens tg+8a, experts eg+4b */
    const int n_chain_cols = ((h >> 2) + 31) / 32;           /* columns of chain 0 (longest) */
    const int n_st = (n_chain_cols + ROUTE_JS - 1) / ROUTE_JS;
    const int n_stages = chains_per_block * n_st;
    const bool active = t0 + wt0 < m && e0 + we0 < n_experts; /* warp-uniform */

    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = 0.f;

    route_stage st;
    int c_base = q * chains_per_block;
    route_load(st, x, router, m, h, n_experts, t0, e0, __brev(c_base) >> 27, 0, tid);
    for (int g = 0; g < n_stages; g++) {
        const int buf = g & 1, ci = g / n_st, sti = g % n_st;
        float4 *xb = xs + buf * ROUTE_JS * ROUTE_TM, *rb = rs + buf * ROUTE_JS * ROUTE_TE;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            xb[tid + u * ROUTE_THREADS] = st.x[u]; /* [jj][row] == i */
            rb[tid + u * ROUTE_THREADS] = st.r[u];
        }
        __syncthreads();
        if (g + 1 < n_stages) {
            const int cn = (g + 1) / n_st, sn = (g + 1) % n_st;
            route_load(st, x, router, m, h, n_experts, t0, e0, __brev(c_base + cn) >> 27,
                       sn * ROUTE_JS, tid);
        }
        if (active) {
#pragma unroll
            for (int jj = 0; jj < ROUTE_JS; jj++) {
                float4 xv[4], rv[4];
#pragma unroll
                for (int a = 0; a < 4; a++) xv[a] = xb[jj * ROUTE_TM + wt0 + tg + 8 * a];
#pragma unroll
                for (int b = 0; b < 4; b++) rv[b] = rb[jj * ROUTE_TE + we0 + eg + 4 * b];
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        float s = acc[a][b]; /* the original order: x, y, z, w */
                        s = fmaf(rv[b].x, xv[a].x, s);
                        s = fmaf(rv[b].y, xv[a].y, s);
                        s = fmaf(rv[b].z, xv[a].z, s);
                        s = fmaf(rv[b].w, xv[a].w, s);
                        acc[a][b] = s;
                    }
            }
        }
        if (sti == n_st - 1) { /* chain ci done: binary-counter merge into its subtree */
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const int v_i = a * 4 + b;
                    float v = acc[a][b];
                    int lvl = 0;
                    for (int cc = ci; cc & 1; cc >>= 1, lvl++)
                        v = slots[(lvl * 16 + v_i) * ROUTE_THREADS + tid] + v;
                    if (ci == chains_per_block - 1) {
                        const int t = t0 + wt0 + tg + 8 * a, e = e0 + we0 + eg + 4 * b;
                        if (t < m && e < n_experts)
                            part[((size_t)q * m + t) * n_experts + e] = v;
                    } else {
                        slots[(lvl * 16 + v_i) * ROUTE_THREADS + tid] = v;
                    }
                    acc[a][b] = 0.f;
                }
        }
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

/* Warp per token: logits from the S partials, scores and top-k exactly as the original
 * one-block kernel (per-lane sums over e = lane, lane+32, ... then the xor butterfly). */
template <int S>
__global__ void __launch_bounds__(ROUTE_TOPK_WARPS * 32)
fp4_route_topk_kernel(const float *__restrict__ part, const float *__restrict__ bias, int m,
                      int n_experts, int k, int scoring, int norm_topk, float scaling,
                      int32_t *__restrict__ ids, float *__restrict__ w)
{
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * ROUTE_TOPK_WARPS + (threadIdx.x >> 5);
    if (t >= m) return;
    constexpr int J = FP4_ROUTE_MAX_EXPERTS / 32;
    const size_t stride = (size_t)m * n_experts;
    float pv[J], sv[J];
    uint32_t taken = 0;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = lane + 32 * j;
        pv[j] = e < n_experts ? route_tree<S>::sum(part + (size_t)t * n_experts + e, stride) : 0.f;
    }
    if (scoring == 0) {
#pragma unroll
        for (int j = 0; j < J; j++) pv[j] = 1.f / (1.f + expf(-pv[j]));
    } else {
        float mx = -INFINITY, sum = 0.f;
#pragma unroll
        for (int j = 0; j < J; j++)
            if (lane + 32 * j < n_experts) mx = fmaxf(mx, pv[j]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
#pragma unroll
        for (int j = 0; j < J; j++)
            if (lane + 32 * j < n_experts) {
                pv[j] = expf(pv[j] - mx);
                sum += pv[j];
            }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int j = 0; j < J; j++) pv[j] /= sum;
    }
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = lane + 32 * j;
        sv[j] = pv[j] + (bias && e < n_experts ? bias[e] : 0.f);
    }
    float chosen_sum = 0.f;
    for (int s = 0; s < k; s++) {
        float bs = -INFINITY, bp = 0.f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int e = lane + 32 * j;
            if (e < n_experts && !((taken >> j) & 1) && route_better(sv[j], e, bs, bi)) {
                bs = sv[j];
                bi = e;
                bp = pv[j];
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float os = __shfl_xor_sync(0xffffffffu, bs, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            const float op = __shfl_xor_sync(0xffffffffu, bp, o);
            if (route_better(os, oi, bs, bi)) {
                bs = os;
                bi = oi;
                bp = op;
            }
        }
        if (bi == 0x7fffffff) { /* only when scores are NaN: the original took id 0 */
            bi = 0;
            bp = __shfl_sync(0xffffffffu, pv[0], 0);
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        chosen_sum += bp;
        if (lane == 0) {
            ids[(size_t)t * k + s] = bi;
            w[(size_t)t * k + s] = bp; /* scaled below */
        }
    }
    __syncwarp();
    const float f = norm_topk && chosen_sum > 0.f ? scaling / chosen_sum : scaling;
    for (int s = lane; s < k; s += 32) w[(size_t)t * k + s] *= f;
}

static int route_levels(int chains_per_block)
{
    int lv = 0;
    while ((1 << lv) < chains_per_block) lv++;
    return lv;
}

extern "C" cudaError_t fp4_moe_route_init(void)
{
    return cudaFuncSetAttribute(fp4_route_logits_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                ROUTE_STAGE_BYTES + 5 * ROUTE_SLOT_BYTES);
}

extern "C" cudaError_t fp4_moe_route(const uint16_t *x, const float *router, const float *bias,
                                     int m, int h, int n_experts, int k, int scoring,
                                     int norm_topk, float scaling, void *scratch,
                                     size_t scratch_bytes, int32_t *ids, float *w,
                                     cudaStream_t stream)
{
    if (!x || !router || !ids || !w || !scratch || m < 1 || h < 4 || h % 4 ||
        h > ROUTE_MAX_H || n_experts < 1 || n_experts > FP4_ROUTE_MAX_EXPERTS || k < 1 ||
        k > n_experts || scratch_bytes < fp4_moe_route_scratch_bytes(m, n_experts) ||
        ((uintptr_t)router & 15))
        return cudaErrorInvalidValue;
    const int s = route_split(m, n_experts), cpb = ROUTE_CHAINS / s;
    float *part = (float *)scratch;
    dim3 grid((unsigned)((n_experts + ROUTE_TE - 1) / ROUTE_TE),
              (unsigned)((m + ROUTE_TM - 1) / ROUTE_TM), (unsigned)s);
    const size_t smem = ROUTE_STAGE_BYTES + (size_t)route_levels(cpb) * ROUTE_SLOT_BYTES;
    fp4_route_logits_kernel<<<grid, ROUTE_THREADS, smem, stream>>>(x, router, m, h, n_experts,
                                                                   cpb, part);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const unsigned tb = (unsigned)((m + ROUTE_TOPK_WARPS - 1) / ROUTE_TOPK_WARPS);
#define ROUTE_TOPK(S)                                                                      \
    fp4_route_topk_kernel<S><<<tb, ROUTE_TOPK_WARPS * 32, 0, stream>>>(                    \
        part, bias, m, n_experts, k, scoring, norm_topk, scaling, ids, w)
    switch (s) {
    case 1: ROUTE_TOPK(1); break;
    case 2: ROUTE_TOPK(2); break;
    case 4: ROUTE_TOPK(4); break;
    case 8: ROUTE_TOPK(8); break;
    case 16: ROUTE_TOPK(16); break;
    default: ROUTE_TOPK(32); break;
    }
#undef ROUTE_TOPK
    return cudaGetLastError();
}
