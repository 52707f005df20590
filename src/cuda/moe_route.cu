/*
 * moe_route.cu - the MoE router (DESIGN.md section 4 step 1), matching fp4_ref_route:
 * fp32 logits from bf16 x and the fp32 router [E, H], sigmoid or softmax scoring, top-k by
 * score + correction bias with ties to the lower expert id, weights renormalized over the
 * chosen k (if configured) and times routed_scaling_factor.
 * One block of 256 threads per token; x is staged in shared memory as fp32; each warp owns
 * experts warp, warp+8, ... and reduces its dot products in a fixed order (deterministic).
 * Limits: E <= 256, H <= 16384 and H % 4 == 0. The router matrix is re-read per token
 * (from L2): fine for decode, a known cost for long prefill.
 */
#include "moe_route.cuh"

#define ROUTE_THREADS 256
#define ROUTE_WARPS (ROUTE_THREADS / 32)
#define ROUTE_MAX_H 16384

static __device__ __forceinline__ float bf16_bits_to_float(uint16_t b)
{
    return __uint_as_float(((uint32_t)b) << 16);
}

/* a beats b when its score is larger, or equal with a lower id. */
static __device__ __forceinline__ int route_better(float sa, int ia, float sb, int ib)
{
    return sa > sb || (sa == sb && ia < ib);
}

__global__ void __launch_bounds__(ROUTE_THREADS)
fp4_moe_route_kernel(const uint16_t *__restrict__ x, const float *__restrict__ router,
                     const float *__restrict__ bias, int h, int n_experts, int k, int scoring,
                     int norm_topk, float scaling, int32_t *__restrict__ ids,
                     float *__restrict__ w)
{
    extern __shared__ float sx[];                 /* [h] this token's x in fp32 */
    __shared__ float s_p[FP4_ROUTE_MAX_EXPERTS];   /* scores p */
    __shared__ float s_sel[FP4_ROUTE_MAX_EXPERTS]; /* selection scores p + bias */
    __shared__ int s_taken[FP4_ROUTE_MAX_EXPERTS];
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint16_t *xr = x + (size_t)t * h;

    for (int i = tid; i < h; i += ROUTE_THREADS) sx[i] = bf16_bits_to_float(xr[i]);
    for (int e = tid; e < n_experts; e += ROUTE_THREADS) s_taken[e] = 0;
    __syncthreads();

    for (int e = warp; e < n_experts; e += ROUTE_WARPS) {
        const float4 *rr = (const float4 *)(router + (size_t)e * h);
        const float4 *xx = (const float4 *)sx;
        float acc = 0.f;
        for (int i = lane; i < h / 4; i += 32) {
            float4 r = rr[i], v = xx[i];
            acc = fmaf(r.x, v.x, acc);
            acc = fmaf(r.y, v.y, acc);
            acc = fmaf(r.z, v.z, acc);
            acc = fmaf(r.w, v.w, acc);
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) s_p[e] = acc;
    }
    __syncthreads();
    if (warp != 0) return;

    if (scoring == 0) {
        for (int e = lane; e < n_experts; e += 32) s_p[e] = 1.f / (1.f + expf(-s_p[e]));
    } else {
        float mx = -INFINITY, sum = 0.f;
        for (int e = lane; e < n_experts; e += 32) mx = fmaxf(mx, s_p[e]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        for (int e = lane; e < n_experts; e += 32) {
            float v = expf(s_p[e] - mx);
            s_p[e] = v;
            sum += v;
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        for (int e = lane; e < n_experts; e += 32) s_p[e] /= sum;
    }
    for (int e = lane; e < n_experts; e += 32) s_sel[e] = s_p[e] + (bias ? bias[e] : 0.f);
    __syncwarp();

    float chosen_sum = 0.f;
    for (int s = 0; s < k; s++) {
        float bs = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_experts; e += 32)
            if (!s_taken[e] && route_better(s_sel[e], e, bs, bi)) { bs = s_sel[e]; bi = e; }
        for (int o = 16; o > 0; o >>= 1) {
            float os = __shfl_xor_sync(0xffffffffu, bs, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (route_better(os, oi, bs, bi)) { bs = os; bi = oi; }
        }
        if (bi == 0x7fffffff) bi = 0; /* only when scores are NaN: keep the id in range */
        float p = s_p[bi];
        chosen_sum += p;
        if (lane == 0) {
            s_taken[bi] = 1;
            ids[(size_t)t * k + s] = bi;
            w[(size_t)t * k + s] = p; /* scaled below */
        }
        __syncwarp();
    }
    __syncwarp();
    const float f = norm_topk && chosen_sum > 0.f ? scaling / chosen_sum : scaling;
    for (int s = lane; s < k; s += 32) w[(size_t)t * k + s] *= f;
}

extern "C" cudaError_t fp4_moe_route_init(void)
{
    return cudaFuncSetAttribute(fp4_moe_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                ROUTE_MAX_H * (int)sizeof(float));
}

extern "C" cudaError_t fp4_moe_route(const uint16_t *x, const float *router, const float *bias,
                                     int m, int h, int n_experts, int k, int scoring,
                                     int norm_topk, float scaling, int32_t *ids, float *w,
                                     cudaStream_t stream)
{
    if (!x || !router || !ids || !w || m < 1 || h < 4 || h % 4 || h > ROUTE_MAX_H ||
        n_experts < 1 || n_experts > FP4_ROUTE_MAX_EXPERTS || k < 1 || k > n_experts)
        return cudaErrorInvalidValue;
    fp4_moe_route_kernel<<<m, ROUTE_THREADS, (size_t)h * sizeof(float), stream>>>(
        x, router, bias, h, n_experts, k, scoring, norm_topk, scaling, ids, w);
    return cudaGetLastError();
}
