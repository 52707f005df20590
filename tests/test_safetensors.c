/*
 * test_safetensors.c - the safetensors reader and writer (src/safetensors.c).
 *
 * Every malformed case is a small hand-built file under a fresh temp dir; each check asserts
 * the status code and that the message names the file and the key facts (expected vs found).
 * Every open is also checked not to modify the file (bytes, size, mode and mtime unchanged).
 * The writer is checked by round trips (exact header bytes for a small case, chunked puts that
 * span tensors and the 8 MiB buffer) and by its failure paths (short, over-long, abort, bad
 * descriptions). Interop with the python `safetensors` package is in
 * tests/py/test_safetensors_interop.py.
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

#include "check.h"

static char g_dir[256];


static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", g_dir, name);
}

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, fp);
    fclose(fp);
    return b;
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(b, 1, n, fp) != n) {
        printf("FAIL: cannot write %s\n", path);
        exit(2);
    }
    fclose(fp);
}

/* A file: 8-byte length hlen (the JSON's own length when hlen is -1), the JSON, then
 * data_len data bytes (i*7+1 mod 256). */
static void make_st(const char *path, const char *json, size_t json_len, long long hlen,
                    size_t data_len)
{
    size_t n = 8 + json_len + data_len;
    unsigned char *b = malloc(n + 1);
    unsigned long long h = hlen < 0 ? (unsigned long long)json_len : (unsigned long long)hlen;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(h >> (8 * i));
    memcpy(b + 8, json, json_len);
    for (size_t i = 0; i < data_len; i++)
        b[8 + json_len + i] = (unsigned char)(i * 7 + 1);
    write_bytes(path, b, n);
    free(b);
}

/* Open path and check that it leaves the file exactly as it was. Returns the status. */
static fp4moe_status open_checked(const char *path, fp4_st_file **out, fp4_err *e)
{
    struct stat s0, s1;
    size_t n0 = 0, n1 = 0;
    int had = stat(path, &s0) == 0 && S_ISREG(s0.st_mode);
    unsigned char *b0 = had ? read_all(path, &n0) : NULL;
    fp4_err_clear(e);
    fp4moe_status st = fp4_st_open(path, out, e);
    if (st == FP4MOE_OK) { /* touch every mapped byte */
        unsigned sum = 0;
        for (int i = 0; i < (*out)->n_tensors; i++)
            for (size_t k = 0; k < (*out)->tensors[i].nbytes; k++)
                sum += (*out)->tensors[i].data[k];
        (void)sum;
    }
    if (had) {
        CHECK(stat(path, &s1) == 0, "%s vanished after open", path);
        unsigned char *b1 = read_all(path, &n1);
        CHECK(s1.st_size == s0.st_size && s1.st_mode == s0.st_mode &&
                  s1.st_mtim.tv_sec == s0.st_mtim.tv_sec && s1.st_mtim.tv_nsec == s0.st_mtim.tv_nsec,
              "%s: stat changed by open", path);
        CHECK(n0 == n1 && b1 && memcmp(b0, b1, n0) == 0, "%s: bytes changed by open", path);
        free(b1);
    }
    free(b0);
    return st;
}

/* Build a file from json (hlen -1 = its length) + data, open it, expect status st and a
 * message holding the file path and every one of the NULL-terminated substrings. */
static void expect_fail(const char *name, const char *json, size_t json_len, long long hlen,
                        size_t data_len, fp4moe_status want, ...)
{
    char path[512];
    path_of(path, sizeof path, name);
    make_st(path, json, json_len, hlen, data_len);
    fp4_st_file *f = (fp4_st_file *)1;
    fp4_err e;
    fp4moe_status st = open_checked(path, &f, &e);
    CHECK(st == want, "case %s: status %d, expected %d (msg: %s)", name, st, want, e.msg);
    CHECK(f == NULL, "case %s: out not NULL on failure", name);
    char quoted[600];
    snprintf(quoted, sizeof quoted, "file '%s'", path);
    CHECK(strstr(e.msg, quoted) != NULL, "case %s: message lacks %s: %s", name, quoted, e.msg);
    va_list ap;
    va_start(ap, want);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        CHECK(strstr(e.msg, s) != NULL, "case %s: message lacks \"%s\": %s", name, s, e.msg);
    va_end(ap);
    if (st == FP4MOE_OK)
        fp4_st_close(f);
}

