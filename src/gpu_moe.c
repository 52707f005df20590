/*
 * gpu_moe.c - host side of the GPU W4A16 MoE pipeline (gpu_moe.h): load-time conversion of
 * one layer's weights to the kernels' layout, workspace layout, and the forward pass as one
 * stream of launches (route -> group -> FC1 -> FC2 -> shared FC1/FC2 -> combine) with no
 * host synchronisation and grids fixed by M, so it can be captured in a CUDA graph. On SM90
 * every kernel of it is a programmatic dependent launch (src/cuda/device_util.cuh), so a
 * kernel's blocks launch while the one before finishes and wait for it on the device.
 * Device layout (FP4_GPU_K_MMA, see src/cuda/w4a16_mma_gemm.cuh):
 *   routed W13 (E 2I rows of H/2 bytes) packed e2m1, gate rows then up rows, and S13
 *   [E][2I][H/16] block scales, both packed by fp4_gpu_pack_nvfp4 (gpu_pack.h: codes in the
 *   mma fragment nibble order per 32-byte group, in tiles of 8 rows x 32 bytes, scales as
 *   e5m3); G13 [E][2] fp32 (gate, up); W2 (E H rows of I/2 bytes),
 *   S2 [E][H][I/16] packed the same way, G2 [E]. Router [E, H] fp32 (the decode router)
 *   and as three bf16 planes [3][E, H] (fp4_gpu_router_split: the tensor-core router), bias [E].
 *   Shared expert: nvfp4 -> the same layout with E = 1; mxfp8 / bf16 -> bf16 [2Is][H], [H][Is].
 * FP4_GPU_K_DECODE (src/cuda/w4a16_decode.cuh) reads the same weight layout; its activations
 * are bf16 in a "paired" K order (fp4_dec_pair_pos) for nvfp4 weights.
 * Workspace (for M tokens, slots = ceil(M k / T) + E with T = 64 (mma) or dec_slot_tokens (8,
 * 16 or 32, decode)): ids /
 * weights [M k], tile table [slots], padded rows src/dst/weight [slots * T], a [slots * T, I]
 * bf16, per-pair FC2 output [M k, H] bf16, shared a [M, Is] bf16; decode adds paired x
 * [M, H] bf16 and router logits [M, E] fp32. workspace_size is the larger of the two.
 * Limits: routed experts nvfp4 only; H, I, Is multiples of 64; E <= 256; H <= 16384.
 * Without FP4MOE_WITH_CUDA every call returns FP4MOE_ERR_NOT_SUPPORTED.
 */
#include "gpu_moe.h"
#include "gpu_pack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fp4_gpu_kernel_name(fp4_gpu_kernel k)
{
    switch (k) {
    case FP4_GPU_K_MMA: return "mma";
    case FP4_GPU_K_DECODE: return "decode";
    case FP4_GPU_K_SM90_WGMMA: return "sm90-wgmma";
    case FP4_GPU_K_COUNT: break;
    }
    return "unknown";
}

/* bf16 bits of f truncated toward zero: f minus their value is exact in fp32. */
static uint16_t bf16_trunc(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

void fp4_gpu_router_split(const float *router, size_t n, uint16_t *planes)
{
    for (size_t i = 0; i < n; i++) {
        const float r = router[i];
        uint16_t hi = bf16_trunc(r), mid = 0, lo = 0;
        if (isfinite(r)) {
            const float r1 = r - fp4moe_bf16_to_float(hi); /* the low 16 significant bits */
            mid = bf16_trunc(r1);
            lo = bf16_trunc(r1 - fp4moe_bf16_to_float(mid)); /* at most 8 bits left: exact */
        }
        planes[i] = hi;
        planes[n + i] = mid;
        planes[2 * n + i] = lo;
    }
}

#ifndef FP4MOE_WITH_CUDA

int fp4_gpu_device_count(void) { return 0; }

int fp4_gpu_device_cc(int *major, int *minor)
{
    if (major) *major = 0;
    if (minor) *minor = 0;
    return 0;
}

fp4moe_status fp4_gpu_moe_create(const fp4_arch *a, const fp4_moe_weights *w,
                                 fp4_gpu_moe **out, fp4_err *e)
{
    (void)a, (void)w;
    if (out) *out = NULL;
    return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "GPU MoE: built without CUDA");
}

void fp4_gpu_moe_destroy(fp4_gpu_moe *g) { (void)g; }

size_t fp4_gpu_moe_workspace_size(const fp4_gpu_moe *g, int max_tokens)
{
    (void)g, (void)max_tokens;
    return 0;
}

int fp4_gpu_moe_set_dec_slot_tokens(fp4_gpu_moe *g, int t)
{
    (void)g, (void)t;
    return -1;
}

size_t fp4_gpu_moe_workspace_for(const fp4_arch *a, int max_tokens)
{
    (void)a, (void)max_tokens;
    return 0;
}

fp4moe_status fp4_gpu_moe_forward(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const void *x_bf16,
                                  int m, float *y, int32_t *topk_ids, float *topk_w,
                                  void *workspace, size_t workspace_bytes, void *stream, fp4_err *e)
{
    (void)g, (void)kernel, (void)x_bf16, (void)m, (void)y, (void)topk_ids, (void)topk_w, (void)workspace,
        (void)workspace_bytes, (void)stream;
    return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "GPU MoE: built without CUDA");
}

fp4moe_status fp4_gpu_moe_prologue(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const void *x_bf16,
                                   int m, int32_t *topk_ids, float *topk_w, void *workspace,
                                   size_t workspace_bytes, void *stream, fp4_err *e)
{
    (void)g, (void)kernel, (void)x_bf16, (void)m, (void)topk_ids, (void)topk_w, (void)workspace,
        (void)workspace_bytes, (void)stream;
    return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "GPU MoE: built without CUDA");
}

fp4moe_status fp4_gpu_moe_forward_host(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const float *x,
                                       int m, float *y, int32_t *topk_ids, float *topk_w, fp4_err *e)
{
    (void)g, (void)kernel, (void)x, (void)m, (void)y, (void)topk_ids, (void)topk_w;
    return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "GPU MoE: built without CUDA");
}

#else /* FP4MOE_WITH_CUDA */

#include <cuda_runtime_api.h>

