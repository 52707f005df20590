/*
 * moe_group.cuh - launcher of the (token, slot) -> expert grouping kernel (moe_group.cu).
 */
#ifndef FP4MOE_MOE_GROUP_CUH
#define FP4MOE_MOE_GROUP_CUH

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4_GROUP_MAX_EXPERTS 2048

/* Tile slots needed for m*k pairs over E experts with segments padded to tile_m rows:
 * every expert's tiles fit in ceil(m*k / tile_m) + E slots. */
static inline int fp4_moe_group_slots(int m, int k, int n_experts, int tile_m)
{
    long long p = (long long)m * k;
    return (int)((p + tile_m - 1) / tile_m) + n_experts;
}

/* Group the m*k pairs of ids[m, k] / w[m, k] by expert into a padded row space of
 * n_slots * tile_m rows: each expert's segment starts at a multiple of tile_m; slot s covers
 * rows [s*tile_m, (s+1)*tile_m) and tile_expert[s] is its expert or -1 (past the end).
 * Per padded row: row_src = token (-1 for padding), row_dst = pair index t*k+slot (-1),
 * row_w = the pair's routing weight (0). Row order inside a segment is unspecified; results
 * of the GEMMs do not depend on it. n_slots must be fp4_moe_group_slots(m, k, E, tile_m). */
cudaError_t fp4_moe_group(const int32_t *ids, const float *w, int m, int k, int n_experts,
                          int tile_m, int n_slots, int32_t *tile_expert, int32_t *row_src,
                          int32_t *row_dst, float *row_w, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_MOE_GROUP_CUH */
