/*
 * moe_group.cu - groups the M*k (token, slot) pairs of the router by expert for the grouped
 * GEMMs: counts, prefix sum of per-expert segments padded to the GEMM's M-tile, tile table,
 * scatter of token / pair / weight into the padded row space.
 * Two launches up to GROUP_PLACE_MAX_BLOCKS blocks, else three; grids fixed by m*k (graph
 * capturable, no host sync), integer shared-memory atomics only for counts, so every table is
 * the same on every run and on either path:
 *   count:   block b counts its chunk of GROUP_PB pairs per expert -> counts[b][E];
 *   place:   block b sums counts over the chunks (each expert's total, and the pairs of the
 *            chunks before b), scans the padded segments over the experts, writes its share
 *            of the tile table and of the padding rows, then ranks its pairs per expert in
 *            pair order and writes their rows. Against the prefix + scatter below: -0.7 to
 *            -1.7% of the layer at 128-2048 tokens top-8 (H200, 2026-11-30); but each block
 *            reads all nb x E counts, a cost that grows as nb^2, hence the bound;
 *   above it, prefix: one block scans counts over b per expert (in place: counts[b][e]
 *            becomes the first row of chunk b's pairs of expert e), the padded segments over
 *            e (a multiple of align slots each), writes the tile table and the padding rows;
 *   and scatter: block b ranks its pairs per expert in pair order (per-warp counts, a prefix
 *            over the 8 warps, then __match_any_sync per 32 pairs) and writes its rows.
 * The unit counters (unit_done, sm90-wgmma's FC1 -> FC2 hand-off) are zeroed with the tables.
 * Inside an expert's segment rows are in ascending pair index p = t*k + slot.
 * Every kernel is a programmatic dependent launch (device_util.cuh): it waits for the kernel
 * before it, then lets the next one launch.
 * Limits: E <= 256 (FP4_GROUP_MAX_EXPERTS); ids outside [0, E) are skipped.
 */
#include "moe_group.cuh"
#include "device_util.cuh"

#define GROUP_THREADS 256
#define GROUP_WARPS (GROUP_THREADS / 32)
#define GROUP_PT 2 /* pairs per thread of the count / place / scatter blocks: 512 pairs a
                      block, so that small M has several blocks and each warp's ranking chain
                      is short. H200, layer, against 8 (2026-11-30): -1.3 to -2.8% at 64-512
                      tokens top-8 and top-4 M=512, within +-0.5% from 1024 tokens on */
#define GROUP_PB (GROUP_THREADS * GROUP_PT) /* pairs per count / place / scatter block */
#define GROUP_PLACE_MAX_BLOCKS 256 /* place up to this many blocks (131072 pairs: M = 16384 at
                                      top-8): each of its blocks reads all nb x E counts, so
                                      above it the one-block prefix + scatter (linear) */
#define GROUP_PREFIX_THREADS 1024
#define GROUP_PREFIX_PARTS (GROUP_PREFIX_THREADS / FP4_GROUP_MAX_EXPERTS)

static long long group_blocks(long long n_pairs) { return (n_pairs + GROUP_PB - 1) / GROUP_PB; }

extern "C" size_t fp4_moe_group_scratch_bytes(int m, int k, int n_experts)
{
    if (m < 1 || k < 1 || n_experts < 1) return 0;
    return (size_t)group_blocks((long long)m * k) * (size_t)n_experts * sizeof(int32_t);
}

/* This lane's pairs p0 + 32 i + lane of a count / place / scatter block: ids (-1 outside
 * [0, E) or past the end) and weights, all loaded before the first use (one latency). */
static __device__ __forceinline__ void group_load_pairs(const int32_t *__restrict__ ids,
                                                        const float *__restrict__ w,
                                                        long long n_pairs, int n_experts,
                                                        long long p0, int lane, int (&ev)[GROUP_PT],
                                                        float (&wv)[GROUP_PT])
{
#pragma unroll
    for (int i = 0; i < GROUP_PT; i++) {
        const long long p = p0 + 32 * i + lane;
        const int e = p < n_pairs ? ids[p] : -1;
        ev[i] = e >= 0 && e < n_experts ? e : -1;
        wv[i] = p < n_pairs ? w[p] : 0.f;
    }
}