#include "cuda/moe_combine.cuh"
#include "cuda/moe_group.cuh"
#include "cuda/moe_route.cuh"
#include "cuda/w4a16_decode.cuh"
#include "cuda/sm90_w4a16_wgmma.cuh"
#include "cuda/w4a16_mma_gemm.cuh"

#define FP4_GPU_MAX_HIDDEN 16384

struct fp4_gpu_moe {
    fp4_arch arch;
    int n_experts, hidden, inter, topk;     /* E, H, I, k */
    int has_shared, shared_inter;           /* Is */
    int shared_fmt;                         /* fp4_mma_wfmt of the shared expert */
    float *router, *bias;                   /* [E, H], [E] or NULL */
    uint16_t *router_planes;                /* [3][E, H] bf16 (fp4_gpu_router_split) */
    uint8_t *w13, *s13, *w2, *s2;           /* routed, layout above */
    float *g13, *g2;                        /* [E][2], [E] */
    uint8_t *sh_w13, *sh_s13, *sh_w2, *sh_s2; /* shared nvfp4 */
    float *sh_g13, *sh_g2;                  /* [2], [1] */
    uint16_t *sh_b13, *sh_b2;               /* shared bf16 [2Is][H], [H][Is] */
    int dec_slot_force;                     /* fp4_gpu_moe_set_dec_slot_tokens: 8, 16, 32; 0 */
    int n_sm;                               /* the device's multiprocessors (decode RT rule) */
};

typedef struct gpu_ws {
    int n_slots, tile_t, slot_align;
    size_t ids, w, tile_expert, row_src, row_dst, row_w, a, pairs, sh_a, xp, logits, total;
    size_t unit_done; /* sm90-wgmma: FC1 -> FC2 hand-off counters (0 bytes otherwise) */
    size_t logits_bytes; /* also the route / group scratch */
} gpu_ws;

static fp4moe_status cuda_fail(fp4_err *e, cudaError_t err, const char *what)
{
    return fp4_fail(e, err == cudaErrorMemoryAllocation ? FP4MOE_ERR_OUT_OF_MEMORY
                                                        : FP4MOE_ERR_CUDA,
                    "GPU MoE: %s failed: %s (%s)", what, cudaGetErrorName(err),
                    cudaGetErrorString(err));
}

int fp4_gpu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

int fp4_gpu_device_cc(int *major, int *minor)
{
    int ma = 0, mi = 0;
    if (fp4_gpu_device_count() < 1 ||
        cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        ma = mi = 0;
    }
    if (major) *major = ma;
    if (minor) *minor = mi;
    return ma > 0;
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

#define DEC_FUSED_ROUTER_MAX_M 32 /* <= FP4_DEC_ROUTE_MAX_M */

/* Tokens per decode slot, the one rule: 8 while the fused small-M router groups (m <= 32) and
 * while an expert gets at most 6 tokens on average; 16 up to 13 on average, else 32. A wider
 * slot shares each dequantized weight fragment over 2 or 4 mma n8 tiles, so an expert whose
 * tokens would fill two 8-token slots has its weights dequantized once, not twice; a 32-token
 * slot runs only the n8 tiles its tokens fill. Measured (H200, top-8 whole layer, bench
 * --dec-slot-tokens, bench/NOTES.md fifth session): 4/expert 8-token 224 us, 16-token 270,
 * 32-token 288; 8/expert 16-token 283, 32-token 312; 12/expert 324 vs 337; 14/expert 360 vs
 * 351; 16/expert 401 vs 366. With the codes in 8-row tiles (thirty-first session, layer,
 * forced against this rule's 16): 5/expert 8-token 191.6 us vs 212.7, 6/expert 200.4 vs
 * 213.2 (top-4 202.1 vs 216.2), 8/expert 233.3 vs 219.6, 9/expert 256.3 vs 224.2; 4/expert
 * 16-token +15%. */
static int dec_slot_tokens(const fp4_gpu_moe *g, int m)
{
    double avg = (double)m * g->topk / g->n_experts;
    if (m <= DEC_FUSED_ROUTER_MAX_M) return FP4_DEC_TILE_T;
    if (g->dec_slot_force) return g->dec_slot_force; /* measuring override (bench) */
    return avg <= 6.0 ? FP4_DEC_TILE_T : avg <= 13.0 ? 16 : 32;
}

int fp4_gpu_moe_set_dec_slot_tokens(fp4_gpu_moe *g, int t)
{
    if (!g || (t != 0 && t != 8 && t != 16 && t != 32)) return -1;
    g->dec_slot_force = t;
    return 0;
}

static gpu_ws ws_layout(const fp4_gpu_moe *g, int m, fp4_gpu_kernel kernel)
{
    gpu_ws l;
    size_t pairs = (size_t)m * g->topk, off = 0;
    int dec = kernel == FP4_GPU_K_DECODE;
    l.tile_t = dec ? dec_slot_tokens(g, m) : FP4_MMA_TILE_M;
    /* sm90-wgmma runs two slots of one expert as one 128-token tile: segments of an even
     * number of slots make every pair (2u, 2u + 1) one expert's */
    l.slot_align = kernel == FP4_GPU_K_SM90_WGMMA ? 2 : 1;
    l.n_slots = fp4_moe_group_slots(m, g->topk, g->n_experts, l.tile_t, l.slot_align);
    size_t rows = (size_t)l.n_slots * l.tile_t;
#define TAKE(field, bytes) (l.field = off, off = align256(off + (bytes)))
    TAKE(ids, pairs * 4);
    TAKE(w, pairs * 4);
    TAKE(tile_expert, (size_t)l.n_slots * 4);
    TAKE(row_src, rows * 4);
    TAKE(row_dst, rows * 4);
    TAKE(row_w, rows * 4);
    TAKE(a, rows * g->inter * 2);
    TAKE(pairs, pairs * g->hidden * 2); /* bf16, FC2's per-pair rows */
    TAKE(sh_a, g->has_shared ? (size_t)m * g->shared_inter * 2 : 0);
    TAKE(xp, dec ? (size_t)m * g->hidden * 2 : 0);
    TAKE(unit_done, kernel == FP4_GPU_K_SM90_WGMMA ? fp4_moe_group_done_bytes(l.n_slots) : 0);
    /* logits: the decode router's [M, E], else route / group scratch (used one after the
     * other, so they share it) */
    size_t rs = fp4_moe_route_scratch_bytes(m, g->n_experts);
    size_t gs = fp4_moe_group_scratch_bytes(m, g->topk, g->n_experts);
    size_t ls = dec ? (size_t)m * g->n_experts * 4 : 0;
    l.logits_bytes = ls > rs ? (ls > gs ? ls : gs) : (rs > gs ? rs : gs);
    TAKE(logits, l.logits_bytes);
#undef TAKE
    l.total = off;
    return l;
}

size_t fp4_gpu_moe_workspace_size(const fp4_gpu_moe *g, int max_tokens)
{
    if (!g || max_tokens < 1) return 0;
    size_t most = 0; /* every kernel's layout differs (slot width, slot pairs) */
    for (int kern = 0; kern < FP4_GPU_K_COUNT; kern++) {
        size_t b = ws_layout(g, max_tokens, (fp4_gpu_kernel)kern).total;
        if (b > most) most = b;
    }
    return most;
}

size_t fp4_gpu_moe_workspace_for(const fp4_arch *a, int max_tokens)
{
    /* The workspace depends on the shape only: the fields ws_layout reads. */
    fp4_gpu_moe g;
    if (!a) return 0;
    memset(&g, 0, sizeof g);
    g.n_experts = a->n_experts, g.hidden = a->hidden, g.inter = a->moe_intermediate;
    g.topk = a->topk, g.has_shared = a->shared_intermediate > 0;
    g.shared_inter = a->shared_intermediate;
    return fp4_gpu_moe_workspace_size(&g, max_tokens);
}

void fp4_gpu_moe_destroy(fp4_gpu_moe *g)
{
    if (!g) return;
    void *ptrs[] = {g->router, g->router_planes, g->bias,   g->w13,   g->s13,
                    g->w2,     g->s2,            g->g13,    g->g2,    g->sh_w13,
                    g->sh_s13, g->sh_w2,         g->sh_s2,  g->sh_g13, g->sh_g2,
                    g->sh_b13, g->sh_b2};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i]) cudaFree(ptrs[i]);
    free(g);
}

