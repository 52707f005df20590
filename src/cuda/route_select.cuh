/*
 * route_select.cuh - the routing rule of the GPU routers (DESIGN.md section 4 step 1, as
 * fp4_ref_route), one warp per token: scores from logits (sigmoid or softmax), top-k by
 * score + correction bias with ties to the lower expert id, weights renormalized over the
 * chosen k (if configured) and times the routed scaling factor. Used by moe_route.cu and by
 * the decode router (w4a16_decode.cu). Header-only device code.
 */
#ifndef FP4MOE_ROUTE_SELECT_CUH
#define FP4MOE_ROUTE_SELECT_CUH

#include <math.h>
#include <stdint.h>

#define FP4_ROUTE_LANE_EXPERTS 8 /* experts per lane: lane + 32 j, so E <= 256 */

/* The correction bias of the lane's experts (0 past n_experts or without a bias). A weight:
 * the kernels load it before their wait for the logits. */
static __device__ __forceinline__ void route_bias_lane(float (&bv)[FP4_ROUTE_LANE_EXPERTS],
                                                       const float *__restrict__ bias,
                                                       int n_experts)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < FP4_ROUTE_LANE_EXPERTS; j++) {
        const int e = lane + 32 * j;
        bv[j] = bias && e < n_experts ? __ldg(bias + e) : 0.f;
    }
}

/* A score as an unsigned key in the routing order: larger score, larger key (ties are then
 * broken by id); -0 as +0; 0 for NaN (never chosen while a number is left). */
static __device__ __forceinline__ uint32_t route_key(float s)
{
    uint32_t u = __float_as_uint(s);
    if (s != s) return 0u;
    if (u == 0x80000000u) u = 0u;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* pv[j] = 1.f / (1.f + expf(-pv[j])) for the lane's J logits, bit for bit (test_gpu_route
 * compares every float). The IEEE division has a slow-path call per element, after which the
 * J run one after another; here each 1 / d is the division's fast path with a = 1 (approximate
 * reciprocal, then two FMA corrections: correctly rounded while 1 / d is normal, d < 2^126;
 * d >= 1 always), so the J interleave, and a lane with some d >= 2^125 (a margin; x < -86.6)
 * or NaN redoes all J by division. */
static __device__ __forceinline__ void route_sigmoid_lane(float (&pv)[FP4_ROUTE_LANE_EXPERTS])
{
    constexpr int J = FP4_ROUTE_LANE_EXPERTS;
    float d[J];
    bool slow = false;
#pragma unroll
    for (int j = 0; j < J; j++) {
        d[j] = 1.f + expf(-pv[j]);
        slow |= !(d[j] < 0x1p125f);
        float r;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d[j]));
        r = fmaf(r, fmaf(-d[j], r, 1.f), r);
        pv[j] = fmaf(r, fmaf(-d[j], r, 1.f), r);
    }
    if (slow)
#pragma unroll
        for (int j = 0; j < J; j++) pv[j] = 1.f / d[j];
}

/* The whole warp, one token: pv[j] is the logit of expert lane + 32 j (ignored for e >=
 * n_experts; overwritten with its probability), bv[j] its bias (route_bias_lane). Top-k by
 * score + bias, ties to the lower id, NaN scores last (all NaN: expert 0, as the original).
 * Each round: the lane's best untaken expert as a key, the warp's largest key and then its
 * lowest id among the lanes that hold it (two redux.sync, no shuffle tree). Writes ids_t[0, k)
 * in selection order and w_t[0, k); lane s < 32 also returns choice s in sel_id / sel_w.
 * Ordered for the whole warp on return. Returns the rounds that found no number left and took
 * expert 0 (then ids may repeat), the same on every lane. */
static __device__ __forceinline__ int route_select_warp(float (&pv)[FP4_ROUTE_LANE_EXPERTS],
                                                         const float (&bv)[FP4_ROUTE_LANE_EXPERTS],
                                                         int n_experts, int k, int scoring,
                                                         int norm_topk, float scaling,
                                                         int32_t *ids_t, float *w_t,
                                                         int &sel_id, float &sel_w)
{
    constexpr int J = FP4_ROUTE_LANE_EXPERTS;
    const int lane = threadIdx.x & 31;
    uint32_t key[J];
    if (scoring == 0) {
        route_sigmoid_lane(pv);
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
    for (int j = 0; j < J; j++) /* 0: no expert, or taken (NaN scores rank with them) */
        key[j] = lane + 32 * j < n_experts ? route_key(pv[j] + bv[j]) : 0u;
    float chosen_sum = 0.f;
    int fallbacks = 0;
    sel_id = 0, sel_w = 0.f;
    for (int s = 0; s < k; s++) {
        /* the lane's largest key by a tree (depth 3, not a chain of J): strictly larger
         * replaces, so the lower j (id) keeps a tie */
        uint32_t tk[J];
        float tp[J];
        int tj[J];
#pragma unroll
        for (int j = 0; j < J; j++) tk[j] = key[j], tp[j] = pv[j], tj[j] = j;
#pragma unroll
        for (int h = 1; h < J; h <<= 1)
#pragma unroll
            for (int j = 0; j < J; j += 2 * h)
                if (tk[j + h] > tk[j]) tk[j] = tk[j + h], tp[j] = tp[j + h], tj[j] = tj[j + h];
        const uint32_t lk = tk[0];
        const float lp = tp[0];
        const int li = lane + 32 * tj[0]; /* used only where lk is the warp's best, > 0 */
        const uint32_t best = __reduce_max_sync(0xffffffffu, lk);
        /* only NaN scores (or taken) left: expert 0 with its probability, as the original */
        const int bi = best ? (int)__reduce_min_sync(0xffffffffu, lk == best ? (uint32_t)li
                                                                             : 0x7fffffffu)
                            : 0;
        const float bp = __shfl_sync(0xffffffffu, best ? lp : pv[0], bi & 31);
        fallbacks += !best;
#pragma unroll
        for (int j = 0; j < J; j++) /* taken (a select per key: no local memory) */
            key[j] = lane + 32 * j == bi ? 0u : key[j];
        chosen_sum += bp;
        if (s == lane) sel_id = bi, sel_w = bp;
        if (s >= 32 && lane == 0) ids_t[s] = bi, w_t[s] = bp; /* scaled below */
    }
    const float f = norm_topk && chosen_sum > 0.f ? scaling / chosen_sum : scaling;
    sel_w *= f;
    if (lane < k) ids_t[lane] = sel_id, w_t[lane] = sel_w;
    __syncwarp();
    for (int s = 32 + lane; s < k; s += 32) w_t[s] *= f;
    __syncwarp();
    return fallbacks;
}

#endif /* FP4MOE_ROUTE_SELECT_CUH */
