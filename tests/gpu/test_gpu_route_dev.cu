/*
 * test_gpu_route_dev.cu - device half of test_gpu_route: the routers' sigmoid
 * (route_sigmoid_lane, route_select.cuh) against 1.f / (1.f + expf(-x)) with the IEEE division,
 * bit for bit, for every one of the 2^32 float bit patterns x (NaN against NaN); and the
 * top-k (route_select_warp) against the routing rule done by one thread, bit for bit.
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "cuda/route_select.cuh"

/* Each thread: J consecutive bit patterns per step, as one lane's J logits. */
__global__ void sigmoid_all_kernel(unsigned long long *bad, unsigned *first_bad)
{
    constexpr int J = FP4_ROUTE_LANE_EXPERTS;
    const uint64_t steps = (1ull << 32) / J;
    for (uint64_t q = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; q < steps;
         q += (uint64_t)gridDim.x * blockDim.x) {
        float pv[J], want[J];
#pragma unroll
        for (int j = 0; j < J; j++) {
            pv[j] = __uint_as_float((uint32_t)(q * J + j));
            want[j] = 1.f / (1.f + expf(-pv[j]));
        }
        route_sigmoid_lane(pv);
#pragma unroll
        for (int j = 0; j < J; j++) {
            const bool same = __float_as_uint(pv[j]) == __float_as_uint(want[j]) ||
                              (pv[j] != pv[j] && want[j] != want[j]);
            if (!same) {
                atomicAdd(bad, 1ull);
                atomicMin(first_bad, (unsigned)(q * J + j));
            }
        }
    }
}

typedef void (*mismatch_launch)(int n, unsigned long long *bad, unsigned *first);

/* Runs launch(n, bad, first) on zeroed counters: returns *bad (mismatches) and sets
 * *first_bad to *first (the lowest mismatching index, or 0xffffffff). -1 on a CUDA error. */
static long long count_mismatches(mismatch_launch launch, int n, unsigned *first_bad)
{
    unsigned long long *d_bad, bad = 0;
    unsigned *d_first;
    if (cudaMalloc((void **)&d_bad, sizeof *d_bad) != cudaSuccess) return -1;
    if (cudaMalloc((void **)&d_first, sizeof *d_first) != cudaSuccess) {
        cudaFree(d_bad);
        return -1;
    }
    *first_bad = 0xffffffffu;
    cudaMemset(d_bad, 0, sizeof *d_bad);
    cudaMemcpy(d_first, first_bad, sizeof *d_first, cudaMemcpyHostToDevice);
    launch(n, d_bad, d_first);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost);
    if (err == cudaSuccess) err = cudaMemcpy(first_bad, d_first, sizeof *first_bad, cudaMemcpyDeviceToHost);
    cudaFree(d_bad);
    cudaFree(d_first);
    return err == cudaSuccess ? (long long)bad : -1;
}

static void launch_sigmoid_all(int n, unsigned long long *bad, unsigned *first)
{
    (void)n;
    sigmoid_all_kernel<<<4096, 256>>>(bad, first);
}

/* Mismatches over all 2^32 inputs; *first_bad the lowest mismatching bit pattern. */
extern "C" long long route_sigmoid_mismatches(unsigned *first_bad)
{
    return count_mismatches(launch_sigmoid_all, 0, first_bad);
}

/* route_select_warp against the rule done the plain way by one thread, from the same
 * probabilities (route_select_warp leaves them in pv): keys = route_key(p + bias), k scans
 * for the largest untaken key (the lower id on a tie; none left: expert 0), the chosen
 * probabilities summed in choice order, w = p * f. One warp per case; case c: E = 100, 128
 * or 256, k = 1 + c % 40 (capped at E), sigmoid or softmax, renormalized or not; logits on a
 * coarse grid (exact ties in number), some NaN logits and biases by case. ids and weights
 * must match bit for bit. */
__global__ void select_cases_kernel(int n_cases, unsigned long long *bad, unsigned *first_bad)
{
    constexpr int J = FP4_ROUTE_LANE_EXPERTS;
    __shared__ float sp[4][256], sb[4][256];
    __shared__ int32_t ids[4][40];
    __shared__ float w[4][40];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int c = blockIdx.x * 4 + wi;
    if (c >= n_cases) return;
    const int E = c % 3 == 0 ? 100 : c % 3 == 1 ? 128 : 256;
    const int k = min(1 + c % 40, E), scoring = (c / 3) % 2, norm = (c / 6) % 2;
    const float scaling = 1.f + 0.5f * (c % 5);
    uint32_t h = 0x9e3779b9u * (uint32_t)(c + 1);
    float pv[J], bv[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = lane + 32 * j;
        uint32_t r = (h ^ (uint32_t)e * 0x85ebca6bu) * 0xc2b2ae35u;
        r ^= r >> 15;
        pv[j] = e < E ? (float)((int)(r % 17) - 8) * 0.25f : 0.f; /* 17 values: many ties */
        bv[j] = e < E ? (float)((int)((r >> 8) % 5) - 2) * 0.125f : 0.f;
        if (c % 7 == 3 && e < E && (r >> 20) % 3 == 0) pv[j] = __int_as_float(0x7fc00000);
        if (c % 11 == 5 && e < E && e > 3) bv[j] = __int_as_float(0x7fc00000); /* 4 numbers */
        sb[wi][e] = bv[j];
    }
    int sel_id;
    float sel_w;
    route_select_warp(pv, bv, E, k, scoring, norm, scaling, ids[wi], w[wi], sel_id, sel_w);
#pragma unroll
    for (int j = 0; j < J; j++) sp[wi][lane + 32 * j] = pv[j];
    __syncwarp();
    if (lane != 0) return;
    uint32_t key[256];
    for (int e = 0; e < E; e++) key[e] = route_key(sp[wi][e] + sb[wi][e]);
    float sum = 0.f, p[40];
    int id[40];
    for (int s = 0; s < k; s++) {
        int b = 0;
        uint32_t bk = 0u;
        for (int e = 0; e < E; e++)
            if (key[e] > bk) bk = key[e], b = e;
        key[b] = 0u;
        id[s] = b, p[s] = sp[wi][b];
        sum += p[s];
    }
    const float f = norm && sum > 0.f ? scaling / sum : scaling;
    for (int s = 0; s < k; s++) {
        const float want = p[s] * f;
        if (ids[wi][s] != id[s] || __float_as_uint(w[wi][s]) != __float_as_uint(want)) {
            atomicAdd(bad, 1ull);
            atomicMin(first_bad, (unsigned)c);
            return;
        }
    }
}

static void launch_select_cases(int n_cases, unsigned long long *bad, unsigned *first)
{
    select_cases_kernel<<<(n_cases + 3) / 4, 128>>>(n_cases, bad, first);
}

/* Cases of select_cases_kernel that differ from the plain rule; *first_bad the lowest. */
extern "C" long long route_select_mismatches(int n_cases, unsigned *first_bad)
{
    return count_mismatches(launch_select_cases, n_cases, first_bad);
}