static fp4moe_status dev_alloc(void **p, size_t bytes, const char *what, fp4_err *e)
{
    cudaError_t err = cudaMalloc(p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError();
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY,
                        "GPU MoE: cudaMalloc of %zu bytes for %s failed: %s", bytes, what,
                        cudaGetErrorString(err));
    }
    return FP4MOE_OK;
}

static fp4moe_status upload(void *dst, const void *src, size_t bytes, const char *what,
                            fp4_err *e)
{
    cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return err == cudaSuccess ? FP4MOE_OK : cuda_fail(e, err, what);
}

/* Check one linear's scheme and shape; name is e.g. "expert 5 gate". */
static fp4moe_status check_linear(const fp4_linear *l, int need_nvfp4, int n, int k,
                                  int layer, const char *name, fp4_err *e)
{
    if (need_nvfp4 && l->scheme.w != FP4_W_NVFP4)
        return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED,
                        "GPU MoE kernel 'mma': layer %d %s weight scheme is '%s'; routed "
                        "experts must be 'nvfp4'", layer, name, fp4_wscheme_name(l->scheme.w));
    if (l->n != n || l->k != k)
        return fp4_fail(e, FP4MOE_ERR_FORMAT,
                        "GPU MoE: layer %d %s has shape [%d, %d], expected [%d, %d]", layer,
                        name, l->n, l->k, n, k);
    if (!l->w || (l->scheme.w != FP4_W_BF16 && !l->scale))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "GPU MoE: layer %d %s has no data",
                        layer, name);
    if (l->scheme.w == FP4_W_MXFP8 && k % 32)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "GPU MoE: layer %d %s: mxfp8 needs in_features "
                        "%% 32 == 0, got %d", layer, name, k);
    return FP4MOE_OK;
}

/* One nvfp4 linear into host staging buffers in the kernels' layout (gpu_pack.h); name is
 * e.g. "expert 5 gate". A NaN block scale cannot be packed: a format error naming it. */
static fp4moe_status stage_nvfp4(const fp4_linear *l, uint8_t *wq, uint8_t *ws, int layer,
                                 const char *name, fp4_err *e)
{
    size_t bad = 0;
    const int rc = fp4_gpu_pack_nvfp4(l->w, l->scale, l->n, l->k, wq, ws, &bad);
    if (rc == -2) /* checked before, at create (H, I multiples of 64) */
        return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED,
                        "GPU MoE: layer %d %s: shape [%d, %d]: the packed layout needs "
                        "out_features %% 8 == 0 and in_features %% 64 == 0", layer, name, l->n,
                        l->k);
    if (rc)
        return fp4_fail(e, FP4MOE_ERR_FORMAT,
                        "GPU MoE: layer %d %s: block scale [%zu, %zu] is an e4m3 NaN (0x%02x); "
                        "nvfp4 block scales must be finite", layer, name, bad / (l->k / 16),
                        bad % (l->k / 16), l->scale[bad]);
    return FP4MOE_OK;
}

/* Dequantize a bf16 or mxfp8 linear to bf16 rows (exact for both). */
static void stage_bf16(const fp4_linear *l, uint16_t *out, float *tmp_row)
{
    for (int r = 0; r < l->n; r++) {
        uint16_t *o = out + (size_t)r * l->k;
        if (l->scheme.w == FP4_W_BF16) {
            memcpy(o, l->w + (size_t)r * l->k * 2, (size_t)l->k * 2);
            continue;
        }
        fp4moe_mxfp8_dequantize(l->w + (size_t)r * l->k, l->scale + (size_t)r * (l->k / 32),
                                (size_t)l->k, tmp_row);
        for (int i = 0; i < l->k; i++) o[i] = fp4moe_bf16_from_float(tmp_row[i]);
    }
}

/* Upload gate/up (stacked) and down of one expert-like triple in nvfp4 at index idx; who is
 * "expert 5" or "shared expert" (for error messages). */