#define BAD(name, json, data_len, ...) \
    expect_fail(name, json, strlen(json), -1, data_len, FP4MOE_ERR_FORMAT, __VA_ARGS__, (char *)NULL)
#define T8(name, off) "\"" name "\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":" off "}"

static void test_malformed(void)
{
    char big[64];
    /* lengths and framing */
    {
        char path[512];
        fp4_st_file *f = NULL;
        fp4_err e;
        path_of(path, sizeof path, "short3");
        write_bytes(path, "\x02\0\0", 3);
        CHECK(open_checked(path, &f, &e) == FP4MOE_ERR_FORMAT && strstr(e.msg, path) &&
                  strstr(e.msg, "3 bytes") && strstr(e.msg, "shorter than the 8-byte"),
              "3-byte file: %s", e.msg);
        path_of(path, sizeof path, "empty");
        write_bytes(path, "", 0);
        CHECK(open_checked(path, &f, &e) == FP4MOE_ERR_FORMAT && strstr(e.msg, path) &&
                  strstr(e.msg, "0 bytes"),
              "empty file: %s", e.msg);
        path_of(path, sizeof path, "does-not-exist");
        CHECK(open_checked(path, &f, &e) == FP4MOE_ERR_IO && strstr(e.msg, path) &&
                  strstr(e.msg, "No such file"),
              "missing file: %s", e.msg);
        CHECK(open_checked(g_dir, &f, &e) == FP4MOE_ERR_IO && strstr(e.msg, g_dir),
              "directory: %s", e.msg);
    }
    expect_fail("hlen0", "", 0, 0, 4, FP4MOE_ERR_FORMAT, "header length is 0", (char *)NULL);
    snprintf(big, sizeof big, "header length %u exceeds the limit of %u", FP4_ST_MAX_HEADER + 1,
             FP4_ST_MAX_HEADER);
    expect_fail("hlen_big", "{}", 2, FP4_ST_MAX_HEADER + 1LL, 0, FP4MOE_ERR_FORMAT, big,
                (char *)NULL);
    expect_fail("hlen_past", "{}", 2, 100, 0, FP4MOE_ERR_FORMAT,
                "header length 100 runs past the end of the file (10 bytes, so at most 2",
                (char *)NULL);

    /* JSON level */
    BAD("badjson", "{\"a\": {\"dtype\": ", 0, "not valid JSON");
    BAD("array", "[1, 2]", 0, "must start with '{'", "0x5b");
    BAD("leading_ws", " {}", 0, "must start with '{'", "0x20");
    BAD("utf8", "{\"a\xff\":{}}", 0, "not valid UTF-8 at byte 3", "0xff");
    BAD("overlong", "{\"a\xc0\xaf\":{}}", 0, "not valid UTF-8 at byte 3");
    BAD("ctrl", "{\x01}", 0, "control byte 0x01 at byte 1");
    BAD("trailing", "{} {}", 0, "trailing byte 0x7b at byte 3");
    expect_fail("nul_pad", "{}\0\0\0\0\0\0", 8, -1, 0, FP4MOE_ERR_FORMAT, "control byte 0x00",
                (char *)NULL);

    /* entry level */
    BAD("entry_num", "{\"w\":3}", 0, "tensor 'w'", "expected an object", "found a number");
    BAD("no_dtype", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "tensor 'w'",
        "\"dtype\": expected a string, found nothing (key missing)");
    BAD("dtype_num", "{\"w\":{\"dtype\":1,\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
        "\"dtype\": expected a string, found a number");
    BAD("dtype_unknown", "{\"w\":{\"dtype\":\"u8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
        "tensor 'w'", "unknown dtype \"u8\"", "known: BOOL, U8", "F8_E4M3", "F8_E8M0", "F64)");
    BAD("dtype_f4", "{\"w\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1,
        "unknown dtype \"F4\"");
    BAD("no_shape", "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,2]}}", 2,
        "\"shape\": expected an array", "found nothing");
    BAD("shape_str", "{\"w\":{\"dtype\":\"U8\",\"shape\":\"2\",\"data_offsets\":[0,2]}}", 2,
        "\"shape\": expected an array", "found a string");
    BAD("shape_neg", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2,-2],\"data_offsets\":[0,2]}}", 2,
        "tensor 'w'", "\"shape\"[1]", "non-negative integer", "found -2");
    BAD("shape_frac", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,2]}}", 2,
        "\"shape\"[0]", "found 2.5");
    BAD("shape_elem_str", "{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2,
        "\"shape\"[0]", "found a string");
    BAD("shape_2p53", "{\"w\":{\"dtype\":\"U8\",\"shape\":[9007199254740992],\"data_offsets\":[0,2]}}",
        2, "below 2^53", "found 9007199254740992");
    BAD("shape_9dims",
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
        "tensor 'w'", "9 dims, at most 8");
    BAD("numel_overflow",
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,2]}}", 2,
        "tensor 'w'", "[4294967296, 4294967296, 16]", "overflows");
    BAD("bytes_overflow",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,2048],\"data_offsets\":[0,2]}}", 2,
        "x 4 bytes (F32) overflows");
    BAD("no_offsets", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2,
        "\"data_offsets\": expected [begin, end]", "found nothing");
    BAD("offsets3", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,2]}}", 2,
        "\"data_offsets\"", "another length");
    BAD("offsets_neg", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-1,-1]}}", 0,
        "\"data_offsets\"", "negative");
    BAD("offsets_obj", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":{}}}", 2,
        "\"data_offsets\"", "found an object");
    BAD("begin_gt_end", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,0]}}", 2,
        "tensor 'w'", "[2, 0]", "begin is after end");
    BAD("end_past", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2,
        "tensor 'w'", "[0, 4] end past the data buffer of 2 bytes");
    {
        const char *j = "{\"model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[128,256],"
                        "\"data_offsets\":[0,65534]}}";
        char want[700], path[512];
        path_of(path, sizeof path, "size_mismatch");
        snprintf(want, sizeof want,
                 "file '%s': tensor 'model.layers.0.mlp.gate_proj.weight': shape [128, 256] x 2 bytes "
                 "(BF16) = 65536 bytes, but data_offsets span 65534 bytes", path);
        make_st(path, j, strlen(j), -1, 65534);
        fp4_st_file *f = NULL;
        fp4_err e;
        CHECK(open_checked(path, &f, &e) == FP4MOE_ERR_FORMAT && strcmp(e.msg, want) == 0,
              "size mismatch message:\n  got  %s\n  want %s", e.msg, want);
    }

    /* layout of the data buffer */
    BAD("overlap", "{" T8("a", "[0,2]") "," T8("b", "[1,3]") "}", 3, "tensor 'b'",
        "[1, 3] overlap tensor 'a', which ends at 2");
    BAD("overlap_zero", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
        "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}", 4,
        "tensor 'z'", "overlap tensor 'a'");
    BAD("same_range", "{" T8("a", "[0,2]") "," T8("b", "[0,2]") "}", 2, "overlap tensor 'a'");
    BAD("gap", "{" T8("a", "[0,2]") "," T8("b", "[4,6]") "}", 6, "tensor 'b'",
        "gap of 2 unused bytes after tensor 'a' (expected begin 2");
    BAD("lead_gap", "{" T8("a", "[2,4]") "}", 4, "tensor 'a'",
        "gap of 2 unused bytes after the start of the data buffer");
    BAD("trailing_data", "{" T8("a", "[0,2]") "}", 5,
        "holds 5 bytes but the tensors cover only 2", "'a'", "3 trailing bytes");
    BAD("no_tensors_data", "{}", 3, "no tensors, but 3 data bytes");
    BAD("dup", "{" T8("a", "[0,2]") "," T8("a", "[2,4]") "}", 4, "tensor 'a' appears twice");

    /* __metadata__ */
    BAD("meta_num", "{\"__metadata__\":3}", 0, "\"__metadata__\": expected an object of strings",
        "found a number");
    BAD("meta_val", "{\"__metadata__\":{\"k\":\"v\",\"n\":1}}", 0, "\"__metadata__\" key 'n'",
        "expected a string value, found a number");
    BAD("meta_dup_key", "{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, "key 'k' appears twice");
    BAD("meta_twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "\"__metadata__\" appears twice");
}

