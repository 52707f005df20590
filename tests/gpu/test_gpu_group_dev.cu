/*
 * test_gpu_group_dev.cu - device half of test_gpu_group: a kernel that writes the ids and
 * weights late, after letting its programmatic dependents launch, so that a grouping kernel
 * that read them before its griddepcontrol.wait would see the poison left there.
 */
#include <stdint.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "device_util.cuh"

static __global__ void late_copy_kernel(const int32_t *ids_src, const float *w_src, int32_t *ids,
                                        float *w, long long n, long long delay_ns)
{
    fp4_pdl_trigger();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while ((long long)(t - t0) < delay_ns);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        ids[i] = ids_src[i];
        w[i] = w_src[i];
    }
}

/* Copies n ids and weights from src to dst on stream after delay_ns, as the kernel before a
 * programmatic dependent launch. */
extern "C" cudaError_t group_test_late_copy(const int32_t *ids_src, const float *w_src,
                                            int32_t *ids, float *w, long long n,
                                            long long delay_ns, cudaStream_t stream)
{
    late_copy_kernel<<<64, 256, 0, stream>>>(ids_src, w_src, ids, w, n, delay_ns);
    return cudaGetLastError();
}