static fp4moe_status upload_nvfp4_triple(const fp4_linear *gate, const fp4_linear *up,
                                         const fp4_linear *down, int idx, uint8_t *w13,
                                         uint8_t *s13, uint8_t *w2, uint8_t *s2, float *g13,
                                         float *g2, uint8_t *hw, uint8_t *hs, int layer,
                                         const char *who, fp4_err *e)
{
    int i = gate->n, h = gate->k;
    size_t q13 = (size_t)2 * i * (h / 2), c13 = (size_t)2 * i * (h / 16);
    size_t q2 = (size_t)h * (i / 2), c2 = (size_t)h * (i / 16);
    char name[64];
    fp4moe_status st;
    snprintf(name, sizeof name, "%s gate", who);
    if ((st = stage_nvfp4(gate, hw, hs, layer, name, e))) return st;
    snprintf(name, sizeof name, "%s up", who);
    if ((st = stage_nvfp4(up, hw + q13 / 2, hs + c13 / 2, layer, name, e))) return st;
    if ((st = upload(w13 + idx * q13, hw, q13, "W13 upload", e)) ||
        (st = upload(s13 + idx * c13, hs, c13, "S13 upload", e)))
        return st;
    snprintf(name, sizeof name, "%s down", who);
    if ((st = stage_nvfp4(down, hw, hs, layer, name, e))) return st;
    if ((st = upload(w2 + idx * q2, hw, q2, "W2 upload", e)) ||
        (st = upload(s2 + idx * c2, hs, c2, "S2 upload", e)))
        return st;
    float gs[2] = {gate->global_scale, up->global_scale};
    if ((st = upload(g13 + 2 * idx, gs, sizeof gs, "G13 upload", e)) ||
        (st = upload(g2 + idx, &down->global_scale, sizeof(float), "G2 upload", e)))
        return st;
    return FP4MOE_OK;
}

static fp4moe_status load_shared(fp4_gpu_moe *g, const fp4_moe_weights *w, uint8_t *hw,
                                 uint8_t *hs, fp4_err *e)
{
    int h = g->hidden, is = g->shared_inter, L = w->layer;
    const fp4_linear *sg = &w->sh_gate, *su = &w->sh_up, *sd = &w->sh_down;
    fp4moe_status st;
    if ((st = check_linear(sg, 0, is, h, L, "shared gate", e)) ||
        (st = check_linear(su, 0, is, h, L, "shared up", e)) ||
        (st = check_linear(sd, 0, h, is, L, "shared down", e)))
        return st;
    int all_fp4 = sg->scheme.w == FP4_W_NVFP4 && su->scheme.w == FP4_W_NVFP4 &&
                  sd->scheme.w == FP4_W_NVFP4;
    if (all_fp4) {
        g->shared_fmt = FP4_MMA_W_NVFP4;
        if ((st = dev_alloc((void **)&g->sh_w13, (size_t)2 * is * (h / 2), "shared W13", e)) ||
            (st = dev_alloc((void **)&g->sh_s13, (size_t)2 * is * (h / 16), "shared S13", e)) ||
            (st = dev_alloc((void **)&g->sh_w2, (size_t)h * (is / 2), "shared W2", e)) ||
            (st = dev_alloc((void **)&g->sh_s2, (size_t)h * (is / 16), "shared S2", e)) ||
            (st = dev_alloc((void **)&g->sh_g13, 2 * sizeof(float), "shared G13", e)) ||
            (st = dev_alloc((void **)&g->sh_g2, sizeof(float), "shared G2", e)))
            return st;
        return upload_nvfp4_triple(sg, su, sd, 0, g->sh_w13, g->sh_s13, g->sh_w2, g->sh_s2,
                                   g->sh_g13, g->sh_g2, hw, hs, L, "shared expert", e);
    }
    /* Mixed or non-nvfp4: everything to bf16 (nvfp4 parts dequantized exactly as well). */
    g->shared_fmt = FP4_MMA_W_BF16;
    size_t n13 = (size_t)2 * is * h, n2 = (size_t)h * is;
    uint16_t *b = malloc((n13 > n2 ? n13 : n2) * 2);
    float *tmp = malloc((size_t)(h > is ? h : is) * sizeof(float));
    if (!b || !tmp) {
        free(b);
        free(tmp);
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "GPU MoE: host staging of shared expert");
    }
    const fp4_linear *parts[3] = {sg, su, sd};
    size_t at = 0;
    st = dev_alloc((void **)&g->sh_b13, n13 * 2, "shared W13 bf16", e);
    if (!st) st = dev_alloc((void **)&g->sh_b2, n2 * 2, "shared W2 bf16", e);
    for (int p = 0; p < 3 && !st; p++) {
        const fp4_linear *l = parts[p];
        uint16_t *o = p == 2 ? b : b + at;
        if (l->scheme.w == FP4_W_NVFP4) {
            for (int r = 0; r < l->n; r++) {
                fp4_linear_dequant_rows(l, r, 1, tmp);
                for (int c = 0; c < l->k; c++) o[(size_t)r * l->k + c] = fp4moe_bf16_from_float(tmp[c]);
            }
        } else {
            stage_bf16(l, o, tmp);
        }
        at += (size_t)l->n * l->k;
        if (p == 1) st = upload(g->sh_b13, b, n13 * 2, "shared W13 upload", e);
        if (p == 2) st = upload(g->sh_b2, b, n2 * 2, "shared W2 upload", e);
    }
    free(b);
    free(tmp);
    return st;
}

