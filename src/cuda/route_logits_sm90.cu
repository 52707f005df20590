/*
 * route_logits_sm90.cu - the router logits at large M on Hopper's wgmma (sm_90a only): the
 * same product as moe_route.cu's mma.sync kernel (logits = router[E, H] . x[t], the router as
 * three bf16 planes hi + mid + lo whose products with a bf16 x are exact in fp32, accumulated
 * in fp32 on the tensor cores), the same split-K partials [S][M][E] for fp4_route_topk_kernel.
 *
 * Shape: D[experts x tokens] = P[experts x K] * X^T[K x tokens], both operands K-major in
 * shared memory (wgmma descriptors, 128-byte swizzle: 16-byte chunk j of row r stored at
 * chunk j ^ (r & 7)). CTA: 256 threads = 2 warpgroups, 128 experts (64 per warpgroup: the
 * wgmma M) x 256 tokens (the wgmma N); per K step of 16 each warpgroup issues three
 * m64n256k16 (one per plane) into the same accumulators. K tiles of 64 through a 2-stage
 * cp.async ring of 80 KB per stage (256 x rows, 3 x 128 plane rows, 128 bytes each): the
 * copies of tile c + 1 run under the wgmmas of tile c. Against the mma.sync kernel (64 x 64
 * tiles, ldmatrix per fragment) the planes are read once per 256 tokens instead of per 64,
 * and the tensor cores read both operands from shared memory themselves.
 * Limits: h % 64 == 0; x and planes 16-byte aligned. Built for sm_90a; in other targets the
 * body traps and the launcher refuses (init).
 */
#include <stdint.h>

#include "route_logits_sm90.cuh"
#include "device_util.cuh"
#include "wgmma_util.cuh"

#define RW_THREADS 256
#define RW_BK 64                              /* K per tile: one 128-byte row */
#define RW_X_BYTES (FP4_RW_TOKENS * 128)      /* a stage: token rows, */
#define RW_P_BYTES (3 * FP4_RW_EXPERTS * 128) /* then plane rows (hi, mid, lo) */
#define RW_STAGE (RW_X_BYTES + RW_P_BYTES)
#define RW_SMEM (2 * RW_STAGE + 1024)         /* + slack to align the base to 1 KB */
#define RW_COPIES ((FP4_RW_TOKENS + 3 * FP4_RW_EXPERTS) * 8 / RW_THREADS) /* 16-byte, a thread */
#define RW_X_COPIES (FP4_RW_TOKENS * 8 / RW_THREADS)

#ifdef FP4_WG_SM90
/* D[64 x 256] += A[64 x 16] * B[16 x 256], both from shared memory via descriptors. */
static __device__ __forceinline__ void rw_mma(float *d, uint64_t da, uint64_t db)
{
#define RW_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define RW_F16(i) RW_F4(i), RW_F4(i + 4), RW_F4(i + 8), RW_F4(i + 12)
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
                 "}, %128, %129, 1, 1, 1, 0, 0;\n}\n"
                 : RW_F16(0), RW_F16(16), RW_F16(32), RW_F16(48), RW_F16(64), RW_F16(80),
                   RW_F16(96), RW_F16(112)
                 : "l"(da), "l"(db));
#undef RW_F16
#undef RW_F4
}
#endif

