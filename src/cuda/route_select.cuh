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

/* a beats b when its score is larger, or equal with a lower id. */
static __device__ __forceinline__ int route_better(float sa, int ia, float sb, int ib)
{
    return sa > sb || (sa == sb && ia < ib);
}

/* The whole warp, one token: pv[j] is the logit of expert lane + 32 j (ignored for e >=
 * n_experts; overwritten with its probability). Writes ids_t[0, k) in selection order (by
 * lane 0) and w_t[0, k); ordered for the whole warp on return. bias may be NULL. */
static __device__ __forceinline__ void route_select_warp(float (&pv)[FP4_ROUTE_LANE_EXPERTS],
                                                         const float *__restrict__ bias,
                                                         int n_experts, int k, int scoring,
                                                         int norm_topk, float scaling,
                                                         int32_t *ids_t, float *w_t)
{
    constexpr int J = FP4_ROUTE_LANE_EXPERTS;
    const int lane = threadIdx.x & 31;
    float sv[J];
    uint32_t taken = 0; /* bit j: expert lane + 32 j chosen */
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
            ids_t[s] = bi;
            w_t[s] = bp; /* scaled below */
        }
    }
    __syncwarp();
    const float f = norm_topk && chosen_sum > 0.f ? scaling / chosen_sum : scaling;
    for (int s = lane; s < k; s += 32) w_t[s] *= f;
    __syncwarp();
}

#endif /* FP4MOE_ROUTE_SELECT_CUH */