fp4moe_status fp4_gpu_moe_create(const fp4_arch *a, const fp4_moe_weights *w,
                                 fp4_gpu_moe **out, fp4_err *e)
{
    if (!a || !w || !out) return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "GPU MoE create: NULL argument");
    *out = NULL;
    if (fp4_gpu_device_count() < 1)
        return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "GPU MoE: no CUDA device");
    int E = w->n_experts, H = w->hidden, I = w->inter, k = a->topk, L = w->layer;
    if (E < 1 || E > FP4_ROUTE_MAX_EXPERTS || H < 64 || H % 64 || H > FP4_GPU_MAX_HIDDEN ||
        I < 64 || I % 64 || k < 1 || k > E)
        return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED,
                        "GPU MoE kernel 'mma': layer %d shape E=%d H=%d I=%d top-k=%d not "
                        "supported (needs E <= %d, H %% 64 == 0 and H <= %d, I %% 64 == 0, "
                        "1 <= top-k <= E)", L, E, H, I, k, FP4_ROUTE_MAX_EXPERTS,
                        FP4_GPU_MAX_HIDDEN);
    if (!w->router || !w->gate || !w->up || !w->down)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "GPU MoE: layer %d weights incomplete", L);
    if (w->has_shared && (w->shared_inter < 64 || w->shared_inter % 64))
        return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "GPU MoE kernel 'mma': layer %d shared "
                        "intermediate %d is not a multiple of 64", L, w->shared_inter);
    fp4moe_status st;
    char name[48];
    for (int x = 0; x < E; x++) {
        snprintf(name, sizeof name, "expert %d gate", x);
        if ((st = check_linear(&w->gate[x], 1, I, H, L, name, e))) return st;
        snprintf(name, sizeof name, "expert %d up", x);
        if ((st = check_linear(&w->up[x], 1, I, H, L, name, e))) return st;
        snprintf(name, sizeof name, "expert %d down", x);
        if ((st = check_linear(&w->down[x], 1, H, I, L, name, e))) return st;
    }
    cudaError_t err;
    if ((err = fp4_moe_route_init()) != cudaSuccess || (err = fp4_mma_gemm_init()) != cudaSuccess ||
        (err = fp4_dec_gemm_init()) != cudaSuccess)
        return cuda_fail(e, err, "kernel setup");
    /* The wgmma kernel exists only on sm_90: its init fails elsewhere, and a forward that asks
     * for it then reports so (the oracle never asks for it off sm_90). */
    if (fp4_sm90_wgmma_gemm_init() != cudaSuccess)
        (void)cudaGetLastError();

    int dev = 0, n_sm = 0;
    if ((err = cudaGetDevice(&dev)) != cudaSuccess ||
        (err = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return cuda_fail(e, err, "multiprocessor count query");

    fp4_gpu_moe *g = calloc(1, sizeof *g);
    if (!g) return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "GPU MoE: handle");
    g->arch = *a;
    g->n_sm = n_sm;
    g->n_experts = E, g->hidden = H, g->inter = I, g->topk = k;
    g->has_shared = w->has_shared, g->shared_inter = w->has_shared ? w->shared_inter : 0;
    int is = g->shared_inter;
    size_t q13 = (size_t)2 * I * (H / 2), c13 = (size_t)2 * I * (H / 16);
    size_t sh_q = (size_t)2 * is * (H / 2);
    size_t stage_q = q13 > sh_q ? q13 : sh_q;
    uint8_t *hw = malloc(stage_q), *hs = malloc(stage_q / 8 + 16);
    if (!hw || !hs) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "GPU MoE: host staging buffers");
        goto fail_staging;
    }
    if ((st = dev_alloc((void **)&g->router, (size_t)E * H * 4, "router", e)) ||
        (st = upload(g->router, w->router, (size_t)E * H * 4, "router upload", e)))
        goto fail_staging;
    {
        const size_t n = (size_t)E * H;
        uint16_t *planes = malloc(3 * n * sizeof *planes);
        if (!planes) {
            st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "GPU MoE: router planes");
            goto fail_staging;
        }
        fp4_gpu_router_split(w->router, n, planes);
        /* a pageable copy has left the host buffer when cudaMemcpy returns */
        if (!(st = dev_alloc((void **)&g->router_planes, 3 * n * 2, "router planes", e)))
            st = upload(g->router_planes, planes, 3 * n * 2, "router planes upload", e);
        free(planes);
        if (st) goto fail_staging;
    }
    if (w->router_bias && a->has_score_bias &&
        ((st = dev_alloc((void **)&g->bias, (size_t)E * 4, "router bias", e)) ||
         (st = upload(g->bias, w->router_bias, (size_t)E * 4, "router bias upload", e))))
        goto fail_staging;
    if ((st = dev_alloc((void **)&g->w13, E * q13, "W13", e)) ||
        (st = dev_alloc((void **)&g->s13, E * c13, "S13", e)) ||
        (st = dev_alloc((void **)&g->w2, E * q13 / 2, "W2", e)) ||
        (st = dev_alloc((void **)&g->s2, E * c13 / 2, "S2", e)) ||
        (st = dev_alloc((void **)&g->g13, (size_t)E * 8, "G13", e)) ||
        (st = dev_alloc((void **)&g->g2, (size_t)E * 4, "G2", e)))
        goto fail_staging;
    for (int x = 0; x < E; x++) {
        char who[32];
        snprintf(who, sizeof who, "expert %d", x);
        if ((st = upload_nvfp4_triple(&w->gate[x], &w->up[x], &w->down[x], x, g->w13, g->s13,
                                      g->w2, g->s2, g->g13, g->g2, hw, hs, L, who, e)))
            goto fail_staging;
    }
    if (g->has_shared && (st = load_shared(g, w, hw, hs, e))) goto fail_staging;
    /* cudaMemcpy from pageable memory may return before its DMA lands, and forward runs on
     * the caller's stream (possibly non-blocking): finish the uploads here. */
    if ((err = cudaDeviceSynchronize()) != cudaSuccess) {
        st = cuda_fail(e, err, "weight upload");
        goto fail_staging;
    }
    free(hw);
    free(hs);
    *out = g;
    return FP4MOE_OK;

fail_staging:
    free(hw);
    free(hs);
    fp4_gpu_moe_destroy(g);
    return st;
}

/* The decode shared expert: identity slots of 8 tokens, FC2 straight into y (overwritten). */
static cudaError_t decode_shared(const fp4_gpu_moe *g, const void *x_bf16, const uint16_t *xp,
                                 int m, float *y, uint16_t *sh_a, cudaStream_t s,
                                 const char **what)
{
    const fp4_arch *a = &g->arch;
    int is = g->shared_inter, fp4 = g->shared_fmt == FP4_MMA_W_NVFP4;
    fp4_dec_gemm_args p;
    memset(&p, 0, sizeof p);
    p.wfmt = fp4 ? FP4_DEC_W_NVFP4 : FP4_DEC_W_BF16;
    p.act = a->act == FP4_ACT_SWIGLUOAI, p.limit = a->swiglu_limit, p.alpha = a->swiglu_alpha;
    p.gated = 1, p.n = is, p.k = g->hidden;
    p.n_slots = (m + FP4_DEC_TILE_T - 1) / FP4_DEC_TILE_T;
    p.tiles_per_warp = m >= 2 * FP4_DEC_TILE_T ? 2 : 1;
    p.a = fp4 ? xp : x_bf16, p.a_rows = m, p.out_rows = m, p.out = sh_a;
    p.wq = g->sh_w13, p.ws = g->sh_s13, p.wb = g->sh_b13, p.gscale = g->sh_g13;
    *what = "decode shared FC1 launch";
    cudaError_t err = fp4_dec_gemm(&p, s);
    if (err != cudaSuccess) return err;
    p.gated = 0, p.n = g->hidden, p.k = is, p.a = sh_a, p.out = y;
    p.weights_first = 1; /* identity slots: no table; the shared FC1 runs before */
    p.wq = g->sh_w2, p.ws = g->sh_s2, p.wb = g->sh_b2, p.gscale = g->sh_g2;
    *what = "decode shared FC2 launch";
    return fp4_dec_gemm(&p, s);
}