static void test_valid_read(void)
{
    char path[512];
    fp4_err e;
    fp4_st_file *f = NULL;
    /* zero-size tensors anywhere, a scalar, unknown entry keys, metadata, space/newline padding */
    const char *j = "{\"__metadata__\":{\"format\":\"pt\",\"q\\\"\":\"\\u00e9\\n\"},"
                    "\"z0\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[4,12],\"x\":1},"
                    "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                    "\"z1\":{\"dtype\":\"I64\",\"shape\":[5,0],\"data_offsets\":[12,12]},"
                    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[12,13]}} \n ";
    path_of(path, sizeof path, "valid");
    make_st(path, j, strlen(j), -1, 13);
    fp4moe_status st = open_checked(path, &f, &e);
    CHECK(st == FP4MOE_OK, "valid file: %s", e.msg);
    if (st != FP4MOE_OK)
        return;
    const uint8_t *data = (const uint8_t *)f->map + 8 + strlen(j);
    CHECK(f->n_tensors == 5, "n_tensors %d", f->n_tensors);
    const char *order[] = {"a", "b", "s", "z0", "z1"};
    for (int i = 0; i < 5 && i < f->n_tensors; i++)
        CHECK(strcmp(f->tensors[i].name, order[i]) == 0, "tensor %d is '%s', expected '%s'", i,
              f->tensors[i].name, order[i]);
    const fp4_st_tensor *t = fp4_st_find(f, "b");
    CHECK(t && t->dtype == FP4_DT_BF16 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 2 &&
              t->numel == 4 && t->nbytes == 8 && t->data == data + 4,
          "tensor b wrong");
    t = fp4_st_find(f, "s");
    CHECK(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 4 && t->data == data, "scalar s wrong");
    t = fp4_st_find(f, "z1");
    CHECK(t && t->ndim == 2 && t->numel == 0 && t->nbytes == 0 && t->dtype == FP4_DT_I64, "z1 wrong");
    t = fp4_st_find(f, "a");
    CHECK(t && t->data == data + 12 && t->data[0] == (uint8_t)(12 * 7 + 1), "a wrong");
    CHECK(fp4_st_find(f, "c") == NULL && fp4_st_find(f, "") == NULL && fp4_st_find(f, "z") == NULL,
          "find of missing names");
    CHECK(f->n_meta == 2 && strcmp(f->meta_keys[0], "format") == 0 &&
              strcmp(f->meta_vals[0], "pt") == 0 && strcmp(f->meta_keys[1], "q\"") == 0 &&
              strcmp(f->meta_vals[1], "\xc3\xa9\n") == 0,
          "metadata wrong");
    fp4_st_close(f);

    /* empty header object, null metadata */
    path_of(path, sizeof path, "empty_obj");
    make_st(path, "{}      ", 8, -1, 0);
    CHECK(open_checked(path, &f, &e) == FP4MOE_OK && f->n_tensors == 0 && f->n_meta == 0,
          "empty object: %s", e.msg);
    fp4_st_close(f);
    path_of(path, sizeof path, "meta_null");
    make_st(path, "{\"__metadata__\":null," T8("a", "[0,2]") "}", strlen("{\"__metadata__\":null," T8("a", "[0,2]") "}"), -1, 2);
    CHECK(open_checked(path, &f, &e) == FP4MOE_OK && f->n_tensors == 1 && f->n_meta == 0,
          "null metadata: %s", e.msg);
    fp4_st_close(f);

    /* dtype table */
    const char *names[] = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F8_E4M3",
                           "F8_E5M2", "F8_E8M0", "BF16", "F16", "F32", "F64"};
    const size_t sizes[] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 1, 1, 1, 2, 2, 4, 8};
    for (int i = 0; i < 16; i++) {
        fp4_dtype dt = fp4_dtype_parse(names[i]);
        CHECK(dt != FP4_DT_INVALID && strcmp(fp4_dtype_name(dt), names[i]) == 0 &&
                  fp4_dtype_size(dt) == sizes[i],
              "dtype %s: parse %d size %zu", names[i], (int)dt, fp4_dtype_size(dt));
    }
    CHECK(fp4_dtype_parse("bf16") == FP4_DT_INVALID && fp4_dtype_parse("") == FP4_DT_INVALID &&
              fp4_dtype_size(FP4_DT_INVALID) == 0,
          "invalid dtype names");
}

