/*
 * moe_group.cu - groups the M*k (token, slot) pairs of the router by expert for the grouped
 * GEMMs: counts, prefix sum of per-expert segments padded to the GEMM's M-tile, tile table,
 * scatter of token / pair / weight into the padded row space.
 * One block of 1024 threads does all of it (no inter-block dependency, one launch, graph
 * capturable); integer shared-memory atomics only. Enough for decode and for prefill up to a
 * few hundred thousand pairs; a multi-block version is later work.
 */
#include "moe_group.cuh"

#define GROUP_THREADS 1024

__global__ void __launch_bounds__(GROUP_THREADS)
fp4_moe_group_kernel(const int32_t *__restrict__ ids, const float *__restrict__ w, int n_pairs,
                     int k, int n_experts, int tile_m, int n_slots,
                     int32_t *__restrict__ tile_expert, int32_t *__restrict__ row_src,
                     int32_t *__restrict__ row_dst, float *__restrict__ row_w)
{
    extern __shared__ int sm[];
    int *cnt = sm;                     /* [E] pairs per expert, then the scatter cursor */
    int *seg = sm + n_experts;         /* [E] first padded row of each segment */
    int *tstart = sm + 2 * n_experts;  /* [E + 1] first tile slot of each expert */
    const int tid = threadIdx.x;
    const long long n_rows = (long long)n_slots * tile_m;

    for (int e = tid; e < n_experts; e += GROUP_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int p = tid; p < n_pairs; p += GROUP_THREADS) {
        int e = ids[p];
        if (e >= 0 && e < n_experts) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int tiles = 0;
        for (int e = 0; e < n_experts; e++) {
            tstart[e] = tiles;
            seg[e] = tiles * tile_m;
            tiles += (cnt[e] + tile_m - 1) / tile_m;
            cnt[e] = 0;
        }
        tstart[n_experts] = tiles;
    }
    __syncthreads();
    for (int s = tid; s < n_slots; s += GROUP_THREADS) {
        int e = -1;
        if (s < tstart[n_experts]) { /* last expert whose first slot is <= s */
            int lo = 0, hi = n_experts - 1;
            while (lo < hi) {
                int mid = (lo + hi + 1) >> 1;
                if (tstart[mid] <= s) lo = mid; else hi = mid - 1;
            }
            e = lo;
        }
        tile_expert[s] = e;
    }
    for (long long r = tid; r < n_rows; r += GROUP_THREADS) {
        row_src[r] = -1;
        row_dst[r] = -1;
        row_w[r] = 0.f;
    }
    __syncthreads(); /* orders the fills above before the scatter below (same block) */
    for (int p = tid; p < n_pairs; p += GROUP_THREADS) {
        int e = ids[p];
        if (e < 0 || e >= n_experts) continue;
        int pos = seg[e] + atomicAdd(&cnt[e], 1);
        row_src[pos] = p / k;
        row_dst[pos] = p;
        row_w[pos] = w[p];
    }
}

extern "C" cudaError_t fp4_moe_group(const int32_t *ids, const float *w, int m, int k,
                                     int n_experts, int tile_m, int n_slots,
                                     int32_t *tile_expert, int32_t *row_src, int32_t *row_dst,
                                     float *row_w, cudaStream_t stream)
{
    if (!ids || !w || !tile_expert || !row_src || !row_dst || !row_w || m < 1 || k < 1 ||
        n_experts < 1 || n_experts > FP4_GROUP_MAX_EXPERTS || tile_m < 1 ||
        n_slots != fp4_moe_group_slots(m, k, n_experts, tile_m))
        return cudaErrorInvalidValue;
    size_t smem = (size_t)(3 * n_experts + 1) * sizeof(int);
    fp4_moe_group_kernel<<<1, GROUP_THREADS, smem, stream>>>(
        ids, w, m * k, k, n_experts, tile_m, n_slots, tile_expert, row_src, row_dst, row_w);
    return cudaGetLastError();
}