/* The decode pipeline (FP4_GPU_K_DECODE): route + prep (grouping into slots of
 * dec_slot_tokens, x in the paired layout; two launches) -> FC1 -> FC2 [-> shared FC1 -> shared FC2] -> combine.
 * One token (M = 1, top-k <= 8, 8-token slots): FC1 [-> shared FC1 -> shared FC2] -> FC2 with
 * the combine (one_token: a warp per slot, y written, or added to, by the FC2 blocks).
 * Grids are fixed by M (slot bound fp4_dec_active_slots), so the forward stays capturable. */
static fp4moe_status forward_decode(fp4_gpu_moe *g, const void *x_bf16, int m, float *y,
                                    int32_t *ids, float *wts, char *ws, const gpu_ws *l,
                                    int prologue_only, cudaStream_t s, fp4_err *e)
{
    int E = g->n_experts, H = g->hidden, I = g->inter, k = g->topk;
    int32_t *tile_expert = (int32_t *)(ws + l->tile_expert);
    int32_t *row_src = (int32_t *)(ws + l->row_src), *row_dst = (int32_t *)(ws + l->row_dst);
    float *row_w = (float *)(ws + l->row_w);
    uint16_t *pairs = (uint16_t *)(ws + l->pairs);
    uint16_t *abuf = (uint16_t *)(ws + l->a), *sh_a = (uint16_t *)(ws + l->sh_a);
    uint16_t *xp = (uint16_t *)(ws + l->xp);
    const fp4_arch *a = &g->arch;
    int act = a->act == FP4_ACT_SWIGLUOAI;
    cudaError_t err;

    if (m <= DEC_FUSED_ROUTER_MAX_M && H <= FP4_DEC_ROUTE_MAX_H) {
        /* small M: the fp32 logits kernel reads each router row once and one block does top-k
         * and the grouping (two launches). Above 32 tokens the tensor-core router plus the
         * decode prep is faster (H200, tp8 top-8 M=64: prologue 44.5 -> 20.9 us). */
        err = fp4_dec_route_prep(x_bf16, g->router, g->bias, m, H, E, k,
                                 a->scoring == FP4_SCORE_SOFTMAX, a->norm_topk,
                                 a->routed_scaling, (float *)(ws + l->logits), ids, wts,
                                 l->n_slots, tile_expert, row_src, row_dst, row_w, xp, s);
    } else {
        err = fp4_moe_route(x_bf16, g->router_planes, g->bias, m, H, E, k,
                            a->scoring == FP4_SCORE_SOFTMAX, a->norm_topk, a->routed_scaling,
                            ws + l->logits, l->logits_bytes, ids, wts, s);
        if (err != cudaSuccess) return cuda_fail(e, err, "route launch");
        err = fp4_dec_prep(ids, wts, m, k, E, l->n_slots, l->tile_t, tile_expert, row_src,
                           row_dst, row_w, x_bf16, H, xp, s);
    }
    if (err != cudaSuccess) return cuda_fail(e, err, "decode prep launch");
    if (prologue_only) return FP4MOE_OK;
    int active = fp4_dec_active_slots(m, k, E, l->tile_t);
    if (active > l->n_slots) active = l->n_slots;
    /* Two m16 tiles per warp (RT 2) halve the activation re-reads and the FC1 blocks: taken
     * while FC1 keeps 3 blocks per SM with them. H200 (132 SMs), I = 384, whole layer, RT 2
     * against RT 1 (bench/NOTES.md twelfth session): 120 and 216 FC1 blocks (M=1 top-4 /
     * top-8) +11% / +4.7%; 432 (top-8 M=2) -1.7%; 864 -0.5 / +0.9%; top-8 M=8 / 16 -4 / -8%. */
    int rt = (long long)active * ((I / 8 + 1) / 2) >= 3LL * g->n_sm ? 2 : 1;

    fp4_dec_gemm_args p;
    memset(&p, 0, sizeof p);
    p.wfmt = FP4_DEC_W_NVFP4;
    p.act = act, p.limit = a->swiglu_limit, p.alpha = a->swiglu_alpha;
    p.gated = 1, p.n = I, p.k = H, p.n_slots = active, p.tiles_per_warp = rt;
    p.tile_t = l->tile_t;
    p.a = xp, p.a_rows = m, p.tile_expert = tile_expert, p.row_src = row_src;
    p.out_rows = l->n_slots * l->tile_t;
    p.wq = g->w13, p.ws = g->s13, p.gscale = g->g13, p.out = abuf;
    if ((err = fp4_dec_gemm(&p, s)) != cudaSuccess) return cuda_fail(e, err, "decode FC1 launch");
    p.gated = 0, p.n = H, p.k = I;
    p.a = abuf, p.a_rows = l->n_slots * l->tile_t, p.row_src = NULL;
    p.row_dst = row_dst, p.row_w = row_w;
    p.wq = g->w2, p.ws = g->s2, p.gscale = g->g2, p.out = pairs, p.out_bf16 = 1;
    /* FC1 waited for the slot table's writer (and so did the shared FC1 ahead of the
     * one-token FC2, which the shared FC2 lets launch: the table is older than both) */
    p.weights_first = 1;
    const char *what = NULL;
    /* One token: its pairs fill at most k <= 8 slots, the first ones of the table, and every
     * row belongs to it, so each FC2 block sums them itself (a warp per slot) and the combine
     * launch, the bf16 pair rows and their round trip through L2 go away. H200, tp8 shapes,
     * layer: -6.0% top-8, -12.6% top-4 (with the logits kernel's reordered loads, worth 0 /
     * -2.7% alone; bench/NOTES.md sixteenth session). */
    if (m == 1 && k <= 8 && l->tile_t == 8) {
        if (g->has_shared && (err = decode_shared(g, x_bf16, xp, m, y, sh_a, s, &what)) != cudaSuccess)
            return cuda_fail(e, err, what);
        p.one_token = 1, p.accumulate = g->has_shared;
        /* the token's k pairs fill at most k slots of the table: the fewer slots, the more
         * warps share each one's K (dec_ot_split) */
        int slots = l->n_slots < k ? l->n_slots : k;
        p.n_slots = 1, p.a_rows = 8 * (slots < 8 ? slots : 8);
        p.out = y, p.out_bf16 = 0, p.tiles_per_warp = 1;
        if ((err = fp4_dec_gemm(&p, s)) != cudaSuccess)
            return cuda_fail(e, err, "decode FC2 (one token) launch");
        return FP4MOE_OK;
    }
    if ((err = fp4_dec_gemm(&p, s)) != cudaSuccess) return cuda_fail(e, err, "decode FC2 launch");
    if (g->has_shared && (err = decode_shared(g, x_bf16, xp, m, y, sh_a, s, &what)) != cudaSuccess)
        return cuda_fail(e, err, what);
    err = fp4_moe_combine(pairs, m, k, H, g->has_shared, y, s);
    if (err != cudaSuccess) return cuda_fail(e, err, "combine launch");
    return FP4MOE_OK;
}

