/*
 * checkpoint.h - a Hugging Face model directory: config.json, optional hf_quant_config.json,
 * one model.safetensors or shards named by model.safetensors.index.json. Shards are opened
 * lazily, on the first lookup of a tensor they hold, so a layer limit never touches the shards
 * that hold only later layers.
 */
#ifndef FP4MOE_CHECKPOINT_H
#define FP4MOE_CHECKPOINT_H

#include <cjson/cJSON.h>

#include "common.h"
#include "model_config.h"
#include "quant_scheme.h"
#include "safetensors.h"

typedef struct fp4_ckpt_entry {
    char *name;   /* full tensor name as stored */
    int shard;    /* index into shard_files */
} fp4_ckpt_entry;

typedef struct fp4_ckpt {
    char *dir;
    cJSON *config;            /* config.json */
    cJSON *hf_quant;          /* hf_quant_config.json or NULL */
    fp4_arch arch;
    fp4_quant *quant;
    int n_layers;             /* layers in use: min(arch.n_layers, layer limit) */
    int n_shards;
    char **shard_files;       /* file names relative to dir */
    fp4_st_file **shards;     /* NULL until opened */
    int n_entries;
    fp4_ckpt_entry *entries;  /* sorted by name; only tensors of layers < n_layers + others */
} fp4_ckpt;

/* Read and parse a JSON file (size-capped). *out NULL with FP4MOE_OK when optional and absent. */
fp4moe_status fp4_json_load(const char *path, int optional, cJSON **out, fp4_err *e);

/* layer_limit 0: all layers. */
fp4moe_status fp4_ckpt_open(const char *dir, int layer_limit, fp4_ckpt **out, fp4_err *e);
void fp4_ckpt_close(fp4_ckpt *c);

/* Index of a tensor name in entries, or -1. */
int fp4_ckpt_find(const fp4_ckpt *c, const char *name);
/* The tensor (opening its shard if needed). A name the files lack is a FORMAT error. */
fp4moe_status fp4_ckpt_get(fp4_ckpt *c, const char *name, const fp4_st_tensor **out,
                           fp4_err *e);
/* Open every shard holding a tensor in entries (for inspect --verify and tensor listings). */
fp4moe_status fp4_ckpt_open_all(fp4_ckpt *c, fp4_err *e);
int fp4_ckpt_shards_opened(const fp4_ckpt *c);

#endif /* FP4MOE_CHECKPOINT_H */