static int file_exists(const char *p)
{
    struct stat s;
    return stat(p, &s) == 0;
}

static void test_writer(void)
{
    char path[512], tmp[520];
    fp4_err e;
    fp4_st_writer *w = NULL;
    fp4_st_file *f = NULL;

    /* exact bytes for a small case: what upstream's serializer writes for the same layout */
    path_of(path, sizeof path, "w_small.safetensors");
    fp4_st_desc d2[] = {{"a", FP4_DT_F32, 1, {5}}, {"b", FP4_DT_U8, 1, {3}}};
    const char *kv[] = {"k", "v"};
    CHECK(fp4_st_writer_begin(path, d2, 2, kv, 1, &w, &e) == FP4MOE_OK, "begin: %s", e.msg);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(file_exists(tmp) && !file_exists(path), "tmp file during writing");
    unsigned char data[23];
    for (int i = 0; i < 23; i++)
        data[i] = (unsigned char)(200 + i);
    CHECK(fp4_st_writer_put(w, data, 23, &e) == FP4MOE_OK, "put: %s", e.msg);
    CHECK(fp4_st_writer_finish(w, &e) == FP4MOE_OK, "finish: %s", e.msg);
    CHECK(!file_exists(tmp) && file_exists(path), "tmp renamed");
    const char *want = "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":[5],"
                       "\"data_offsets\":[0,20]},\"b\":{\"dtype\":\"U8\",\"shape\":[3],"
                       "\"data_offsets\":[20,23]}}  ";
    size_t n = 0;
    unsigned char *b = read_all(path, &n);
    CHECK(n == 8 + 136 + 23 && b[0] == 136 && b[1] == 0 && memcmp(b + 8, want, 136) == 0 &&
              memcmp(b + 144, data, 23) == 0,
          "exact bytes: n %zu, header %.*s", n, (int)(n > 8 ? b[0] : 0), (const char *)b + 8);
    free(b);

    /* round trip: every dtype, scalar, zero-size, escaped names and metadata, a tensor larger
     * than the writer's buffer, puts of odd sizes that span tensors */
    path_of(path, sizeof path, "w_round.safetensors");
    enum { ND = 19 };
    fp4_st_desc d[ND];
    char names[ND][32];
    for (int i = 0; i < ND; i++) {
        memset(&d[i], 0, sizeof d[i]);
        d[i].dtype = (fp4_dtype)(1 + i % 16);
        d[i].ndim = 1 + i % 3;
        for (int k = 0; k < d[i].ndim; k++)
            d[i].shape[k] = 1 + (i * 5 + k * 3) % 7;
        snprintf(names[i], sizeof names[i], "layer.%d.w\"\\\x01\xc3\xa9", i);
        d[i].name = names[i];
    }
    d[16].ndim = 0;                         /* scalar */
    d[17].ndim = 2, d[17].shape[1] = 0;     /* zero-size */
    d[18].dtype = FP4_DT_U8, d[18].ndim = 2, d[18].shape[0] = 3 << 20, d[18].shape[1] = 3; /* 9 MiB */
    const char *meta[] = {"format", "np", "quote\"key", "line\nbreak\t\xe2\x82\xac"};
    CHECK(fp4_st_writer_begin(path, d, ND, meta, 2, &w, &e) == FP4MOE_OK, "begin: %s", e.msg);
    size_t total = 0;
    for (int i = 0; i < ND; i++) {
        size_t ne = 1;
        for (int k = 0; k < d[i].ndim; k++)
            ne *= (size_t)d[i].shape[k];
        total += ne * fp4_dtype_size(d[i].dtype);
    }
    unsigned char *all = malloc(total);
    for (size_t i = 0; i < total; i++)
        all[i] = (unsigned char)((i * 2654435761u) >> 13);
    const size_t chunks[] = {1, 7, 0, 64, 3, 1 << 20, 5 << 20, 10 << 20};
    size_t pos = 0;
    for (int c = 0; pos < total; c++) {
        size_t k = chunks[c % 8];
        if (k > total - pos)
            k = total - pos;
        CHECK(fp4_st_writer_put(w, all + pos, k, &e) == FP4MOE_OK, "put %zu at %zu: %s", k, pos, e.msg);
        pos += k;
    }
    CHECK(fp4_st_writer_finish(w, &e) == FP4MOE_OK, "finish: %s", e.msg);
    fp4moe_status st = open_checked(path, &f, &e);
    CHECK(st == FP4MOE_OK, "reopen: %s", e.msg);
    if (st == FP4MOE_OK) {
        size_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = (hl << 8) | ((const uint8_t *)f->map)[i];
        CHECK(hl % 8 == 0, "header length %zu not a multiple of 8", hl);
        CHECK(f->n_tensors == ND, "n_tensors %d", f->n_tensors);
        size_t off = 0;
        for (int i = 0; i < ND; i++) {
            const fp4_st_tensor *t = fp4_st_find(f, d[i].name);
            CHECK(t != NULL, "tensor %d not found", i);
            if (!t)
                continue;
            int same = t->dtype == d[i].dtype && t->ndim == d[i].ndim;
            for (int k = 0; k < d[i].ndim; k++)
                same = same && t->shape[k] == d[i].shape[k];
            CHECK(same, "tensor %d: dtype/shape differ", i);
            CHECK(t->data == (const uint8_t *)f->map + 8 + hl + off &&
                      memcmp(t->data, all + off, t->nbytes) == 0,
                  "tensor %d: bytes differ (offset %zu, %zu bytes)", i, off, t->nbytes);
            off += t->nbytes;
        }
        CHECK(off == total, "total bytes %zu vs %zu", off, total);
        CHECK(f->n_meta == 2 && strcmp(f->meta_keys[1], meta[2]) == 0 &&
                  strcmp(f->meta_vals[1], meta[3]) == 0,
              "metadata round trip");
        fp4_st_close(f);
    }
    free(all);

    /* no tensors at all; rewriting replaces the file */
    CHECK(fp4_st_writer_begin(path, NULL, 0, NULL, 0, &w, &e) == FP4MOE_OK &&
              fp4_st_writer_finish(w, &e) == FP4MOE_OK,
          "empty writer: %s", e.msg);
    b = read_all(path, &n);
    CHECK(n == 16 && b[0] == 8 && memcmp(b + 8, "{}      ", 8) == 0, "empty file bytes (n %zu)", n);
    free(b);

    /* short: names the tensor where it fell short, removes the tmp file, leaves path alone */
    path_of(path, sizeof path, "w_short.safetensors");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(fp4_st_writer_begin(path, d2, 2, NULL, 0, &w, &e) == FP4MOE_OK, "begin: %s", e.msg);
    CHECK(fp4_st_writer_put(w, data, 10, &e) == FP4MOE_OK, "put: %s", e.msg);
    st = fp4_st_writer_finish(w, &e);
    CHECK(st == FP4MOE_ERR_INVALID_ARGUMENT && strstr(e.msg, path) && strstr(e.msg, "tensor 'a'") &&
              strstr(e.msg, "got 10 of its 20 bytes") && strstr(e.msg, "10 of 23"),
          "short finish: %d %s", st, e.msg);
    CHECK(!file_exists(tmp) && !file_exists(path), "short finish left files");
    CHECK(fp4_st_writer_begin(path, d2, 2, NULL, 0, &w, &e) == FP4MOE_OK, "begin: %s", e.msg);
    CHECK(fp4_st_writer_put(w, data, 21, &e) == FP4MOE_OK, "put: %s", e.msg);
    st = fp4_st_writer_finish(w, &e);
    CHECK(st == FP4MOE_ERR_INVALID_ARGUMENT && strstr(e.msg, "tensor 'b'") &&
              strstr(e.msg, "got 1 of its 3 bytes"),
          "short in b: %s", e.msg);
    /* too many bytes */
    CHECK(fp4_st_writer_begin(path, d2, 2, NULL, 0, &w, &e) == FP4MOE_OK, "begin: %s", e.msg);
    CHECK(fp4_st_writer_put(w, data, 20, &e) == FP4MOE_OK, "put: %s", e.msg);
    st = fp4_st_writer_put(w, data, 4, &e);
    CHECK(st == FP4MOE_ERR_INVALID_ARGUMENT && strstr(e.msg, path) && strstr(e.msg, "4 bytes") &&
              strstr(e.msg, "23 bytes"),
          "over-long put: %s", e.msg);
    fp4_st_writer_abort(w);
    CHECK(!file_exists(tmp) && !file_exists(path), "abort left files");

    /* bad descriptions */
    struct {
        fp4_st_desc d[2];
        const char *want;
    } bad[] = {
        {{{"a", FP4_DT_U8, 1, {1}}, {"a", FP4_DT_U8, 1, {1}}}, "tensor 'a' appears twice"},
        {{{"a", FP4_DT_U8, 1, {1}}, {"b", FP4_DT_INVALID, 1, {1}}}, "tensor 'b': invalid dtype"},
        {{{"a", FP4_DT_U8, 1, {-1}}, {"b", FP4_DT_U8, 1, {1}}}, "tensor 'a': shape [-1]"},
        {{{"a", FP4_DT_U8, 9, {1}}, {"b", FP4_DT_U8, 1, {1}}}, "tensor 'a': ndim 9"},
        {{{"__metadata__", FP4_DT_U8, 1, {1}}, {"b", FP4_DT_U8, 1, {1}}}, "'__metadata__' is reserved"},
        {{{NULL, FP4_DT_U8, 1, {1}}, {"b", FP4_DT_U8, 1, {1}}}, "tensor #0: name is NULL"},
        {{{"a\xff", FP4_DT_U8, 1, {1}}, {"b", FP4_DT_U8, 1, {1}}}, "not valid UTF-8"},
        {{{"a", FP4_DT_F64, 2, {1LL << 40, 1LL << 40}}, {"b", FP4_DT_U8, 1, {1}}}, "overflows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        w = (fp4_st_writer *)1;
        st = fp4_st_writer_begin(path, bad[i].d, 2, NULL, 0, &w, &e);
        CHECK(st == FP4MOE_ERR_INVALID_ARGUMENT && w == NULL && strstr(e.msg, path) &&
                  strstr(e.msg, bad[i].want),
              "bad desc %zu: status %d, want \"%s\", got %s", i, st, bad[i].want, e.msg);
        CHECK(!file_exists(tmp) && !file_exists(path), "bad desc %zu left files", i);
    }
    const char *dupmeta[] = {"k", "1", "k", "2"};
    st = fp4_st_writer_begin(path, d2, 2, dupmeta, 2, &w, &e);
    CHECK(st == FP4MOE_ERR_INVALID_ARGUMENT && strstr(e.msg, "metadata key 'k' appears twice"),
          "duplicate metadata key: %s", e.msg);
    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", g_dir);
    st = fp4_st_writer_begin(nodir, d2, 2, NULL, 0, &w, &e);
    CHECK(st == FP4MOE_ERR_IO && strstr(e.msg, nodir), "missing dir: %d %s", st, e.msg);
}

static void remove_dir(const char *dir)
{
    DIR *dp = opendir(dir);
    struct dirent *de;
    char p[600];
    while (dp && (de = readdir(dp)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    if (dp)
        closedir(dp);
    rmdir(dir);
}

int main(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/test_safetensors_XXXXXX", base);
    if (!mkdtemp(g_dir)) {
        printf("FAIL: mkdtemp %s\n", g_dir);
        return 1;
    }
    test_malformed();
    test_valid_read();
    test_writer();
    remove_dir(g_dir);
    return check_done();
}
