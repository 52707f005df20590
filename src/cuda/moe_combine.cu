/*
 * moe_combine.cu - the last step of the MoE block (DESIGN.md section 4 step 3): per token, the
 * k weighted expert outputs (bf16, as FC2 wrote them) are summed in fp32 in slot order (no
 * float atomics, so the result is bitwise reproducible) and added to the shared expert's
 * output already in y. A thread sums 8 columns: 16-byte loads of each pair row (up to 8 rows
 * in flight before the first sum), two 16-byte stores of y; a grid-stride loop over a grid
 * fixed by M (graph capturable).
 * Launched as a programmatic dependent of the kernel before it (device_util.cuh).
 */
#include "moe_combine.cuh"
#include "device_util.cuh"

#define COMBINE_THREADS 256
#define COMBINE_MAX_BLOCKS 4096
#define COMBINE_BATCH 8 /* pair rows loaded before the first sum: all of top-8 */

__global__ void __launch_bounds__(COMBINE_THREADS)
fp4_moe_combine_kernel(const uint4 *__restrict__ pairs, long long n8, int k, int h8,
                       int accumulate, float4 *__restrict__ y)
{
    fp4_pdl_wait();
    for (long long i = blockIdx.x * (long long)COMBINE_THREADS + threadIdx.x; i < n8;
         i += (long long)gridDim.x * COMBINE_THREADS) {
        long long t = i / h8, c = i - t * h8;
        float acc[8];
        if (accumulate) {
            const float4 a0 = y[2 * i], a1 = y[2 * i + 1];
            acc[0] = a0.x, acc[1] = a0.y, acc[2] = a0.z, acc[3] = a0.w;
            acc[4] = a1.x, acc[5] = a1.y, acc[6] = a1.z, acc[7] = a1.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] = 0.f;
        }
        const uint4 *src = pairs + (t * k) * h8 + c;
        for (int s0 = 0; s0 < k; s0 += COMBINE_BATCH) { /* a batch of loads in flight, then
                                                            their sums in order */
            uint4 v[COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++)
                if (s0 + u < k) v[u] = src[(long long)(s0 + u) * h8];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                if (s0 + u >= k) break;
                const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                for (int j = 0; j < 4; j++) { /* bf16 -> fp32: the bits in the high half */
                    acc[2 * j] += __uint_as_float(w[j] << 16);
                    acc[2 * j + 1] += __uint_as_float(w[j] & 0xffff0000u);
                }
            }
        }
        y[2 * i] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        y[2 * i + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
}

extern "C" cudaError_t fp4_moe_combine(const uint16_t *pairs, int m, int k, int h,
                                       int accumulate, float *y, cudaStream_t stream)
{
    if (!pairs || !y || m < 1 || k < 1 || h < 8 || h % 8 || ((uintptr_t)pairs & 15) ||
        ((uintptr_t)y & 15))
        return cudaErrorInvalidValue;
    long long n8 = (long long)m * (h / 8);
    long long blocks = (n8 + COMBINE_THREADS - 1) / COMBINE_THREADS;
    if (blocks > COMBINE_MAX_BLOCKS) blocks = COMBINE_MAX_BLOCKS;
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = fp4_pdl_config(dim3((unsigned)blocks), dim3(COMBINE_THREADS), 0,
                                            stream, at);
    return cudaLaunchKernelEx(&cfg, fp4_moe_combine_kernel, (const uint4 *)pairs, n8, k, h / 8,
                              accumulate, (float4 *)y);
}
