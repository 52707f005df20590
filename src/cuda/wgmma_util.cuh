/*
 * wgmma_util.cuh - what the Hopper (sm_90a) wgmma kernels share: the build guard, the proxy
 * fence, wgmma fence / commit / wait, the shared-memory matrix descriptor of a 128-byte
 * swizzled K-major operand, and the host check that the current device can run them.
 * Header-only, static inline; each including file keeps its own per-device ready flags.
 */
#ifndef FP4MOE_WGMMA_UTIL_CUH
#define FP4MOE_WGMMA_UTIL_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP4_WG_SM90 1
#endif

#ifdef FP4_WG_SM90

/* Orders this thread's generic-proxy shared-memory writes (cp.async included) before later
 * async-proxy reads (wgmma operands); a barrier after it publishes them to the warpgroups. */
static __device__ __forceinline__ void fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

static __device__ __forceinline__ void wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

static __device__ __forceinline__ void wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void wgmma_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Pins the accumulators at this point of the instruction order: after a wgmma_wait, their
 * reads stay after it (the wait itself names no registers). */
template <int N> static __device__ __forceinline__ void wg_fence_acc(float *acc)
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(acc[i])::"memory");
}

/* Shared-memory matrix descriptor: K-major operand, 128-byte swizzle, rows of 128 bytes,
 * 8-row core-matrix groups 1024 bytes apart (SBO), LBO unused (encoded 1). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr)
{
    return (uint64_t)((saddr >> 4) & 0x3fffu) | ((uint64_t)1 << 16) | ((uint64_t)64 << 32) |
           ((uint64_t)1 << 62);
}

#endif /* FP4_WG_SM90 */

#define WG_MAX_DEVICES 64

/* 1 when wg_kernels_init succeeded for the current device with these flags. */
static inline int wg_device_ready(const int *ready)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= WG_MAX_DEVICES) return 0;
    return ready[dev];
}

/* One-time setup of n sm_90a kernels for the current device: checks that it is compute
 * capability 9.0 and that the kernels carry sm_90a code (cudaErrorInvalidDeviceFunction
 * otherwise), raises their dynamic shared-memory limit to smem bytes, then sets
 * ready[device] (ready NULL: no flag, for kernels set up ahead of others that share one). */
static inline cudaError_t wg_kernels_init(int *ready, const void *const *kern, int n, int smem)
{
    int dev = 0, major = 0, minor = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= WG_MAX_DEVICES) return cudaErrorInvalidDevice;
    if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
        (err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess)
        return err;
    if (major != 9 || minor != 0) return cudaErrorInvalidDeviceFunction;
    for (int i = 0; i < n; i++) {
        cudaFuncAttributes fa;
        if ((err = cudaFuncGetAttributes(&fa, kern[i])) != cudaSuccess) return err;
        if (fa.binaryVersion != 90) return cudaErrorInvalidDeviceFunction; /* no sm_90a SASS */
        err = cudaFuncSetAttribute(kern[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess) return err;
    }
    if (ready) ready[dev] = 1;
    return cudaSuccess;
}

#endif /* FP4MOE_WGMMA_UTIL_CUH */
