/*
 * checkpoint.c - open a Hugging Face model directory (see checkpoint.h). The tensor index
 * comes from model.safetensors.index.json ("weight_map": tensor -> shard file) or, without
 * one, from the header of the single model.safetensors. Entries of layers >= the layer limit
 * are dropped before anything else happens, so their shards are never opened.
 */
#include "checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FP4_JSON_MAX_BYTES (512u << 20)

fp4moe_status fp4_json_load(const char *path, int optional, cJSON **out, fp4_err *e)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT)
            return FP4MOE_OK;
        return fp4_fail(e, FP4MOE_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return fp4_fail(e, FP4MOE_ERR_IO, "'%s' is not a regular file", path);
    }
    if ((unsigned long long)st.st_size > FP4_JSON_MAX_BYTES) {
        fclose(f);
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': %lld bytes, expected at most %u for a JSON file",
                        path, (long long)st.st_size, FP4_JSON_MAX_BYTES);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "'%s': cannot allocate %zu bytes", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return fp4_fail(e, FP4MOE_ERR_IO, "'%s': read %zu of %zu bytes", path, got, n);
    }
    buf[n] = '\0';
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!j) {
        size_t at = end ? (size_t)(end - buf) : 0;
        free(buf);
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': invalid JSON near byte %zu", path, at);
    }
    free(buf);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': expected a JSON object at top level", path);
    }
    *out = j;
    return FP4MOE_OK;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const fp4_ckpt_entry *)a)->name, ((const fp4_ckpt_entry *)b)->name);
}

/* Keep a tensor of the index? Layer tensors only below the limit. */
static int keep_name(const fp4_ckpt *c, const char *name)
{
    int layer = fp4_name_layer_index(name);
    return layer < 0 || layer < c->n_layers;
}

static int shard_index(fp4_ckpt *c, const char *file, fp4_err *e)
{
    for (int i = 0; i < c->n_shards; i++)
        if (strcmp(c->shard_files[i], file) == 0)
            return i;
    if (strchr(file, '/') || strcmp(file, "..") == 0 || file[0] == '\0') {
        fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s/model.safetensors.index.json': shard name '%s' must be a plain file name in the model directory",
                 c->dir, file);
        return -1;
    }
    char **files = realloc(c->shard_files, sizeof(char *) * (size_t)(c->n_shards + 1));
    if (!files) {
        fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory indexing shards");
        return -1;
    }
    c->shard_files = files;
    c->shard_files[c->n_shards] = strdup(file);
    if (!c->shard_files[c->n_shards]) {
        fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory indexing shards");
        return -1;
    }
    return c->n_shards++;
}

static fp4moe_status add_entry(fp4_ckpt *c, const char *name, int shard, size_t *cap, fp4_err *e)
{
    if ((size_t)c->n_entries == *cap) {
        size_t ncap = *cap ? *cap * 2 : 1024;
        fp4_ckpt_entry *ne = realloc(c->entries, ncap * sizeof *ne);
        if (!ne)
            return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory indexing tensors");
        c->entries = ne;
        *cap = ncap;
    }
    c->entries[c->n_entries].name = strdup(name);
    if (!c->entries[c->n_entries].name)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory indexing tensors");
    c->entries[c->n_entries].shard = shard;
    c->n_entries++;
    return FP4MOE_OK;
}

static fp4moe_status load_index(fp4_ckpt *c, fp4_err *e)
{
    char path[4096];
    cJSON *index = NULL;
    size_t cap = 0;
    fp4moe_status st;
    if (!fp4_path_join(path, sizeof path, c->dir, "model.safetensors.index.json"))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "path too long: '%s'", c->dir);
    st = fp4_json_load(path, 1, &index, e);
    if (st != FP4MOE_OK)
        return st;
    if (!index) {
        /* One file: its own header is the index. */
        if (shard_index(c, "model.safetensors", e) < 0)
            return e->status;
        if (!fp4_path_join(path, sizeof path, c->dir, "model.safetensors"))
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "path too long: '%s'", c->dir);
        struct stat sb;
        if (stat(path, &sb) != 0)
            return fp4_fail(e, FP4MOE_ERR_IO,
                            "'%s' has neither model.safetensors.index.json nor model.safetensors",
                            c->dir);
        c->shards = calloc(1, sizeof *c->shards);
        if (!c->shards)
            return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        st = fp4_st_open(path, &c->shards[0], e);
        if (st != FP4MOE_OK)
            return st;
        for (int i = 0; i < c->shards[0]->n_tensors; i++) {
            const char *name = c->shards[0]->tensors[i].name;
            if (keep_name(c, name) && (st = add_entry(c, name, 0, &cap, e)) != FP4MOE_OK)
                return st;
        }
        return FP4MOE_OK;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(index);
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': key 'weight_map': expected an object of tensor -> shard file", path);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, map) {
        if (!cJSON_IsString(it)) {
            fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': weight_map['%s']: expected a shard file name string", path, it->string);
            cJSON_Delete(index);
            return e->status;
        }
        if (!keep_name(c, it->string))
            continue;
        int s = shard_index(c, it->valuestring, e);
        if (s < 0 || (st = add_entry(c, it->string, s, &cap, e)) != FP4MOE_OK) {
            cJSON_Delete(index);
            return e->status;
        }
    }
    cJSON_Delete(index);
    c->shards = calloc((size_t)(c->n_shards ? c->n_shards : 1), sizeof *c->shards);
    if (!c->shards)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    return FP4MOE_OK;
}