/* Exclusive scan of the padded segments over the experts, by one warp (lane owns 8
 * consecutive ids): tstart[e] = first slot of expert e (ceil(count / (align tile_m)) * align
 * slots each, count(e) its pairs), tstart[E] = the slots in use. */
template <class Count>
static __device__ __forceinline__ void group_scan_slots(int lane, int n_experts, int tile_m,
                                                        int align, Count count, int *tstart)
{
    const int per = FP4_GROUP_MAX_EXPERTS / 32;
    int nt[FP4_GROUP_MAX_EXPERTS / 32], run = 0;
#pragma unroll
    for (int i = 0; i < per; i++) {
        const int ee = lane * per + i;
        const int c = ee < n_experts ? count(ee) : 0;
        nt[i] = (c + align * tile_m - 1) / (align * tile_m) * align;
        run += nt[i];
    }
    int incl = run;
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    int start = incl - run;
#pragma unroll
    for (int i = 0; i < per; i++) {
        const int ee = lane * per + i;
        if (ee < n_experts) tstart[ee] = start;
        start += nt[i];
    }
    if (lane == 31) tstart[n_experts] = incl;
}

/* The tile table and the padding rows, entries t0, t0 + stride, ...: the slots, each
 * segment's tail (< align * tile_m rows past its tot[e] pairs), every row past the last used
 * slot; and the unit counters (unit_done, if any) zeroed. */
static __device__ __forceinline__ void group_tables(int t0, int stride, int n_experts, int tile_m,
                                                    int align, int n_slots, const int *tot,
                                                    const int *tstart, int32_t *tile_expert,
                                                    int32_t *row_src, int32_t *row_dst,
                                                    float *row_w, int32_t *unit_done)
{
    const int used = tstart[n_experts];
    for (int s = t0; s < n_slots; s += stride)
        tile_expert[s] = fp4_slot_expert(s, n_experts, tstart);
    if (unit_done)
        for (int u = t0; u < fp4_moe_group_units(n_slots); u += stride)
            unit_done[(size_t)u * FP4_GROUP_DONE_STRIDE] = 0;
    const int seg_pad = align * tile_m;
    for (int i = t0; i < n_experts * seg_pad; i += stride) {
        const int ex = i / seg_pad, o = tot[ex] + i % seg_pad;
        if (o < (tstart[ex + 1] - tstart[ex]) * tile_m) {
            const long long row = (long long)tstart[ex] * tile_m + o;
            row_src[row] = -1;
            row_dst[row] = -1;
            row_w[row] = 0.f;
        }
    }
    for (long long row = (long long)used * tile_m + t0; row < (long long)n_slots * tile_m;
         row += stride) {
        row_src[row] = -1;
        row_dst[row] = -1;
        row_w[row] = 0.f;
    }
}

/* Expert e's row bases per warp: wcnt[w][e] holds warp w's count of expert e and becomes the
 * row of its first such pair, from base (the block's first row of expert e). */
static __device__ __forceinline__ void group_warp_bases(int e, int base,
                                                        int (*wcnt)[FP4_GROUP_MAX_EXPERTS])
{
    for (int wi = 0; wi < GROUP_WARPS; wi++) {
        const int c = wcnt[wi][e];
        wcnt[wi][e] = base;
        base += c;
    }
}

/* Each warp ranks its pairs per expert in pair order (__match_any_sync per 32 pairs; lanes of
 * one expert in lane order, rounds in order) and writes their rows from wcnt[warp][e]. */