/* The forward, or only its prologue (routing and grouping: every launch before FC1). */
static fp4moe_status forward_impl(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const void *x_bf16,
                                  int m, float *y, int32_t *topk_ids, float *topk_w,
                                  void *workspace, size_t workspace_bytes, void *stream,
                                  int prologue_only, fp4_err *e)
{
    if (!g || !x_bf16 || (!y && !prologue_only) || m < 1 || !workspace)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT,
                        "GPU MoE forward: NULL pointer or m = %d < 1", m);
    if (kernel < 0 || kernel >= FP4_GPU_K_COUNT)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "GPU MoE forward: unknown kernel id %d",
                        (int)kernel);
    gpu_ws l = ws_layout(g, m, kernel);
    if (workspace_bytes < l.total)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT,
                        "GPU MoE forward: workspace of %zu bytes, %zu needed for %d tokens "
                        "(kernel '%s')", workspace_bytes, l.total, m, fp4_gpu_kernel_name(kernel));
    cudaStream_t s = (cudaStream_t)stream;
    char *ws = workspace;
    int E = g->n_experts, H = g->hidden, I = g->inter, k = g->topk;
    int32_t *ids = topk_ids ? topk_ids : (int32_t *)(ws + l.ids);
    float *wts = topk_w ? topk_w : (float *)(ws + l.w);
    if (kernel == FP4_GPU_K_DECODE)
        return forward_decode(g, x_bf16, m, y, ids, wts, ws, &l, prologue_only, s, e);
    int32_t *tile_expert = (int32_t *)(ws + l.tile_expert);
    int32_t *row_src = (int32_t *)(ws + l.row_src), *row_dst = (int32_t *)(ws + l.row_dst);
    float *row_w = (float *)(ws + l.row_w);
    uint16_t *pairs = (uint16_t *)(ws + l.pairs);
    uint16_t *abuf = (uint16_t *)(ws + l.a), *sh_a = (uint16_t *)(ws + l.sh_a);
    const fp4_arch *a = &g->arch;
    int act = a->act == FP4_ACT_SWIGLUOAI;
    cudaError_t err;

    err = fp4_moe_route(x_bf16, g->router_planes, g->bias, m, H, E, k,
                        a->scoring == FP4_SCORE_SOFTMAX, a->norm_topk, a->routed_scaling,
                        ws + l.logits, l.logits_bytes, ids, wts, s);
    if (err != cudaSuccess) return cuda_fail(e, err, "route launch");
    int wg = kernel == FP4_GPU_K_SM90_WGMMA;
    int32_t *unit_done = wg ? (int32_t *)(ws + l.unit_done) : NULL;
    err = fp4_moe_group(ids, wts, m, k, E, FP4_MMA_TILE_M, l.slot_align, l.n_slots, ws + l.logits,
                        l.logits_bytes, tile_expert, row_src, row_dst, row_w, unit_done, s);
    if (err != cudaSuccess) return cuda_fail(e, err, "group launch");
    if (prologue_only) return FP4MOE_OK;

    fp4_mma_gemm_args p;
    memset(&p, 0, sizeof p);
    p.wfmt = FP4_MMA_W_NVFP4;
    p.act = act, p.limit = a->swiglu_limit, p.alpha = a->swiglu_alpha;
    /* FC1 (gate and up in one tile, activation fused): x rows gathered -> a [padded, I]. */
    p.gated = 1, p.n = I, p.k = H, p.n_tiles_m = l.n_slots;
    p.rows_per_expert = (int)(((long long)m * k + E - 1) / E);
    p.a = x_bf16, p.a_rows = m, p.tile_expert = tile_expert, p.row_src = row_src;
    p.out_rows = l.n_slots * FP4_MMA_TILE_M;
    p.wq = g->w13, p.ws = g->s13, p.gscale = g->g13, p.out = abuf;
    if (wg && !fp4_sm90_wgmma_gemm_serves(&p))
        return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED,
                        "GPU MoE kernel 'sm90-wgmma' cannot run here (H=%d, I=%d): it needs an "
                        "sm_90 GPU and K, N multiples of 64", H, I);
    /* sm90-wgmma: FC2's multiplier (route weight x global scale) on FC1's rows instead (fold),
     * so that FC2's stores multiply nothing. H200, tp8 shapes, layer: bench/NOTES.md
     * forty-third session. */
    p.fold = wg, p.row_w = row_w, p.fold_gscale = g->g2;
    /* sm90-wgmma: FC2's units start as soon as FC1's units that wrote their rows are done
     * (the hand-off, sm90_w4a16_wgmma.cuh), in the SM slots that FC1's last wave leaves */
    p.handoff = unit_done;
    if ((err = wg ? fp4_sm90_wgmma_gemm(&p, s) : fp4_mma_gemm(&p, s)) != cudaSuccess)
        return cuda_fail(e, err, "FC1 launch");
    /* FC2: a [padded, I] -> per-pair rows of [M k, H] in bf16 (half the bytes written and read
     * back by the combine), times global scale and route weight (or, fold, already are). */
    p.gated = 0, p.n = H, p.k = I, p.fold_gscale = NULL;
    p.a = abuf, p.a_rows = l.n_slots * FP4_MMA_TILE_M, p.row_src = NULL;
    p.row_dst = row_dst, p.row_w = row_w;
    p.wq = g->w2, p.ws = g->s2, p.gscale = g->g2, p.out = pairs, p.out_bf16 = 1;
    if ((err = wg ? fp4_sm90_wgmma_gemm(&p, s) : fp4_mma_gemm(&p, s)) != cudaSuccess)
        return cuda_fail(e, err, "FC2 launch");

    if (g->has_shared) { /* shared expert: identity rows, output straight into y */
        int is = g->shared_inter, tiles = (m + FP4_MMA_TILE_M - 1) / FP4_MMA_TILE_M;
        memset(&p, 0, sizeof p);
        p.wfmt = g->shared_fmt;
        p.act = act, p.limit = a->swiglu_limit, p.alpha = a->swiglu_alpha;
        p.gated = 1, p.n = is, p.k = H, p.n_tiles_m = tiles, p.rows_per_expert = m;
        p.a = x_bf16, p.a_rows = m, p.out_rows = m, p.out = sh_a;
        p.wq = g->sh_w13, p.ws = g->sh_s13, p.wb = g->sh_b13, p.gscale = g->sh_g13;
        int swg = wg && fp4_sm90_wgmma_gemm_serves(&p); /* bf16 shared weights: mma.sync */
        if ((err = swg ? fp4_sm90_wgmma_gemm(&p, s) : fp4_mma_gemm(&p, s)) != cudaSuccess)
            return cuda_fail(e, err, "shared FC1 launch");
        p.gated = 0, p.n = H, p.k = is, p.a = sh_a, p.out = y;
        p.wq = g->sh_w2, p.ws = g->sh_s2, p.wb = g->sh_b2, p.gscale = g->sh_g2;
        if ((err = swg ? fp4_sm90_wgmma_gemm(&p, s) : fp4_mma_gemm(&p, s)) != cudaSuccess)
            return cuda_fail(e, err, "shared FC2 launch");
    }
    err = fp4_moe_combine(pairs, m, k, H, g->has_shared, y, s);
    if (err != cudaSuccess) return cuda_fail(e, err, "combine launch");
    return FP4MOE_OK;
}

