/*
 * icache_cold.cu - what straight-line code costs the first time it runs after the L2 has been
 * flushed, against the same code warm (bench/NOTES.md thirty-fourth session: the top-k
 * kernel's one-token path spends ~1400-1700 cycles before and around its first round, where
 * its operations would take a few hundred warm; `fp4moe bench` flushes the L2 with a 256 MB
 * memset before every repetition, so each kernel's code comes from DRAM).
 *
 * chain_kernel<N, SALT> is one warp running N dependent integer multiply-adds (inline PTX,
 * volatile: one IMAD each, nothing folded), N x 16 bytes of SASS in one straight line, timed
 * by clock64 and %globaltimer around the chain. Scenarios, each --reps times (medians):
 *   warm     the kernel three times back to back, the third timed (the SM's instruction
 *            caches and the L2 hold its code, if the block lands on the same SM);
 *   l2-cold  a 256 MB memset first (the bench's flush), then the kernel;
 *   all-cold the memset, then evict_kernel (a different chain of 4 N instructions, one block
 *            per SM) so that no SM's instruction cache holds the code either, then the kernel.
 * Prints cycles and ns of the chain, cycles per instruction and per 128-byte code line, and
 * the SM it ran on. If l2-cold and all-cold cost far more per line than warm, the
 * one-token path pays for its code's size on the chain, not for its arithmetic.
 * H200 (thirty-fifth session): 4.03 / 4.08 / 4.09 cycles per instruction warm / l2-cold /
 * all-cold: the instruction prefetch keeps up with straight-line code after the flush.
 *
 *   icache_cold [--reps R]
 * Build: a CMake target of the CUDA build (bench/micro); runs on sm_80 and later.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "icache_cold: %s: %s\n", #x, cudaGetErrorString(e_));           \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define CHAIN_N 2048   /* instructions of the timed chain: 32 KB of code */
#define FLUSH_BYTES (256u << 20)

typedef struct chain_out {
    long long cycles;
    unsigned long long ns;
    unsigned smid;
    unsigned sink; /* the chain's result: kept so that nothing is dead */
} chain_out;

template <int N, unsigned SALT> static __device__ __forceinline__ unsigned chain(unsigned x)
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(x) : "r"(0x9e3779b1u ^ SALT), "r"(i));
    return x;
}

template <int N, unsigned SALT> __global__ void chain_kernel(chain_out *out, unsigned seed)
{
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const long long c0 = clock64();
    const unsigned x = chain<N, SALT>(seed + threadIdx.x);
    const long long c1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        out[blockIdx.x].cycles = c1 - c0;
        out[blockIdx.x].ns = t1 - t0;
        out[blockIdx.x].smid = sm;
        out[blockIdx.x].sink = x;
    }
}

static int cmp_ll(const void *a, const void *b)
{
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int reps = 9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000) {
                fprintf(stderr, "icache_cold: --reps takes 1..1000, got '%s'\n", argv[i]);
                return 2;
            }
            reps = (int)v;
        } else {
            fprintf(stderr, "icache_cold: unknown argument '%s' (usage: icache_cold [--reps R])\n",
                    argv[i]);
            return 2;
        }
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    chain_out *d_out, h_out[1024];
    void *flush;
    CK(cudaMalloc((void **)&d_out, sizeof h_out));
    CK(cudaMalloc(&flush, FLUSH_BYTES));
    static const char *names[3] = {"warm", "l2-cold", "all-cold"};
    printf("chain of %d IMADs (%d bytes of code, %d lines of 128 bytes), %d reps, %d SMs\n",
           CHAIN_N, CHAIN_N * 16, CHAIN_N * 16 / 128, reps, sms);
    for (int sc = 0; sc < 3; sc++) {
        long long cyc[1000], ns[1000];
        unsigned sm_last = 0;
        for (int r = 0; r < reps; r++) {
            if (sc == 0) {
                chain_kernel<CHAIN_N, 0u><<<1, 32>>>(d_out, r);
                chain_kernel<CHAIN_N, 0u><<<1, 32>>>(d_out, r);
            } else {
                CK(cudaMemset(flush, r & 0xff, FLUSH_BYTES));
                if (sc == 2) chain_kernel<4 * CHAIN_N, 0x5bd1e995u><<<sms, 32>>>(d_out + 1, r);
            }
            chain_kernel<CHAIN_N, 0u><<<1, 32>>>(d_out, r);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h_out, d_out, sizeof h_out[0], cudaMemcpyDeviceToHost));
            cyc[r] = h_out[0].cycles;
            ns[r] = (long long)h_out[0].ns;
            sm_last = h_out[0].smid;
        }
        qsort(cyc, reps, sizeof cyc[0], cmp_ll);
        qsort(ns, reps, sizeof ns[0], cmp_ll);
        const long long c = cyc[reps / 2];
        printf("%-8s cycles %7lld (min %7lld max %7lld)  ns %6lld  cycles/instr %.2f  "
               "cycles/line %.1f  last SM %u\n",
               names[sc], c, cyc[0], cyc[reps - 1], ns[reps / 2], (double)c / CHAIN_N,
               (double)c / (CHAIN_N * 16 / 128), sm_last);
    }
    CK(cudaFree(d_out));
    CK(cudaFree(flush));
    return 0;
}
