/*
 * safetensors.h - strict reader (mmap, read-only) and streaming atomic writer of the
 * safetensors format: 8-byte little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}},
 * then the byte buffer that the offsets index (relative to the end of the header).
 */
#ifndef FP4MOE_SAFETENSORS_H
#define FP4MOE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define FP4_ST_MAX_HEADER (100u * 1024u * 1024u) /* header length cap, as upstream safetensors */
#define FP4_ST_MAX_DIMS 8

typedef enum fp4_dtype {
    FP4_DT_INVALID = 0,
    FP4_DT_BOOL, FP4_DT_U8, FP4_DT_I8, FP4_DT_U16, FP4_DT_I16, FP4_DT_U32, FP4_DT_I32,
    FP4_DT_U64, FP4_DT_I64, FP4_DT_F8_E4M3, FP4_DT_F8_E5M2, FP4_DT_F8_E8M0, FP4_DT_BF16,
    FP4_DT_F16, FP4_DT_F32, FP4_DT_F64
} fp4_dtype;

const char *fp4_dtype_name(fp4_dtype dt);       /* "U8", "F8_E4M3", ... */
fp4_dtype fp4_dtype_parse(const char *name);    /* FP4_DT_INVALID when unknown */
size_t fp4_dtype_size(fp4_dtype dt);            /* bytes per element */

typedef struct fp4_st_tensor {
    char *name;
    fp4_dtype dtype;
    int ndim;
    int64_t shape[FP4_ST_MAX_DIMS];
    size_t numel;
    const uint8_t *data;  /* into the read-only mapping */
    size_t nbytes;
} fp4_st_tensor;

typedef struct fp4_st_file {
    char *path;
    void *map;            /* whole file, PROT_READ */
    size_t size;
    int n_tensors;
    fp4_st_tensor *tensors;  /* sorted by name */
    int n_meta;
    char **meta_keys, **meta_vals; /* __metadata__ */
} fp4_st_file;

/* Open and validate everything (see safetensors.c). Never writes to or locks the file. */
fp4moe_status fp4_st_open(const char *path, fp4_st_file **out, fp4_err *e);
void fp4_st_close(fp4_st_file *f);
const fp4_st_tensor *fp4_st_find(const fp4_st_file *f, const char *name);

/* Streaming writer: the header is written from the descriptions first, then the tensors'
 * bytes in description order through any number of fp4_st_writer_put calls. The file is
 * written as "<path>.tmp" and renamed on finish; abort removes it. */
typedef struct fp4_st_desc {
    const char *name;
    fp4_dtype dtype;
    int ndim;
    int64_t shape[FP4_ST_MAX_DIMS];
} fp4_st_desc;

typedef struct fp4_st_writer fp4_st_writer;
fp4moe_status fp4_st_writer_begin(const char *path, const fp4_st_desc *descs, int n,
                                  const char *const *meta_kv, int n_meta, fp4_st_writer **out,
                                  fp4_err *e);
fp4moe_status fp4_st_writer_put(fp4_st_writer *w, const void *bytes, size_t n, fp4_err *e);
fp4moe_status fp4_st_writer_finish(fp4_st_writer *w, fp4_err *e); /* frees w */
void fp4_st_writer_abort(fp4_st_writer *w);                        /* frees w */

#endif /* FP4MOE_SAFETENSORS_H */