fp4moe_status fp4_gpu_moe_forward(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const void *x_bf16,
                                  int m, float *y, int32_t *topk_ids, float *topk_w,
                                  void *workspace, size_t workspace_bytes, void *stream, fp4_err *e)
{
    return forward_impl(g, kernel, x_bf16, m, y, topk_ids, topk_w, workspace, workspace_bytes,
                        stream, 0, e);
}

fp4moe_status fp4_gpu_moe_prologue(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const void *x_bf16,
                                   int m, int32_t *topk_ids, float *topk_w, void *workspace,
                                   size_t workspace_bytes, void *stream, fp4_err *e)
{
    return forward_impl(g, kernel, x_bf16, m, NULL, topk_ids, topk_w, workspace,
                        workspace_bytes, stream, 1, e);
}

fp4moe_status fp4_gpu_moe_forward_host(fp4_gpu_moe *g, fp4_gpu_kernel kernel, const float *x,
                                       int m, float *y, int32_t *topk_ids, float *topk_w, fp4_err *e)
{
    if (!g || !x || !y || m < 1)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT,
                        "GPU MoE forward_host: NULL pointer or m = %d < 1", m);
    size_t H = (size_t)g->hidden, pk = (size_t)m * g->topk;
    size_t wsb = fp4_gpu_moe_workspace_size(g, m);
    uint16_t *hx = malloc((size_t)m * H * 2);
    void *dx = NULL, *dy = NULL, *dids = NULL, *dw = NULL, *dws = NULL;
    cudaStream_t s = NULL;
    fp4moe_status st = FP4MOE_OK;
    cudaError_t err;
    if (!hx) return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "GPU MoE forward_host: staging");
    for (size_t i = 0; i < (size_t)m * H; i++) hx[i] = fp4moe_bf16_from_float(x[i]);
    if ((st = dev_alloc(&dx, (size_t)m * H * 2, "x", e)) ||
        (st = dev_alloc(&dy, (size_t)m * H * 4, "y", e)) ||
        (st = dev_alloc(&dids, pk * 4, "top-k ids", e)) ||
        (st = dev_alloc(&dw, pk * 4, "top-k weights", e)) ||
        (st = dev_alloc(&dws, wsb, "workspace", e)))
        goto done;
    if ((err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) {
        st = cuda_fail(e, err, "stream create");
        goto done;
    }
    if ((err = cudaMemcpyAsync(dx, hx, (size_t)m * H * 2, cudaMemcpyHostToDevice, s)) !=
        cudaSuccess) {
        st = cuda_fail(e, err, "x upload");
        goto done;
    }
    if ((st = fp4_gpu_moe_forward(g, kernel, dx, m, dy, dids, dw, dws, wsb, s, e))) goto done;
    if ((err = cudaStreamSynchronize(s)) != cudaSuccess) {
        st = cuda_fail(e, err, "forward");
        goto done;
    }
    if ((err = cudaMemcpy(y, dy, (size_t)m * H * 4, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (topk_ids && (err = cudaMemcpy(topk_ids, dids, pk * 4, cudaMemcpyDeviceToHost))) ||
        (topk_w && (err = cudaMemcpy(topk_w, dw, pk * 4, cudaMemcpyDeviceToHost))))
        st = cuda_fail(e, err, "download");
done:
    if (s) cudaStreamDestroy(s);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dids);
    cudaFree(dw);
    cudaFree(dws);
    free(hx);
    return st;
}

#endif /* FP4MOE_WITH_CUDA */
