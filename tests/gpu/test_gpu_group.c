/*
 * test_gpu_group.c - fp4_moe_group (the grouping of the sm90-wgmma and mma paths) against the
 * grouping rebuilt on the CPU from its rule (moe_group.cuh): per expert in id order a segment of
 * ceil(pairs / (align tile_m)) * align slots, its rows the expert's pairs in ascending pair index
 * (source token, pair index, the pair's weight bit for bit), then -1 / -1 / 0 padding to the
 * segment's end and past the last used slot; tile_expert the segment's expert or -1; the unit
 * counters (unit_done) zeroed. Every output is poisoned with non-NaN values first, so an unwritten
 * entry cannot pass. Cases from one pair to 160000 pairs (one block of the count and place kernels
 * to 256; above that the prefix and scatter kernels), uneven loads (half the pairs on one expert),
 * experts with no pair, ids outside [0, E) (skipped), top-k = E, 100 and 256 experts, align 1 and
 * 2, tile_m 64 and 16. The ids are written by a kernel that lets its dependents launch at once and
 * writes 20 us later (test_gpu_group_dev.cu), so a count kernel that read them before its
 * programmatic-launch wait would count the poison; and the counts' scratch is poisoned, so a place
 * or prefix kernel that read it before its wait (the count kernel lets it launch at its start,
 * while the counts are being written) would likely read poison.
 * Prints "SKIP: no CUDA device" and exits 0 without a device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_moe.h"

#ifdef FP4MOE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_check.h"
#include "cuda/moe_group.cuh"

cudaError_t group_test_late_copy(const int32_t *ids_src, const float *w_src, int32_t *ids,
                                 float *w, long long n, long long delay_ns,
                                 cudaStream_t stream); /* test_gpu_group_dev.cu */

#define POISON_I 0x5a5a5a5a
#define POISON_F 12345.0f

typedef struct group_case {
    const char *name;
    int m, k, e, tile_m, align;
    int skew;    /* 1: half of the pairs on expert 3, experts 10..19 none */
    int invalid; /* 1: every 17th id outside [0, E) */
} group_case;

