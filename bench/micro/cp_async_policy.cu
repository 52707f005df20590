/*
 * cp_async_policy.cu - which 16-byte cp.async copies under an L2 cache policy run on this GPU
 * (bench/NOTES.md forty-first session). The decode's weight copies take an evict-first policy
 * (cp.async.cg.shared.global.L2::cache_hint.L2::128B, d459528) and run; the same hint on
 * sm90-wgmma's weight copies stopped its first launch with "an illegal instruction was
 * encountered". In the SASS (nvdisasm) every faulting copy has the form
 *   LDGSTS... [Ra+URb], desc[URb+1][Rc.64]
 * (the shared address a vector register plus a uniform one, and the policy's descriptor in the
 * next, odd, uniform register), the working ones [Ra+imm], desc[URn] (n even). ptxas takes the
 * [Ra+URb] form where the shared address is a uniform base (a stage's offset, the window base)
 * plus a per-thread part.
 *
 * One kernel per (form, lanes) case, 64 blocks of 256 threads, each thread copying 16 bytes of
 * its row (or 0 bytes: a zero fill) into shared memory under the policy, then writing them out;
 * the host checks every word. Forms: 0 the decode's (cache_hint + L2::128B, src-size operand),
 * 1 cache_hint with src-size (sm90-wgmma's rejected patch), 2 no policy (control),
 * 3 cache_hint with the shared address passed through a shuffle first (cp_hint_shuffled: one
 * vector register, so [Ra], desc[URn]). Lanes: all copy 16 bytes;
 * odd lanes 16, even 0; warp 7 all 0; odd lanes by a branch to a 16-byte hinted copy, even
 * lanes a plain zero fill (form 3: the shuffled copy with odd lanes 16, even 0). Each case runs
 * in its own child process (an illegal instruction ends the CUDA context) and prints PASS,
 * FAIL (wrong bytes) or the CUDA error.
 *
 * H200, nvcc 13.0 (forty-first session, call 2): every case of forms 0 and 1 stopped with "an
 * illegal instruction was encountered", with 16 bytes in every lane too (so not the zero
 * fill), and so did form 2's hinted branch (lanes 3); the copies without a policy and all four
 * shuffled cases passed, every word right (and memcheck clean). In the decode the same copy
 * (form 0) runs because its addresses are a register plus a constant.
 *
 *   cp_async_policy
 * Build: a CMake target of the CUDA build (bench/micro); sm_90a (the decode's copies).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device_util.cuh"

#define BLOCKS 64
#define THREADS 256

static const char *form_name[] = {"cache_hint.L2::128B (decode)", "cache_hint (wgmma patch)", "no policy",
                                  "cache_hint, shuffled address"};
static const char *lanes_name[] = {"all 16 B", "odd 16 B, even 0 B", "warp 7 all 0 B", "odd hinted 16 B, even plain 0 B"};

static __device__ __forceinline__ void cp_hint_sz(uint32_t dst, const void *src, int src_bytes, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(pol)
                 : "memory");
}

static __device__ __forceinline__ void cp_hint_16(uint32_t dst, const void *src, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(pol)
                 : "memory");
}

/* Form 3: the address through a shuffle first (its own lane: the same value), which makes it
 * one vector register for ptxas, [Ra], desc[URn]. The form of sm90-wgmma's rejected patch
 * (bench/rejected/s41-wgmma-evict-first-shuffled.patch). Call with the warp converged. */
static __device__ __forceinline__ void cp_hint_shuffled(uint32_t dst, const void *src, int src_bytes,
                                                        uint64_t pol)
{
    uint32_t lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    dst = __shfl_sync(__activemask(), dst, (int)lane);
    cp_hint_sz(dst, src, src_bytes, pol);
}

static __host__ __device__ int lane_copies(int lanes, int t)
{
    return lanes == 0 ? 1 : lanes == 2 ? t < 224 : (t & 1);
}

template <int FORM>
__global__ void copy_kernel(const int4 *src, int4 *dst, int lanes)
{
    __shared__ int4 s[THREADS];
    const int t = threadIdx.x;
    const uint64_t pol = l2_evict_first();
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(&s[t]);
    const int4 *g = src + blockIdx.x * THREADS + t;
    const int on = lane_copies(lanes, t);
    if (lanes == 3 && FORM != 3) {
        if (on) cp_hint_16(d, g, pol);
        else cp_async16(d, g, 0);
    } else if (FORM == 0) {
        cp_async16_pf_hint(d, g, on ? 16 : 0, pol);
    } else if (FORM == 1) {
        cp_hint_sz(d, g, on ? 16 : 0, pol);
    } else if (FORM == 2) {
        cp_async16(d, g, on ? 16 : 0);
    } else {
        cp_hint_shuffled(d, g, on ? 16 : 0, pol);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    dst[blockIdx.x * THREADS + t] = s[t ^ 1];
}

/* One case; returns 0 on PASS. */
static int run_case(int form, int lanes)
{
    const int n = BLOCKS * THREADS;
    int4 *h = (int4 *)malloc((size_t)n * sizeof *h), *o = (int4 *)malloc((size_t)n * sizeof *o);
    for (int i = 0; i < n; i++) h[i] = make_int4(i, i + 1, i + 2, i + 3);
    int4 *src, *dst;
    cudaError_t e = cudaMalloc(&src, (size_t)n * 16);
    if (!e) e = cudaMalloc(&dst, (size_t)n * 16);
    if (!e) e = cudaMemcpy(src, h, (size_t)n * 16, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        printf("%-30s %-32s setup failed: %s\n", form_name[form], lanes_name[lanes], cudaGetErrorString(e));
        return 1;
    }
    void (*k[])(const int4 *, int4 *, int) = {copy_kernel<0>, copy_kernel<1>, copy_kernel<2>, copy_kernel<3>};
    k[form]<<<BLOCKS, THREADS>>>(src, dst, lanes);
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("%-30s %-32s ERROR %s\n", form_name[form], lanes_name[lanes], cudaGetErrorString(e));
        return 1;
    }
    cudaMemcpy(o, dst, (size_t)n * 16, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int b = 0; b < BLOCKS; b++)
        for (int t = 0; t < THREADS; t++) {
            int st = t ^ 1;
            int4 x = h[b * THREADS + st], y = o[b * THREADS + t];
            if (!lane_copies(lanes, st)) x = make_int4(0, 0, 0, 0);
            bad += x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w;
        }
    printf("%-30s %-32s %s (%d of %d words wrong)\n", form_name[form], lanes_name[lanes], bad ? "FAIL" : "PASS",
           bad, n);
    return bad != 0;
}

int main(void)
{
    int failed = 0;
    for (int form = 0; form < 4; form++)
        for (int lanes = 0; lanes < 4; lanes++) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid < 0) {
                perror("cp_async_policy: fork");
                return 2;
            }
            if (pid == 0) {
                int r = run_case(form, lanes);
                fflush(stdout);
                _exit(r);
            }
            int st = 0;
            waitpid(pid, &st, 0);
            failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
    printf("%d of 16 cases did not pass\n", failed);
    return 0;
}