static __device__ __forceinline__ void group_rank_write(int lane, int warp, long long p0, int k,
                                                        const int (&ev)[GROUP_PT],
                                                        const float (&wv)[GROUP_PT],
                                                        int (*wcnt)[FP4_GROUP_MAX_EXPERTS],
                                                        int32_t *row_src, int32_t *row_dst,
                                                        float *row_w)
{
    const unsigned lt = (1u << lane) - 1u;
#pragma unroll
    for (int i = 0; i < GROUP_PT; i++) {
        const long long p = p0 + 32 * i + lane;
        const int e = ev[i];
        const bool ok = e >= 0;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        if (ok) {
            const int pos = wcnt[warp][e] + __popc(same & lt);
            row_src[pos] = (int32_t)(p / k);
            row_dst[pos] = (int32_t)p;
            row_w[pos] = wv[i];
        }
        __syncwarp();
        if (ok && (same & lt) == 0) wcnt[warp][e] += __popc(same);
        __syncwarp();
    }
}

__global__ void __launch_bounds__(GROUP_THREADS)
fp4_group_count_kernel(const int32_t *__restrict__ ids, long long n_pairs, int n_experts,
                       int32_t *__restrict__ counts)
{
    __shared__ int cnt[FP4_GROUP_MAX_EXPERTS];
    const int tid = threadIdx.x;
    const long long p0 = (long long)blockIdx.x * GROUP_PB;
    fp4_pdl_wait();
    fp4_pdl_trigger();
    int ev[GROUP_PT]; /* all loads in flight before the first atomic */
#pragma unroll
    for (int i = 0; i < GROUP_PT; i++) {
        const long long p = p0 + tid + (long long)GROUP_THREADS * i;
        ev[i] = p < n_pairs ? ids[p] : -1;
    }
    for (int e = tid; e < n_experts; e += GROUP_THREADS) cnt[e] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < GROUP_PT; i++)
        if (ev[i] >= 0 && ev[i] < n_experts) atomicAdd(&cnt[ev[i]], 1);
    __syncthreads();
    for (int e = tid; e < n_experts; e += GROUP_THREADS)
        counts[(size_t)blockIdx.x * n_experts + e] = cnt[e];
}

/* Block b reads every chunk's counts (two halves of its threads over the chunks, from L2), so
 * it knows each expert's total (the scan of slots) and the pairs of the chunks before its own;
 * the tile table and the padding rows are spread over the blocks. Then its warps rank their
 * pairs per expert in pair order (per-warp counts, a prefix over the 8 warps, then
 * __match_any_sync per 32 pairs) and write their rows. */
__global__ void __launch_bounds__(GROUP_THREADS)
fp4_group_place_kernel(const int32_t *__restrict__ ids, const float *__restrict__ w,
                       long long n_pairs, int k, int n_experts, int tile_m, int align,
                       int n_slots, const int32_t *__restrict__ counts, int n_blocks,
                       int32_t *__restrict__ tile_expert, int32_t *__restrict__ row_src,
                       int32_t *__restrict__ row_dst, float *__restrict__ row_w,
                       int32_t *__restrict__ unit_done)
{
    __shared__ int wcnt[GROUP_WARPS][FP4_GROUP_MAX_EXPERTS]; /* counts, then next row */
    __shared__ int tpart[2][FP4_GROUP_MAX_EXPERTS], bpart[2][FP4_GROUP_MAX_EXPERTS];
    __shared__ int tot[FP4_GROUP_MAX_EXPERTS];
    __shared__ int tstart[FP4_GROUP_MAX_EXPERTS + 1];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int b = (int)blockIdx.x;
    const long long p0 = (long long)b * GROUP_PB + (long long)warp * (GROUP_PB / GROUP_WARPS);
    fp4_pdl_wait();
    fp4_pdl_trigger();
    int ev[GROUP_PT]; /* loaded before the counts are summed (their latency under that work) */
    float wv[GROUP_PT];
    group_load_pairs(ids, w, n_pairs, n_experts, p0, lane, ev, wv);
    { /* half r of the threads sums chunks [r nb / 2, (r + 1) nb / 2) */
        const int r = tid >> 7, c0 = r * n_blocks / 2, c1 = (r + 1) * n_blocks / 2;
        for (int e = tid & 127; e < n_experts; e += 128) {
            int t = 0, before = 0;
#pragma unroll 8
            for (int c = c0; c < c1; c++) {
                const int v = counts[(size_t)c * n_experts + e];
                t += v;
                before += c < b ? v : 0;
            }
            tpart[r][e] = t;
            bpart[r][e] = before;
        }
    }
    for (int i = tid; i < GROUP_WARPS * FP4_GROUP_MAX_EXPERTS; i += GROUP_THREADS)
        (&wcnt[0][0])[i] = 0;
    __syncthreads();
    for (int e = tid; e < n_experts; e += GROUP_THREADS) tot[e] = tpart[0][e] + tpart[1][e];
#pragma unroll
    for (int i = 0; i < GROUP_PT; i++)
        if (ev[i] >= 0) atomicAdd(&wcnt[warp][ev[i]], 1);
    __syncthreads();
    if (tid < 32)
        group_scan_slots(lane, n_experts, tile_m, align, [&](int e) { return tot[e]; }, tstart);
    __syncthreads();
    for (int e = tid; e < n_experts; e += GROUP_THREADS)
        group_warp_bases(e, tstart[e] * tile_m + bpart[0][e] + bpart[1][e], wcnt);
    /* this block's share of the tables */
    group_tables(b * GROUP_THREADS + tid, n_blocks * GROUP_THREADS, n_experts, tile_m, align,
                 n_slots, tot, tstart, tile_expert, row_src, row_dst, row_w, unit_done);
    __syncthreads();
    group_rank_write(lane, warp, p0, k, ev, wv, wcnt, row_src, row_dst, row_w);
}

