/*
 * moe_combine.cu - the last step of the MoE block (DESIGN.md section 4 step 3): per token, the
 * k weighted expert outputs are summed in slot order (no float atomics, so the result is
 * bitwise reproducible) and added to the shared expert's output already in y.
 * 16-byte loads and stores; a grid-stride loop over a grid fixed by M (graph capturable).
 * Launched as a programmatic dependent of the kernel before it (device_util.cuh).
 */
#include "moe_combine.cuh"
#include "device_util.cuh"

#define COMBINE_THREADS 256
#define COMBINE_MAX_BLOCKS 4096

__global__ void __launch_bounds__(COMBINE_THREADS)
fp4_moe_combine_kernel(const float4 *__restrict__ pairs, long long n4, int k, int h4,
                       int accumulate, float4 *__restrict__ y)
{
    fp4_pdl_wait();
    for (long long i = blockIdx.x * (long long)COMBINE_THREADS + threadIdx.x; i < n4;
         i += (long long)gridDim.x * COMBINE_THREADS) {
        long long t = i / h4, c = i - t * h4;
        float4 acc = accumulate ? y[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 *src = pairs + (t * k) * h4 + c;
        for (int s = 0; s < k; s++) {
            float4 v = src[(long long)s * h4];
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        y[i] = acc;
    }
}

extern "C" cudaError_t fp4_moe_combine(const float *pairs, int m, int k, int h, int accumulate,
                                       float *y, cudaStream_t stream)
{
    if (!pairs || !y || m < 1 || k < 1 || h < 4 || h % 4) return cudaErrorInvalidValue;
    long long n4 = (long long)m * (h / 4);
    long long blocks = (n4 + COMBINE_THREADS - 1) / COMBINE_THREADS;
    if (blocks > COMBINE_MAX_BLOCKS) blocks = COMBINE_MAX_BLOCKS;
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = fp4_pdl_config(dim3((unsigned)blocks), dim3(COMBINE_THREADS), 0,
                                            stream, at);
    return cudaLaunchKernelEx(&cfg, fp4_moe_combine_kernel, (const float4 *)pairs, n4, k, h / 4,
                              accumulate, (float4 *)y);
}
