/*
 * test_gpu_route_dev.cu - device half of test_gpu_route: the routers' sigmoid
 * (route_sigmoid_lane, route_select.cuh) against 1.f / (1.f + expf(-x)) with the IEEE division,
 * bit for bit, for every one of the 2^32 float bit patterns x (NaN against NaN).
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

/* Mismatches over all 2^32 inputs; *first_bad the lowest mismatching bit pattern (or
 * 0xffffffff). -1 on a CUDA error. */
extern "C" long long route_sigmoid_mismatches(unsigned *first_bad)
{
    unsigned long long *d_bad;
    unsigned *d_first;
    if (cudaMalloc((void **)&d_bad, sizeof *d_bad) != cudaSuccess) return -1;
    if (cudaMalloc((void **)&d_first, sizeof *d_first) != cudaSuccess) {
        cudaFree(d_bad);
        return -1;
    }
    unsigned long long bad = 0;
    *first_bad = 0xffffffffu;
    cudaMemset(d_bad, 0, sizeof *d_bad);
    cudaMemcpy(d_first, first_bad, sizeof *d_first, cudaMemcpyHostToDevice);
    sigmoid_all_kernel<<<4096, 256>>>(d_bad, d_first);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost);
    if (err == cudaSuccess) err = cudaMemcpy(first_bad, d_first, sizeof *first_bad, cudaMemcpyDeviceToHost);
    cudaFree(d_bad);
    cudaFree(d_first);
    return err == cudaSuccess ? (long long)bad : -1;
}