__global__ void __launch_bounds__(RW_THREADS, 1)
fp4_route_logits_sm90_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ planes,
                             int m, int h, int n_experts, int split, float *__restrict__ part)
{
#ifdef FP4_WG_SM90
    extern __shared__ __align__(16) uint8_t rw_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int e0 = blockIdx.x * FP4_RW_EXPERTS, t0 = blockIdx.y * FP4_RW_TOKENS, q = blockIdx.z;
    const int nk = h / RW_BK;
    const int c0 = (int)((long long)nk * q / split), c1 = (int)((long long)nk * (q + 1) / split);
    const uint32_t sbase = (smem_u32(rw_smem) + 1023u) & ~1023u;
    fp4_pdl_wait();
    fp4_pdl_trigger();

    /* copy roles: chunk j = tid % 8 of shared rows r = tid / 8 + 32 i (token rows for i < 8,
     * then plane p = (i - 8) / 4, expert row tid / 8 + 32 ((i - 8) % 4)); the swizzle term
     * r & 7 is the same for every i */
    const int j = tid & 7, rb = tid >> 3;
    const uint32_t dst0 = sbase + (uint32_t)(rb * 128 + ((j ^ (rb & 7)) << 4));
    const size_t plane = (size_t)n_experts * h;
    const uint16_t *xs = x + (size_t)(t0 + rb) * h + 8 * j;
    const uint16_t *ps = planes + (size_t)(e0 + rb) * h + 8 * j;
    unsigned ok = 0; /* bit i: row i of this thread's copies exists */
#pragma unroll
    for (int i = 0; i < RW_COPIES; i++) {
        const bool in = i < RW_X_COPIES ? t0 + rb + 32 * i < m
                                        : e0 + rb + 32 * ((i - RW_X_COPIES) & 3) < n_experts;
        ok |= (unsigned)in << i;
    }
    auto issue = [&](int c, uint32_t stage) {
        const size_t kc = (size_t)c * RW_BK;
#pragma unroll
        for (int i = 0; i < RW_COPIES; i++) {
            const uint16_t *src =
                i < RW_X_COPIES ? xs + (size_t)32 * i * h + kc
                                : ps + (size_t)((i - RW_X_COPIES) >> 2) * plane +
                                      (size_t)32 * ((i - RW_X_COPIES) & 3) * h + kc;
            const bool in = (ok >> i) & 1u;
            cp_async16(dst0 + stage + (uint32_t)(i * 32 * 128), in ? src : x, in ? 16 : 0);
        }
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    if (c0 < c1) issue(c0, 0);
    cp_async_commit();
    for (int c = c0; c < c1; c++) {
        const uint32_t st = (uint32_t)((c - c0) & 1) * RW_STAGE;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* tile c landed for all; every warpgroup retired tile c - 1's wgmmas */
        if (c + 1 < c1) issue(c + 1, RW_STAGE - st);
        cp_async_commit();
        const uint64_t db = wg_desc(sbase + st);
        const uint64_t da = wg_desc(sbase + st + RW_X_BYTES + (uint32_t)(64 * wg * 128));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int p = 0; p < 3; p++)
                rw_mma(acc, da + (uint64_t)(p * FP4_RW_EXPERTS * 128 / 16) + 2 * kk, db + 2 * kk);
        wgmma_commit();
        wgmma_wait<0>();
    }
    wg_fence_acc<128>(acc);

    /* acc[4 n + 2 i + c]: expert row 16 (warp % 4) + lane / 4 + 8 i of this warpgroup's 64,
     * token column 8 n + 2 (lane % 4) + c */
    const int er = e0 + 64 * wg + 16 * (warp & 3) + (lane >> 2), tc = t0 + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < 32; n++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int e = er + 8 * i, tok = tc + 8 * n + c;
                if (e < n_experts && tok < m)
                    part[((size_t)q * m + tok) * n_experts + e] = acc[4 * n + 2 * i + c];
            }
#else
    __trap();
#endif
}

static int rw_ready[WG_MAX_DEVICES];

extern "C" cudaError_t fp4_route_logits_sm90_init(void)
{
    const void *kern[1] = {(const void *)fp4_route_logits_sm90_kernel};
    return wg_kernels_init(rw_ready, kern, 1, RW_SMEM);
}

extern "C" int fp4_route_logits_sm90_ready(void) { return wg_device_ready(rw_ready); }

extern "C" cudaError_t fp4_route_logits_sm90(const uint16_t *x, const uint16_t *planes, int m,
                                             int h, int n_experts, int split, float *part,
                                             cudaStream_t stream)
{
    if (!wg_device_ready(rw_ready)) return cudaErrorInvalidDeviceFunction;
    if (!x || !planes || !part || m < 1 || h < RW_BK || h % RW_BK || n_experts < 1 ||
        split < 1 || split > h / RW_BK || ((uintptr_t)x & 15) || ((uintptr_t)planes & 15))
        return cudaErrorInvalidValue;
    const long long ty = (m + FP4_RW_TOKENS - 1) / FP4_RW_TOKENS;
    if (ty > 65535 || split > 65535) return cudaErrorInvalidValue;
    dim3 grid((unsigned)((n_experts + FP4_RW_EXPERTS - 1) / FP4_RW_EXPERTS), (unsigned)ty,
              (unsigned)split);
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = fp4_pdl_config(grid, dim3(RW_THREADS), RW_SMEM, stream, at);
    return cudaLaunchKernelEx(&cfg, fp4_route_logits_sm90_kernel, x, planes, m, h, n_experts,
                              split, part);
}
