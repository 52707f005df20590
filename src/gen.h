/*
 * gen.h - `fp4moe gen`: write a random model directory in the real on-disk formats
 * (ModelOpt, compressed-tensors, MiniMax-M3.1), sharded, with a matching config. Tensors are
 * generated and written one at a time (an NVFP4 linear is quantized whole, everything else
 * streams in row chunks), so the full-size preset never holds a layer in memory twice. The
 * directory is built under "<DIR>.partial-<pid>" and renamed into place only when complete.
 */
#ifndef FP4MOE_GEN_H
#define FP4MOE_GEN_H

#include <stdint.h>

#include "common.h"
#include "quant_scheme.h"

typedef struct fp4_preset {
    const char *name;
    int hidden, n_layers, first_dense, dense_inter;
    int n_experts, moe_inter, shared_inter, topk;
    int heads, kv_heads, head_dim, index_heads, vocab;
} fp4_preset;

const fp4_preset *fp4_preset_find(const char *name);
const char *fp4_preset_names(void); /* "tiny, minimax-m3.1-flash-tp8, minimax-m3.1-flash" */

typedef struct fp4_gen_options {
    const char *dir;
    const char *preset;
    int layers;              /* 0: the preset's count */
    uint64_t seed;
    fp4_ascheme act;         /* routed experts' FC1 scheme (per-token is FC1 only) */
    fp4_qformat format;      /* modelopt, compressed-tensors, minimax-m31 */
    uint64_t shard_size;     /* bytes; 0: 5 GB */
    int topk;                /* 0: the preset's */
    void (*progress)(void *ctx, int shards_done, int shards_total); /* optional */
    void *progress_ctx;
} fp4_gen_options;

fp4moe_status fp4_gen(const fp4_gen_options *o, fp4_err *e);

#endif /* FP4MOE_GEN_H */
