/*
 * st_dump.c - test helper for tests/py/test_safetensors_interop.py.
 *
 *   st_dump FILE        open FILE with fp4_st_open; print one line per tensor, in name order:
 *                         NAME DTYPE [d0,d1,...] NBYTES FNV1A64
 *                       (FNV1A64: 16 lowercase hex digits of the 64-bit FNV-1a hash of the
 *                       tensor's bytes), then one line per metadata entry, in file order:
 *                         meta: KEY = VALUE
 *                       On failure print the error message to stderr and exit 1.
 *   st_dump --write OUT write the fixed set below through fp4_st_writer_*; exit 1 on failure.
 *
 * The --write pattern: tensor number t (0-based, in the order of the table below, which is
 * also the data order) has byte i = (i * 131 + t * 29 + 7) mod 256, except BOOL tensors,
 * whose byte i is that value & 1. Metadata: {"format": "fp4moe-test", "pattern":
 * "(i*131+t*29+7)%256"}. The bytes are put in chunks of 1, 2, 3, ... 97 bytes, then repeating,
 * so chunks span tensor boundaries.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static uint64_t fnv1a64(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int dump(const char *path)
{
    fp4_err e;
    fp4_st_file *f = NULL;
    fp4_err_clear(&e);
    if (fp4_st_open(path, &f, &e) != FP4MOE_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    for (int i = 0; i < f->n_tensors; i++) {
        const fp4_st_tensor *t = &f->tensors[i];
        printf("%s %s [", t->name, fp4_dtype_name(t->dtype));
        for (int k = 0; k < t->ndim; k++)
            printf("%s%lld", k ? "," : "", (long long)t->shape[k]);
        printf("] %zu %016llx\n", t->nbytes, (unsigned long long)fnv1a64(t->data, t->nbytes));
    }
    for (int i = 0; i < f->n_meta; i++)
        printf("meta: %s = %s\n", f->meta_keys[i], f->meta_vals[i]);
    fp4_st_close(f);
    return 0;
}

static const fp4_st_desc k_set[] = {
    {"t00.bool", FP4_DT_BOOL, 1, {13}},
    {"t01.u8", FP4_DT_U8, 2, {3, 5}},
    {"t02.i8", FP4_DT_I8, 1, {17}},
    {"t03.u16", FP4_DT_U16, 2, {2, 3}},
    {"t04.i16", FP4_DT_I16, 3, {2, 1, 3}},
    {"t05.u32", FP4_DT_U32, 1, {7}},
    {"t06.i32", FP4_DT_I32, 2, {4, 2}},
    {"t07.u64", FP4_DT_U64, 1, {3}},
    {"t08.i64", FP4_DT_I64, 2, {1, 5}},
    {"t09.f8_e4m3", FP4_DT_F8_E4M3, 2, {4, 16}},
    {"t10.f8_e5m2", FP4_DT_F8_E5M2, 1, {33}},
    {"t11.f8_e8m0", FP4_DT_F8_E8M0, 2, {4, 2}},
    {"t12.bf16", FP4_DT_BF16, 2, {8, 3}},
    {"t13.f16", FP4_DT_F16, 1, {11}},
    {"t14.f32", FP4_DT_F32, 3, {2, 3, 4}},
    {"t15.f64", FP4_DT_F64, 1, {6}},
    {"t16.scalar_f32", FP4_DT_F32, 0, {0}},
    {"t17.empty_bf16", FP4_DT_BF16, 2, {0, 4}},
    {"t18.u8_big", FP4_DT_U8, 2, {300, 1000}},
};

static int write_set(const char *out)
{
    const int n = (int)(sizeof k_set / sizeof k_set[0]);
    const char *meta[] = {"format", "fp4moe-test", "pattern", "(i*131+t*29+7)%256"};
    size_t total = 0;
    for (int t = 0; t < n; t++) {
        size_t ne = 1;
        for (int k = 0; k < k_set[t].ndim; k++)
            ne *= (size_t)k_set[t].shape[k];
        total += ne * fp4_dtype_size(k_set[t].dtype);
    }
    uint8_t *all = malloc(total + 1);
    if (!all) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    size_t pos = 0;
    for (int t = 0; t < n; t++) {
        size_t ne = 1;
        for (int k = 0; k < k_set[t].ndim; k++)
            ne *= (size_t)k_set[t].shape[k];
        size_t nb = ne * fp4_dtype_size(k_set[t].dtype);
        for (size_t i = 0; i < nb; i++) {
            uint8_t v = (uint8_t)((i * 131 + (size_t)t * 29 + 7) % 256);
            all[pos + i] = k_set[t].dtype == FP4_DT_BOOL ? (v & 1) : v;
        }
        pos += nb;
    }
    fp4_err e;
    fp4_st_writer *w = NULL;
    fp4_err_clear(&e);
    fp4moe_status st = fp4_st_writer_begin(out, k_set, n, meta, 2, &w, &e);
    for (size_t p = 0, c = 1; st == FP4MOE_OK && p < total; c = c % 97 + 1) {
        size_t k = c < total - p ? c : total - p;
        st = fp4_st_writer_put(w, all + p, k, &e);
        p += k;
    }
    if (st == FP4MOE_OK)
        st = fp4_st_writer_finish(w, &e);
    else if (w)
        fp4_st_writer_abort(w);
    free(all);
    if (st != FP4MOE_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--write") != 0)
        return dump(argv[1]);
    if (argc == 3 && strcmp(argv[1], "--write") == 0)
        return write_set(argv[2]);
    fprintf(stderr, "usage: st_dump FILE | st_dump --write OUT\n");
    return 2;
}