/* One block. Thread (e = tid % 256, r = tid / 256) scans the chunk range of part r. */
__global__ void __launch_bounds__(GROUP_PREFIX_THREADS)
fp4_group_prefix_kernel(int32_t *__restrict__ counts, int n_blocks, int n_experts, int tile_m,
                        int align, int n_slots, int32_t *__restrict__ tile_expert,
                        int32_t *__restrict__ row_src, int32_t *__restrict__ row_dst,
                        float *__restrict__ row_w, int32_t *__restrict__ unit_done)
{
    __shared__ int part[GROUP_PREFIX_PARTS][FP4_GROUP_MAX_EXPERTS];
    __shared__ int tot[FP4_GROUP_MAX_EXPERTS];
    __shared__ int tstart[FP4_GROUP_MAX_EXPERTS + 1];
    const int tid = threadIdx.x, e = tid % FP4_GROUP_MAX_EXPERTS, r = tid / FP4_GROUP_MAX_EXPERTS;
    const int b0 = (int)((long long)n_blocks * r / GROUP_PREFIX_PARTS);
    const int b1 = (int)((long long)n_blocks * (r + 1) / GROUP_PREFIX_PARTS);
    fp4_pdl_wait();
    fp4_pdl_trigger();

    if (e < n_experts) {
        int s = 0;
        for (int b = b0; b < b1; b++) s += counts[(size_t)b * n_experts + e];
        part[r][e] = s;
    }
    __syncthreads();
    if (tid < 32) /* the totals too, for the padding */
        group_scan_slots(tid, n_experts, tile_m, align, [&](int ee) {
            int c = 0;
            for (int rr = 0; rr < GROUP_PREFIX_PARTS; rr++) c += part[rr][ee];
            tot[ee] = c;
            return c;
        }, tstart);
    __syncthreads();
    if (e < n_experts) { /* counts -> first row of each chunk's pairs of expert e */
        int base = tstart[e] * tile_m;
        for (int rr = 0; rr < r; rr++) base += part[rr][e];
        for (int b = b0; b < b1; b++) {
            const size_t i = (size_t)b * n_experts + e;
            const int c = counts[i];
            counts[i] = base;
            base += c;
        }
    }
    group_tables(tid, GROUP_PREFIX_THREADS, n_experts, tile_m, align, n_slots, tot, tstart,
                 tile_expert, row_src, row_dst, row_w, unit_done);
}

