/*
 * moe_group.cuh - launcher of the (token, slot) -> expert grouping kernel (moe_group.cu).
 */
#ifndef FP4MOE_MOE_GROUP_CUH
#define FP4MOE_MOE_GROUP_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_GROUP_MAX_EXPERTS 256
/* unit_done (fp4_moe_group): one counter per unit of two slots (2u, 2u + 1), this many ints
 * apart (128 bytes: a line of its own each, for the pollers of sm90-wgmma's FC1 -> FC2
 * hand-off, sm90_w4a16_wgmma.cuh) */
#define FP4_GROUP_DONE_STRIDE 32

/* Tile slots needed for m*k pairs over E experts with segments padded to tile_m rows, each
 * segment a multiple of align (1 or 2) slots: they fit in ceil(m*k / tile_m) + align * E. */
static inline int fp4_moe_group_slots(int m, int k, int n_experts, int tile_m, int align)
{
    long long p = (long long)m * k;
    return (int)((p + tile_m - 1) / tile_m) + align * n_experts;
}

#ifdef __CUDACC__
#define FP4_GROUP_HD __host__ __device__
#else
#define FP4_GROUP_HD
#endif
/* Units of two slots (2u, 2u + 1) over n_slots slots: sm90-wgmma's work units, one
 * unit_done counter each. */
static inline FP4_GROUP_HD int fp4_moe_group_units(int n_slots) { return (n_slots + 1) / 2; }

/* Bytes of fp4_moe_group's unit_done for n_slots slots. */
static inline size_t fp4_moe_group_done_bytes(int n_slots)
{
    return (size_t)fp4_moe_group_units(n_slots) * FP4_GROUP_DONE_STRIDE * sizeof(int32_t);
}

/* Device scratch fp4_moe_group needs: one int per (chunk of 512 pairs, expert). */
size_t fp4_moe_group_scratch_bytes(int m, int k, int n_experts);

/* Group the m*k pairs of ids[m, k] / w[m, k] by expert into a padded row space of
 * n_slots * tile_m rows: each expert's segment starts at a multiple of tile_m and holds a
 * multiple of align slots (align 2: an expert's slots pair up as (2u, 2u + 1), the second
 * of its last pair possibly empty); slot s covers rows [s*tile_m, (s+1)*tile_m) and
 * tile_expert[s] is its expert or -1 (past the end).
 * Per padded row: row_src = token (-1 for padding), row_dst = pair index t*k+slot (-1),
 * row_w = the pair's routing weight (0). Rows inside a segment are in ascending pair index
 * (the same tables on every run; the GEMMs do not depend on the order). n_slots must be
 * fp4_moe_group_slots(m, k, E, tile_m, align); scratch_bytes >= fp4_moe_group_scratch_bytes(m, k,
 * E), dead after the call's kernels. unit_done: NULL, or fp4_moe_group_done_bytes(n_slots)
 * bytes whose fp4_moe_group_units(n_slots) counters (FP4_GROUP_DONE_STRIDE ints apart) are
 * zeroed with the tables. Two or three programmatic dependent launches, grids fixed by m*k.
 * E <= 256. */
cudaError_t fp4_moe_group(const int32_t *ids, const float *w, int m, int k, int n_experts,
                          int tile_m, int align, int n_slots, void *scratch, size_t scratch_bytes,
                          int32_t *tile_expert, int32_t *row_src, int32_t *row_dst,
                          float *row_w, int32_t *unit_done, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_MOE_GROUP_CUH */