static void run_case(const group_case *c, cudaStream_t st, uint64_t *rng)
{
    const long long np = (long long)c->m * c->k;
    const int n_slots = fp4_moe_group_slots(c->m, c->k, c->e, c->tile_m, c->align);
    const long long n_rows = (long long)n_slots * c->tile_m;
    int32_t *ids = malloc(np * sizeof *ids);
    float *w = malloc(np * sizeof *w);
    for (long long p = 0; p < np; p++) {
        int e = (int)(check_next32(rng) % (uint32_t)c->e);
        if (c->k == c->e) e = (int)(p % c->k); /* top-k = E: every expert once per token */
        if (c->skew && (check_next32(rng) & 1)) e = 3;
        if (c->skew && e >= 10 && e < 20) e = 21;
        if (c->invalid && p % 17 == 5) e = (p / 17) % 3 == 0 ? -1 : c->e + (int)(p % 5);
        ids[p] = e;
        w[p] = (float)(check_next32(rng) >> 8) * (1.f / 16777216.f) + 1e-3f;
    }

    /* expected tables */
    int cnt[256] = {0}, tstart[257];
    for (long long p = 0; p < np; p++)
        if (ids[p] >= 0 && ids[p] < c->e) cnt[ids[p]]++;
    tstart[0] = 0;
    for (int e = 0; e < c->e; e++) {
        const int seg = c->align * c->tile_m;
        tstart[e + 1] = tstart[e] + (cnt[e] + seg - 1) / seg * c->align;
    }
    int32_t *x_src = malloc(n_rows * 4), *x_dst = malloc(n_rows * 4), *x_te = malloc(n_slots * 4);
    float *x_w = malloc(n_rows * 4);
    for (long long r = 0; r < n_rows; r++) x_src[r] = x_dst[r] = -1, x_w[r] = 0.f;
    for (int s = 0; s < n_slots; s++) x_te[s] = -1;
    for (int e = 0; e < c->e; e++)
        for (int s = tstart[e]; s < tstart[e + 1]; s++) x_te[s] = e;
    int next[256];
    for (int e = 0; e < c->e; e++) next[e] = tstart[e] * c->tile_m;
    for (long long p = 0; p < np; p++) {
        const int e = ids[p];
        if (e < 0 || e >= c->e) continue;
        const int r = next[e]++;
        x_src[r] = (int32_t)(p / c->k);
        x_dst[r] = (int32_t)p;
        x_w[r] = w[p];
    }

    int32_t *d_ids_src, *d_ids, *d_te, *d_src, *d_dst, *d_done;
    float *d_w_src, *d_w, *d_rw;
    void *scratch;
    const size_t sb = fp4_moe_group_scratch_bytes(c->m, c->k, c->e);
    const size_t db = fp4_moe_group_done_bytes(n_slots);
    CK(cudaMalloc((void **)&d_ids_src, np * 4));
    CK(cudaMalloc((void **)&d_ids, np * 4));
    CK(cudaMalloc((void **)&d_w_src, np * 4));
    CK(cudaMalloc((void **)&d_w, np * 4));
    CK(cudaMalloc((void **)&d_te, n_slots * 4));
    CK(cudaMalloc((void **)&d_src, n_rows * 4));
    CK(cudaMalloc((void **)&d_dst, n_rows * 4));
    CK(cudaMalloc((void **)&d_rw, n_rows * 4));
    CK(cudaMalloc(&scratch, sb));
    CK(cudaMalloc((void **)&d_done, db));
    CK(cudaMemcpy(d_ids_src, ids, np * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_w_src, w, np * 4, cudaMemcpyHostToDevice));
    /* poison: ids all 0 (a grouping of them differs from the expected one), weights and
     * outputs non-NaN values no rule writes */
    CK(cudaMemset(d_ids, 0, np * 4));
    float *pw = malloc((n_rows > np ? n_rows : np) * 4);
    for (long long i = 0; i < (n_rows > np ? n_rows : np); i++) pw[i] = POISON_F;
    CK(cudaMemcpy(d_w, pw, np * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_rw, pw, n_rows * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(d_te, 0x5a, n_slots * 4));
    CK(cudaMemset(d_src, 0x5a, n_rows * 4));
    CK(cudaMemset(d_dst, 0x5a, n_rows * 4));
    CK(cudaMemset(scratch, 0x5a, sb));
    CK(cudaMemset(d_done, 0x5a, db));
    CK(cudaDeviceSynchronize());

    CK(group_test_late_copy(d_ids_src, d_w_src, d_ids, d_w, np, 20000, st));
    cudaError_t err = fp4_moe_group(d_ids, d_w, c->m, c->k, c->e, c->tile_m, c->align, n_slots,
                                    scratch, sb, d_te, d_src, d_dst, d_rw, d_done, st);
    CHECK(err == cudaSuccess, "%s: launch %s", c->name, cudaGetErrorString(err));
    CK(cudaStreamSynchronize(st));

    int32_t *g_te = malloc(n_slots * 4), *g_src = malloc(n_rows * 4), *g_dst = malloc(n_rows * 4);
    float *g_w = malloc(n_rows * 4);
    CK(cudaMemcpy(g_te, d_te, n_slots * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g_src, d_src, n_rows * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g_dst, d_dst, n_rows * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g_w, d_rw, n_rows * 4, cudaMemcpyDeviceToHost));
    /* the unit counters: every one zeroed, the ints between them untouched */
    int32_t *g_done = malloc(db);
    CK(cudaMemcpy(g_done, d_done, db, cudaMemcpyDeviceToHost));
    long long bad_done = -1;
    for (long long i = 0; i < (long long)(db / 4) && bad_done < 0; i++)
        if (g_done[i] != (i % FP4_GROUP_DONE_STRIDE ? POISON_I : 0)) bad_done = i;
    CHECK(bad_done < 0, "%s: unit counter int %lld of %zu is 0x%x", c->name, bad_done, db / 4,
          bad_done < 0 ? 0u : (unsigned)g_done[bad_done]);
    int bad_slot = -1;
    for (int s = 0; s < n_slots && bad_slot < 0; s++)
        if (g_te[s] != x_te[s]) bad_slot = s;
    CHECK(bad_slot < 0, "%s: slot %d expert %d, expected %d", c->name, bad_slot,
          bad_slot < 0 ? 0 : g_te[bad_slot], bad_slot < 0 ? 0 : x_te[bad_slot]);
    long long bad_row = -1;
    for (long long r = 0; r < n_rows && bad_row < 0; r++)
        if (g_src[r] != x_src[r] || g_dst[r] != x_dst[r] || memcmp(&g_w[r], &x_w[r], 4))
            bad_row = r;
    CHECK(bad_row < 0, "%s: row %lld (of %lld) src %d dst %d w %.9g, expected %d %d %.9g",
          c->name, bad_row, n_rows, bad_row < 0 ? 0 : g_src[bad_row],
          bad_row < 0 ? 0 : g_dst[bad_row], bad_row < 0 ? 0.0 : (double)g_w[bad_row],
          bad_row < 0 ? 0 : x_src[bad_row], bad_row < 0 ? 0 : x_dst[bad_row],
          bad_row < 0 ? 0.0 : (double)x_w[bad_row]);
    printf("%s: %lld pairs, %d slots (%d in use)%s\n", c->name, np, n_slots, tstart[c->e],
           bad_slot < 0 && bad_row < 0 && bad_done < 0 ? "" : " FAILED");

    CK(cudaFree(d_ids_src));
    CK(cudaFree(d_ids));
    CK(cudaFree(d_w_src));
    CK(cudaFree(d_w));
    CK(cudaFree(d_te));
    CK(cudaFree(d_src));
    CK(cudaFree(d_dst));
    CK(cudaFree(d_rw));
    CK(cudaFree(scratch));
    CK(cudaFree(d_done));
    free(g_done);
    free(ids), free(w), free(x_src), free(x_dst), free(x_te), free(x_w), free(pw);
    free(g_te), free(g_src), free(g_dst), free(g_w);
}
#endif

int main(void)
{
    if (fp4_gpu_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
#ifdef FP4MOE_WITH_CUDA
    static const group_case cases[] = {
        {"one pair", 1, 1, 4, 64, 1, 0, 0},
        {"256 tokens top-8", 256, 8, 128, 64, 2, 0, 0},
        {"300 tokens top-6, 100 experts, skewed", 300, 6, 100, 64, 2, 1, 0},
        {"invalid ids", 1000, 8, 128, 64, 2, 0, 1},
        {"top-k = E", 64, 128, 128, 64, 2, 0, 0},
        {"tile 16, align 1", 777, 4, 64, 16, 1, 1, 1},
        {"32768 pairs, skewed", 4096, 8, 128, 64, 2, 1, 0},
        {"32776 pairs, invalid ids", 4097, 8, 128, 64, 2, 0, 1},
        {"80000 pairs, 256 experts, align 1", 2000, 40, 256, 64, 1, 1, 0},
        {"131072 pairs top-8", 16384, 8, 128, 64, 2, 0, 0},
        {"160000 pairs, skewed, invalid ids", 20000, 8, 128, 64, 2, 1, 1},
    };
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], st, &rng);
    CK(cudaStreamDestroy(st));
#endif
    return check_done();
}