fp4moe_status fp4_ckpt_open(const char *dir, int layer_limit, fp4_ckpt **out, fp4_err *e)
{
    char path[4096];
    fp4moe_status st;
    *out = NULL;
    if (layer_limit < 0)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "--layers: expected a non-negative count, found %d", layer_limit);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return fp4_fail(e, FP4MOE_ERR_IO, "'%s' is not a model directory (%s)", dir,
                        errno ? strerror(errno) : "not a directory");
    fp4_ckpt *c = calloc(1, sizeof *c);
    if (!c)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    c->dir = strdup(dir);
    if (!c->dir) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    if (!fp4_path_join(path, sizeof path, dir, "config.json")) {
        st = fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "path too long: '%s'", dir);
        goto fail;
    }
    if ((st = fp4_json_load(path, 0, &c->config, e)) != FP4MOE_OK)
        goto fail;
    if ((st = fp4_arch_parse(c->config, path, &c->arch, e)) != FP4MOE_OK)
        goto fail;
    fp4_path_join(path, sizeof path, dir, "hf_quant_config.json");
    if ((st = fp4_json_load(path, 1, &c->hf_quant, e)) != FP4MOE_OK)
        goto fail;
    if ((st = fp4_quant_parse(c->config, c->hf_quant, dir, &c->quant, e)) != FP4MOE_OK)
        goto fail;
    c->n_layers = c->arch.n_layers;
    if (layer_limit > 0 && layer_limit < c->n_layers)
        c->n_layers = layer_limit;
    if ((st = load_index(c, e)) != FP4MOE_OK)
        goto fail;
    qsort(c->entries, (size_t)c->n_entries, sizeof *c->entries, entry_cmp);
    for (int i = 1; i < c->n_entries; i++)
        if (strcmp(c->entries[i - 1].name, c->entries[i].name) == 0) {
            st = fp4_fail(e, FP4MOE_ERR_FORMAT, "'%s': tensor '%s' is listed twice", dir, c->entries[i].name);
            goto fail;
        }
    *out = c;
    return FP4MOE_OK;
fail:
    fp4_ckpt_close(c);
    return st;
}

void fp4_ckpt_close(fp4_ckpt *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_shards; i++) {
        if (c->shards)
            fp4_st_close(c->shards[i]);
        free(c->shard_files[i]);
    }
    free(c->shards);
    free(c->shard_files);
    for (int i = 0; i < c->n_entries; i++)
        free(c->entries[i].name);
    free(c->entries);
    fp4_quant_destroy(c->quant);
    cJSON_Delete(c->config);
    cJSON_Delete(c->hf_quant);
    free(c->dir);
    free(c);
}

int fp4_ckpt_find(const fp4_ckpt *c, const char *name)
{
    int lo = 0, hi = c->n_entries - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int r = strcmp(c->entries[mid].name, name);
        if (r == 0)
            return mid;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static fp4moe_status open_shard(fp4_ckpt *c, int s, fp4_err *e)
{
    char path[4096];
    if (c->shards[s])
        return FP4MOE_OK;
    if (!fp4_path_join(path, sizeof path, c->dir, c->shard_files[s]))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "path too long: '%s'", c->dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return fp4_fail(e, FP4MOE_ERR_IO,
                        "shard '%s' named in '%s/model.safetensors.index.json' is missing (%s)",
                        path, c->dir, strerror(errno));
    return fp4_st_open(path, &c->shards[s], e);
}

fp4moe_status fp4_ckpt_get(fp4_ckpt *c, const char *name, const fp4_st_tensor **out, fp4_err *e)
{
    *out = NULL;
    int i = fp4_ckpt_find(c, name);
    if (i < 0)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s' is expected by config.json but missing from '%s'",
                        name, c->dir);
    int s = c->entries[i].shard;
    fp4moe_status st = open_shard(c, s, e);
    if (st != FP4MOE_OK)
        return st;
    const fp4_st_tensor *t = fp4_st_find(c->shards[s], name);
    if (!t)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "tensor '%s': the index puts it in '%s/%s', which does not hold it",
                        name, c->dir, c->shard_files[s]);
    *out = t;
    return FP4MOE_OK;
}

fp4moe_status fp4_ckpt_open_all(fp4_ckpt *c, fp4_err *e)
{
    for (int i = 0; i < c->n_entries; i++) {
        fp4moe_status st = open_shard(c, c->entries[i].shard, e);
        if (st != FP4MOE_OK)
            return st;
    }
    return FP4MOE_OK;
}

int fp4_ckpt_shards_opened(const fp4_ckpt *c)
{
    int n = 0;
    for (int i = 0; i < c->n_shards; i++)
        n += c->shards[i] != NULL;
    return n;
}
