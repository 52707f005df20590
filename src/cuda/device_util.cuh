/*
 * device_util.cuh - device helpers shared by the kernels (sm_80+): async copies, ldmatrix,
 * the BF16 mma.sync, bf16x2 products and the expert activation. Header-only, static inline.
 */
#ifndef FP4MOE_DEVICE_UTIL_CUH
#define FP4MOE_DEVICE_UTIL_CUH

#include <stdint.h>
#include <string.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy global -> shared; src_bytes 0 zero-fills the destination, reading
 * nothing (src must still be a valid address). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* The same with a 128-byte L2 prefetch hint (streams of consecutive 16-byte chunks). The
 * decode ring's weight copies had it alone (H200, against 256 bytes, -0.9 to -3.3% at M =
 * 2-192, 0 at M = 1 top-8, no hint +5 to +9%: bench/NOTES.md seventeenth session); since the
 * fortieth session they take it under an evict-first policy (cp_async16_pf_hint below), and
 * bench/micro/dram_pattern keeps this form. */
static __device__ __forceinline__ void cp_async16_pf(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* An L2 policy that evicts the lines it tags first (createpolicy, sm_80+): for bytes a
 * forward reads once (the decode's weight codes, the router), so that the lines they bring
 * into L2 are the next misses' victims instead of other (possibly dirty) lines. The benchmark
 * starts every forward with L2 full of dirty lines (its flush, as the peer is timed), whose
 * write-backs cost the M=1 layer ~3 us (bench/NOTES.md seventeenth session). In a model's
 * layer the L2 holds the layer before's lines instead: see w4a16_decode.cu for what the
 * policy does there. Then the 128-byte prefetching copy and a read-only 16-byte load under
 * such a policy. */
static __device__ __forceinline__ uint64_t l2_evict_first(void)
{
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}

/* Only where the shared address is a register plus a constant (the decode's ring): where it is
 * a uniform base plus a per-thread part, ptxas (CUDA 13.0) encodes the hinted copy as
 * [Ra+URb], desc[URb+1], which the H200 stops as an illegal instruction
 * (bench/micro/cp_async_policy.cu, bench/NOTES.md forty-first session). */
static __device__ __forceinline__ void cp_async16_pf_hint(uint32_t dst, const void *src,
                                                          int src_bytes, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n"
                 ::"r"(dst), "l"(src), "r"(src_bytes), "l"(pol)
                 : "memory");
}

/* (not volatile: the compiler may place it after a later griddepcontrol.wait, and does in
 * the decode logits kernel) */
static __device__ __forceinline__ float4 ld_nc_f4_hint(const float4 *src, uint64_t pol)
{
    float4 v;
    asm("ld.global.nc.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;\n"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "l"(src), "l"(pol));
    return v;
}

static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* A 4-byte (or, v2, an 8-byte: two words) store to global address row + off (row held as an
 * integer: a generic store otherwise), only where row != 0 and ok != 0: predicated, no
 * branch around it. */
static __device__ __forceinline__ void st_global_b32_row(unsigned long long row, uint32_t off,
                                                         uint32_t v, uint32_t ok)
{
    asm volatile("{\n.reg .pred p, q;\n.reg .u64 a;\nsetp.ne.b32 q, %3, 0;\n"
                 "setp.ne.and.u64 p, %0, 0, q;\ncvt.u64.u32 a, %1;\nadd.u64 a, %0, a;\n"
                 "@p st.global.b32 [a], %2;\n}\n" ::"l"(row), "r"(off), "r"(v), "r"(ok)
                 : "memory");
}

static __device__ __forceinline__ void st_global_v2b32_row(unsigned long long row,
                                                           uint32_t off, uint32_t v0,
                                                           uint32_t v1, uint32_t ok)
{
    asm volatile("{\n.reg .pred p, q;\n.reg .u64 a;\nsetp.ne.b32 q, %4, 0;\n"
                 "setp.ne.and.u64 p, %0, 0, q;\ncvt.u64.u32 a, %1;\nadd.u64 a, %0, a;\n"
                 "@p st.global.v2.b32 [a], {%2, %3};\n}\n"
                 ::"l"(row), "r"(off), "r"(v0), "r"(v1), "r"(ok)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Wait until at most N of this thread's committed groups are still in flight. */
template <int N> static __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8. */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t *r, uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a (16x16 row) * b (16x8 col), BF16 in, fp32 accumulate. */
static __device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0,
                                                uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Float to bf16 bits, and two floats to a bf16x2 (low half: lo); round to nearest even. */
static __device__ __forceinline__ uint16_t bf16_bits(float v)
{
    __nv_bfloat16 b = __float2bfloat16_rn(v);
    return *(uint16_t *)&b;
}

static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* a * b on bf16 pairs (an fma with a -0 addend, which keeps +0 products +0; sm_80+). */
static __device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

/* Pair p (0..3) of a packed code word (src/gpu_pack.h) as a bf16x2 (low half: the pair's
 * first element), each the e2m1 value times 2^-126: the 3 magnitude bits at bf16 bits 6..8
 * (exponent LSBs + mantissa MSB; 0.5 lands on a subnormal) and the sign at bit 15. The
 * packing puts pair p's bits where one rotate or shift and the mask FP4_PAIR_MASK bring
 * them (pair 0 in place, pair 1 by 4, pair 2 rotated by 10), except pair 3, which takes
 * two (by 6, and its top magnitude bit back by 2). p: a constant after unrolling. */
#define FP4_PAIR_MASK 0x81c081c0u
static __device__ __forceinline__ uint32_t e2m1_pair(uint32_t q, int p)
{
    if (p == 0) return q & FP4_PAIR_MASK;
    if (p == 1) return (q << 4) & FP4_PAIR_MASK;
    if (p == 2) return __funnelshift_l(q, q, 10) & FP4_PAIR_MASK;
    return ((q << 6) & 0x80c080c0u) | ((q >> 2) & 0x01000100u);
}

/* Packed NVFP4 block scales (src/gpu_pack.h): one word per row and 64-group, byte j the
 * |scale| of block j in unsigned e5m3 (bias 10). The bf16 of code b times 2^K is
 * (b << 4) + ((117 + K) << 7), exact for every finite e4m3 scale and K <= 119. */
template <int K> static __device__ __forceinline__ uint32_t fp4_scale_bias2(void)
{
    static_assert(K >= -100 && K <= 119, "packed scale exponent offset out of range");
    return (uint32_t)(117 + K) * 0x00800080u;
}

/* All four scales of a packed word: blocks (0, 2) in e and (1, 3) in o, as bf16x2 times 2^K
 * (5 instructions). Block j is then fp4_scale_half(j & 1 ? o : e, j >> 1). */
template <int K>
static __device__ __forceinline__ void fp4_scale_eo(uint32_t v, uint32_t &e, uint32_t &o)
{
    e = (v & 0x00ff00ffu) * 16u + fp4_scale_bias2<K>();
    o = ((v >> 4) & 0x0ff00ff0u) + fp4_scale_bias2<K>();
}

/* Half h of x in both halves, written as PTX moves of the 16-bit halves so that ptxas folds
 * it into the operand of the next bf16x2 multiply (HMUL2 ... R.H0_H0 / R.H1_H1: no
 * instruction of its own; a byte permute is not folded). */
static __device__ __forceinline__ uint32_t fp4_scale_half(uint32_t x, int h)
{
    uint32_t r;
    if (h)
        asm("{\n.reg .b16 l, u;\nmov.b32 {l, u}, %1;\nmov.b32 %0, {u, u};\n}\n" : "=r"(r) : "r"(x));
    else
        asm("{\n.reg .b16 l, u;\nmov.b32 {l, u}, %1;\nmov.b32 %0, {l, l};\n}\n" : "=r"(r) : "r"(x));
    return r;
}

/* Expert activation of a gate / up pair: act 0 silu(g) * u; 1 swigluoai with clamp limit
 * (0: none) and alpha (DESIGN.md section 4). */
static __device__ __forceinline__ float act_fn(int act, float limit, float alpha, float g,
                                               float u)
{
    if (act == 0) return g / (1.f + __expf(-g)) * u;
    if (limit > 0.f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return (u + 1.f) * g / (1.f + __expf(-alpha * g));
}

/* Programmatic dependent launch (sm_90+). A kernel launched with fp4_pdl_config's attribute
 * may start while the kernel before it on the stream is still finishing: it must call
 * fp4_pdl_wait() before it reads anything an earlier kernel of the stream writes, or writes
 * anything one still reads (the wait returns once the previous grid has completed and its
 * writes are visible; without the attribute it returns at once). Constants of the layer (the
 * router, the bias, the weights) may be read before it, and memory no running kernel touches
 * may be written (the decode top-k kernel says why its rows qualify). fp4_pdl_trigger() lets
 * the next such kernel launch while this one runs. */
static __device__ __forceinline__ void fp4_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void fp4_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Launch configuration with programmatic stream serialization where the current device
 * supports it (compute capability 9.0+); at[1] holds the attribute. */
static inline cudaLaunchConfig_t fp4_pdl_config(dim3 grid, dim3 block, size_t smem,
                                                cudaStream_t stream, cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    int dev = 0, major = 0;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = cudaGetDevice(&dev) == cudaSuccess &&
                           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                               cudaSuccess &&
                           major >= 9
                       ? 1
                       : 0;
    return cfg;
}

/* The expert of tile slot s from the experts' first slots tstart[0..E] (tstart[E]: the slots
 * in use): the last expert whose first slot is <= s, or -1 past the last used slot. */
static __device__ __forceinline__ int fp4_slot_expert(int s, int n_experts, const int *tstart)
{
    if (s >= tstart[n_experts]) return -1;
    int lo = 0, hi = n_experts - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tstart[mid] <= s) lo = mid; else hi = mid - 1;
    }
    return lo;
}

#endif /* FP4MOE_DEVICE_UTIL_CUH */