__global__ void __launch_bounds__(GROUP_THREADS)
fp4_group_scatter_kernel(const int32_t *__restrict__ ids, const float *__restrict__ w,
                         long long n_pairs, int k, int n_experts,
                         const int32_t *__restrict__ offsets, int32_t *__restrict__ row_src,
                         int32_t *__restrict__ row_dst, float *__restrict__ row_w)
{
    __shared__ int wcnt[GROUP_WARPS][FP4_GROUP_MAX_EXPERTS]; /* counts, then next row */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long p0 =
        (long long)blockIdx.x * GROUP_PB + (long long)warp * (GROUP_PB / GROUP_WARPS);
    fp4_pdl_wait();
    fp4_pdl_trigger();
    int ev[GROUP_PT];
    float wv[GROUP_PT];
    group_load_pairs(ids, w, n_pairs, n_experts, p0, lane, ev, wv);
    for (int i = tid; i < GROUP_WARPS * FP4_GROUP_MAX_EXPERTS; i += GROUP_THREADS)
        (&wcnt[0][0])[i] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < GROUP_PT; i++)
        if (ev[i] >= 0) atomicAdd(&wcnt[warp][ev[i]], 1);
    __syncthreads();
    for (int e = tid; e < n_experts; e += GROUP_THREADS)
        group_warp_bases(e, offsets[(size_t)blockIdx.x * n_experts + e], wcnt);
    __syncthreads();
    group_rank_write(lane, warp, p0, k, ev, wv, wcnt, row_src, row_dst, row_w);
}

extern "C" cudaError_t fp4_moe_group(const int32_t *ids, const float *w, int m, int k,
                                     int n_experts, int tile_m, int align, int n_slots, void *scratch,
                                     size_t scratch_bytes, int32_t *tile_expert,
                                     int32_t *row_src, int32_t *row_dst, float *row_w,
                                     int32_t *unit_done, cudaStream_t stream)
{
    if (!ids || !w || !scratch || !tile_expert || !row_src || !row_dst || !row_w || m < 1 ||
        k < 1 || n_experts < 1 || n_experts > FP4_GROUP_MAX_EXPERTS || tile_m < 1 ||
        (align != 1 && align != 2) || (long long)m * k > 0x7fffffffLL ||
        n_slots != fp4_moe_group_slots(m, k, n_experts, tile_m, align) ||
        (long long)n_slots * tile_m > 0x7fffffffLL ||
        scratch_bytes < fp4_moe_group_scratch_bytes(m, k, n_experts))
        return cudaErrorInvalidValue;
    const long long n_pairs = (long long)m * k;
    const int nb = (int)group_blocks(n_pairs);
    int32_t *counts = (int32_t *)scratch;
    cudaLaunchAttribute at[1], at1[1];
    /* count, place and scatter: nb blocks of GROUP_THREADS; prefix: one block */
    const cudaLaunchConfig_t blk =
        fp4_pdl_config(dim3((unsigned)nb), dim3(GROUP_THREADS), 0, stream, at);
    cudaError_t err = cudaLaunchKernelEx(&blk, fp4_group_count_kernel, ids, n_pairs, n_experts,
                                         counts);
    if (err != cudaSuccess) return err;
    if (nb <= GROUP_PLACE_MAX_BLOCKS)
        return cudaLaunchKernelEx(&blk, fp4_group_place_kernel, ids, w, n_pairs, k, n_experts,
                                  tile_m, align, n_slots, (const int32_t *)counts, nb,
                                  tile_expert, row_src, row_dst, row_w, unit_done);
    const cudaLaunchConfig_t one =
        fp4_pdl_config(dim3(1), dim3(GROUP_PREFIX_THREADS), 0, stream, at1);
    err = cudaLaunchKernelEx(&one, fp4_group_prefix_kernel, counts, nb, n_experts, tile_m, align,
                             n_slots, tile_expert, row_src, row_dst, row_w, unit_done);
    if (err != cudaSuccess) return err;
    return cudaLaunchKernelEx(&blk, fp4_group_scatter_kernel, ids, w, n_pairs, k, n_experts,
                              (const int32_t *)counts, row_src, row_dst, row_w);
}
