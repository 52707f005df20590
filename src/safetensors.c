/*
 * safetensors.c - strict, read-only reader and streaming atomic writer of safetensors files.
 *
 * Format (huggingface/safetensors, docs "format"): u64 little-endian header length N, N bytes
 * of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__":
 * {str: str}}, then the data buffer; offsets are relative to the start of the buffer.
 *
 * The reader maps the whole file PROT_READ/MAP_PRIVATE and never writes or locks it. It
 * rejects everything the upstream Rust reader (safetensors 0.8.0, checked by experiment)
 * rejects, with a message naming the file, the tensor, what was expected and what was found:
 *   - the tensors, sorted by (begin, end), must tile the data buffer exactly: no overlap,
 *     no gap between tensors, no unused bytes at the start or at the end of the buffer
 *     (upstream: "invalid offset for tensor", "file not fully covered"). Zero-size tensors
 *     are allowed anywhere.
 *   - only JSON whitespace may follow the header object (upstream pads with spaces).
 * It is stricter than upstream in a few places, on purpose:
 *   - the header must start with '{' (upstream 0.8 also takes leading whitespace; old
 *     versions did not, and no writer produces it);
 *   - duplicate tensor names or metadata keys are rejected (upstream keeps the last);
 *   - dtypes outside fp4_dtype (F4, F6_*, C64, *FNUZ) are rejected as unknown;
 *   - at most FP4_ST_MAX_DIMS dims.
 * And more lenient in one: cJSON reads numbers as doubles, so an integral "2.0" is taken as 2
 * (upstream rejects it), as are cJSON's other number leniencies ("+1", "01"); values >= 2^53
 * are rejected as not exactly representable.
 * Unknown keys inside a tensor entry are ignored, as upstream does. "__metadata__": null is
 * taken as no metadata, as upstream does.
 *
 * The writer lays tensors out in description order, writes a compact JSON header
 * ("__metadata__" first) padded with spaces to a multiple of 8 bytes as upstream does, and
 * streams the data through an 8 MiB buffer into "<path>.tmp", renamed onto path on finish.
 */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FP4_ST_MAX_EXACT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact */
#define FP4_ST_WBUF (8u << 20)               /* writer buffer, bytes */

/* ---- dtypes ------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} fp4_dtypes[] = {
    [FP4_DT_INVALID] = {"INVALID", 0}, [FP4_DT_BOOL] = {"BOOL", 1},
    [FP4_DT_U8] = {"U8", 1},           [FP4_DT_I8] = {"I8", 1},
    [FP4_DT_U16] = {"U16", 2},         [FP4_DT_I16] = {"I16", 2},
    [FP4_DT_U32] = {"U32", 4},         [FP4_DT_I32] = {"I32", 4},
    [FP4_DT_U64] = {"U64", 8},         [FP4_DT_I64] = {"I64", 8},
    [FP4_DT_F8_E4M3] = {"F8_E4M3", 1}, [FP4_DT_F8_E5M2] = {"F8_E5M2", 1},
    [FP4_DT_F8_E8M0] = {"F8_E8M0", 1}, [FP4_DT_BF16] = {"BF16", 2},
    [FP4_DT_F16] = {"F16", 2},         [FP4_DT_F32] = {"F32", 4},
    [FP4_DT_F64] = {"F64", 8},
};
#define FP4_N_DTYPES ((int)(sizeof fp4_dtypes / sizeof fp4_dtypes[0]))
#define FP4_KNOWN_DTYPES \
    "BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F8_E4M3, F8_E5M2, F8_E8M0, BF16, F16, F32, F64"

const char *fp4_dtype_name(fp4_dtype dt)
{
    if ((int)dt <= 0 || (int)dt >= FP4_N_DTYPES)
        return "INVALID";
    return fp4_dtypes[dt].name;
}

fp4_dtype fp4_dtype_parse(const char *name)
{
    for (int i = 1; name && i < FP4_N_DTYPES; i++)
        if (strcmp(name, fp4_dtypes[i].name) == 0)
            return (fp4_dtype)i;
    return FP4_DT_INVALID;
}

size_t fp4_dtype_size(fp4_dtype dt)
{
    if ((int)dt <= 0 || (int)dt >= FP4_N_DTYPES)
        return 0;
    return fp4_dtypes[dt].size;
}

/* ---- helpers ------------------------------------------------------------------------------ */

/* Index of the first byte that is not well-formed UTF-8 (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), or n if all of s[0..n) is well-formed. */
static size_t utf8_bad_at(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return i;
        if (n - i < len)
            return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += len;
    }
    return n;
}

/* A JSON number that is a non-negative integer below 2^53; 0 otherwise. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d >= FP4_ST_MAX_EXACT || d != (double)(uint64_t)d)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

/* A short description of a JSON value for "found ..." messages. */
static const char *json_kind(const cJSON *v)
{
    if (!v) return "nothing (key missing)";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "an invalid value";
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* "[a, b, c]" into buf (truncated with "..." if it does not fit). */
static const char *shape_str(char *buf, size_t len, const int64_t *shape, int ndim)
{
    size_t p = 0;
    p += (size_t)snprintf(buf + p, len - p, "[");
    for (int i = 0; i < ndim && p < len; i++)
        p += (size_t)snprintf(buf + p, len - p, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (p < len)
        snprintf(buf + p, len - p, "]");
    return buf;
}

/* ---- reader ------------------------------------------------------------------------------- */

void fp4_st_close(fp4_st_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_vals);
    if (f->map)
        munmap(f->map, f->size);
    free(f->path);
    free(f);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const fp4_st_tensor *)a)->name, ((const fp4_st_tensor *)b)->name);
}

/* Tensors sorted by their place in the buffer; zero-size ones first at equal begin. */
static int cmp_tensor_ptr(const void *a, const void *b)
{
    const fp4_st_tensor *x = *(const fp4_st_tensor *const *)a, *y = *(const fp4_st_tensor *const *)b;
    if (x->data != y->data)
        return x->data < y->data ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Parse one tensor entry into t (name already set). data is the start of the buffer. */
static fp4moe_status parse_entry(const char *path, const cJSON *v, const uint8_t *data,
                                 size_t data_size, fp4_st_tensor *t, fp4_err *e)
{
    const char *name = t->name;
    char sbuf[256];
    if (!cJSON_IsObject(v))
        return fp4_fail(e, FP4MOE_ERR_FORMAT,
                        "file '%s': tensor '%s': expected an object {dtype, shape, data_offsets}, "
                        "found %s", path, name, json_kind(v));
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(v, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(v, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(v, "data_offsets");
    if (!cJSON_IsString(dt))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': \"dtype\": expected a string, "
                        "found %s", path, name, json_kind(dt));
    t->dtype = fp4_dtype_parse(dt->valuestring);
    if (t->dtype == FP4_DT_INVALID)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': unknown dtype \"%s\" "
                        "(known: " FP4_KNOWN_DTYPES ")", path, name, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': \"shape\": expected an array "
                        "of non-negative integers, found %s", path, name, json_kind(sh));
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > FP4_ST_MAX_DIMS)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': \"shape\" has %d dims, at "
                        "most %d supported", path, name, ndim, FP4_ST_MAX_DIMS);
    t->ndim = ndim;
    int i = 0;
    size_t numel = 1;
    int overflow = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t u;
        if (!json_uint(d, &u)) {
            if (cJSON_IsNumber(d))
                return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': \"shape\"[%d]: "
                                "expected a non-negative integer below 2^53, found %.17g",
                                path, name, i, d->valuedouble);
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': \"shape\"[%d]: expected "
                            "a non-negative integer, found %s", path, name, i, json_kind(d));
        }
        t->shape[i] = (int64_t)u;
        if (!fp4_mul_size(numel, (size_t)u, &numel))
            overflow = 1;
    }
    size_t esize = fp4_dtype_size(t->dtype), nbytes = 0;
    shape_str(sbuf, sizeof sbuf, t->shape, ndim);
    if (overflow || !fp4_mul_size(numel, esize, &nbytes))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': shape %s x %zu bytes (%s) "
                        "overflows the size of a buffer", path, name, sbuf, esize, dt->valuestring);
    t->numel = numel;
    t->nbytes = nbytes;
    uint64_t ob[2];
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(off->child, &ob[0]) ||
        !json_uint(off->child->next, &ob[1])) {
        const char *what = !cJSON_IsArray(off) ? json_kind(off)
                           : cJSON_GetArraySize(off) != 2 ? "an array of another length"
                                                          : "an array with a non-integer or negative element";
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': \"data_offsets\": expected "
                        "[begin, end], two non-negative integers, found %s", path, name, what);
    }
    if (ob[0] > ob[1])
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': data_offsets [%llu, %llu]: "
                        "begin is after end", path, name, (unsigned long long)ob[0],
                        (unsigned long long)ob[1]);
    if (ob[1] > data_size)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': data_offsets [%llu, %llu] end "
                        "past the data buffer of %zu bytes (file truncated?)", path, name,
                        (unsigned long long)ob[0], (unsigned long long)ob[1], data_size);
    if (ob[1] - ob[0] != nbytes)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': shape %s x %zu bytes (%s) = "
                        "%zu bytes, but data_offsets span %llu bytes", path, name, sbuf, esize,
                        dt->valuestring, nbytes, (unsigned long long)(ob[1] - ob[0]));
    t->data = data + ob[0];
    return FP4MOE_OK;
}

static fp4moe_status parse_metadata(fp4_st_file *f, const cJSON *m, fp4_err *e)
{
    if (cJSON_IsNull(m))
        return FP4MOE_OK;
    if (!cJSON_IsObject(m))
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': \"__metadata__\": expected an object of "
                        "strings, found %s", f->path, json_kind(m));
    int n = cJSON_GetArraySize(m);
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_vals = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_vals)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory for metadata", f->path);
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': \"__metadata__\" key '%s': expected a "
                            "string value, found %s", f->path, kv->string, json_kind(kv));
        for (int i = 0; i < f->n_meta; i++)
            if (strcmp(f->meta_keys[i], kv->string) == 0)
                return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': \"__metadata__\" key '%s' appears "
                                "twice", f->path, kv->string);
        f->meta_keys[f->n_meta] = xstrdup(kv->string);
        f->meta_vals[f->n_meta] = xstrdup(kv->valuestring);
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_vals[f->n_meta - 1])
            return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory for metadata",
                            f->path);
    }
    return FP4MOE_OK;
}

/* Sorted by (begin, end), the tensors must tile [0, data_size) exactly, as upstream requires. */
static fp4moe_status check_layout(fp4_st_file *f, const uint8_t *data, size_t data_size, fp4_err *e)
{
    fp4moe_status st = FP4MOE_OK;
    if (f->n_tensors == 0) {
        if (data_size != 0)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': no tensors, but %zu data bytes follow "
                            "the header (expected none)", f->path, data_size);
        return FP4MOE_OK;
    }
    fp4_st_tensor **order = malloc((size_t)f->n_tensors * sizeof *order);
    if (!order)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory", f->path);
    for (int i = 0; i < f->n_tensors; i++)
        order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_tensor_ptr);
    size_t cursor = 0;
    const fp4_st_tensor *prev = NULL; /* the last tensor with bytes (or the first) */
    char where[FP4_ERR_LEN / 2];
    for (int i = 0; i < f->n_tensors; i++) {
        const fp4_st_tensor *t = order[i];
        size_t begin = (size_t)(t->data - data);
        if (begin < cursor) {
            st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': data_offsets [%zu, %zu] "
                          "overlap tensor '%s', which ends at %zu", f->path, t->name, begin,
                          begin + t->nbytes, prev->name, cursor);
            goto free_order;
        }
        if (begin > cursor) {
            if (prev)
                snprintf(where, sizeof where, "tensor '%s'", prev->name);
            else
                snprintf(where, sizeof where, "the start of the data buffer");
            st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s': data_offsets [%zu, %zu] leave "
                          "a gap of %zu unused bytes after %s (expected begin %zu; safetensors "
                          "tensors must be contiguous)", f->path, t->name, begin, begin + t->nbytes,
                          begin - cursor, where, cursor);
            goto free_order;
        }
        if (t->nbytes > 0 || !prev)
            prev = t;
        cursor = begin + t->nbytes;
    }
    if (cursor != data_size)
        st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': the data buffer holds %zu bytes but the "
                      "tensors cover only %zu (the last, '%s', ends there); %zu trailing bytes",
                      f->path, data_size, cursor, prev->name, data_size - cursor);
free_order:
    free(order);
    return st;
}

static fp4moe_status parse_header(fp4_st_file *f, const uint8_t *hdr, size_t n, size_t data_size,
                                  fp4_err *e)
{
    const char *path = f->path;
    const uint8_t *data = hdr + n;
    fp4moe_status st = FP4MOE_OK;
    if (hdr[0] != '{')
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header must start with '{', found byte "
                        "0x%02x (not a safetensors file?)", path, hdr[0]);
    size_t bad = utf8_bad_at(hdr, n);
    if (bad != n)
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header is not valid UTF-8 at byte %zu of %zu "
                        "(found 0x%02x)", path, bad, n, hdr[bad]);
    for (size_t i = 0; i < n; i++)
        if (hdr[i] < 0x20 && hdr[i] != ' ' && hdr[i] != '\t' && hdr[i] != '\n' && hdr[i] != '\r')
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header is not valid JSON: control "
                            "byte 0x%02x at byte %zu of %zu", path, hdr[i], i, n);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)hdr, n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - (const char *)hdr) : 0;
        return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header is not valid JSON (error near byte "
                        "%zu of %zu)", path, at, n);
    }
    for (const char *p = end; p < (const char *)hdr + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header is not valid JSON: trailing "
                          "byte 0x%02x at byte %zu of %zu after the top-level object (expected only "
                          "whitespace padding)", path, (uint8_t)*p, (size_t)(p - (const char *)hdr), n);
            goto free_root;
        }
    if (!cJSON_IsObject(root)) {
        st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header: expected a JSON object, found %s",
                      path, json_kind(root));
        goto free_root;
    }
    int n_entries = cJSON_GetArraySize(root), n_meta_keys = 0;
    f->tensors = calloc((size_t)n_entries + 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory for %d entries", path,
                      n_entries);
        goto free_root;
    }
    for (const cJSON *v = root->child; v; v = v->next) {
        if (strcmp(v->string, "__metadata__") == 0) {
            if (n_meta_keys++) {
                st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': \"__metadata__\" appears twice", path);
                goto free_root;
            }
            if ((st = parse_metadata(f, v, e)) != FP4MOE_OK)
                goto free_root;
            continue;
        }
        fp4_st_tensor *t = &f->tensors[f->n_tensors];
        if (!(t->name = xstrdup(v->string))) {
            st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory", path);
            goto free_root;
        }
        f->n_tensors++;
        if ((st = parse_entry(path, v, data, data_size, t, e)) != FP4MOE_OK)
            goto free_root;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
    for (int i = 1; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor '%s' appears twice in the header",
                          path, f->tensors[i].name);
            goto free_root;
        }
    st = check_layout(f, data, data_size, e);
free_root:
    cJSON_Delete(root);
    return st;
}

fp4moe_status fp4_st_open(const char *path, fp4_st_file **out, fp4_err *e)
{
    *out = NULL;
    fp4_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = xstrdup(path))) {
        free(f);
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory", path);
    }
    fp4moe_status st = FP4MOE_OK;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &sb) != 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': cannot stat: %s", path, strerror(errno));
        goto close_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': not a regular file", path);
        goto close_fd;
    }
    if (sb.st_size < 8) {
        st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': %lld bytes long, shorter than the 8-byte "
                      "header length", path, (long long)sb.st_size);
        goto close_fd;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': too large to map", path);
        goto close_fd;
    }
    f->size = (size_t)sb.st_size;
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': cannot mmap %zu bytes: %s", path, f->size,
                      strerror(errno));
        goto close_fd;
    }
    f->map = map;
    close(fd);
    fd = -1;

    const uint8_t *b = map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | b[i];
    if (n == 0) {
        st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header length is 0 (expected at least 2, "
                      "'{}')", path);
        goto fail;
    }
    if (n > FP4_ST_MAX_HEADER) {
        st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header length %llu exceeds the limit of %u "
                      "bytes (not a safetensors file?)", path, (unsigned long long)n,
                      FP4_ST_MAX_HEADER);
        goto fail;
    }
    if (n > f->size - 8) {
        st = fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': header length %llu runs past the end of the "
                      "file (%zu bytes, so at most %zu; truncated?)", path, (unsigned long long)n,
                      f->size, f->size - 8);
        goto fail;
    }
    if ((st = parse_header(f, b + 8, (size_t)n, f->size - 8 - (size_t)n, e)) != FP4MOE_OK)
        goto fail;
    *out = f;
    return FP4MOE_OK;
close_fd:
    close(fd);
fail:
    fp4_st_close(f);
    return st;
}

const fp4_st_tensor *fp4_st_find(const fp4_st_file *f, const char *name)
{
    int lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0)
            return &f->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* ---- writer ------------------------------------------------------------------------------- */

struct fp4_st_writer {
    char *path, *tmp;  /* final path and "<path>.tmp" */
    int fd;            /* the tmp file, -1 once closed */
    int failed;        /* a write failed: finish refuses */
    uint8_t *buf;      /* FP4_ST_WBUF bytes of pending output */
    size_t used;       /* bytes pending in buf */
    size_t total;      /* data bytes the descriptions declare */
    size_t written;    /* data bytes put so far */
    int n;             /* tensors */
    char **names;      /* [n] */
    size_t *ends;      /* [n] end offset of each tensor in the data buffer */
};

/* Growing string for the header. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *s, const char *str, size_t n)
{
    if (s->oom)
        return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (s->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->len, str, n);
    s->len += n;
    s->p[s->len] = '\0';
}

static void sb_str(sbuf *s, const char *str) { sb_put(s, str, strlen(str)); }

static void sb_u64(sbuf *s, uint64_t v)
{
    char b[32];
    sb_put(s, b, (size_t)snprintf(b, sizeof b, "%llu", (unsigned long long)v));
}

/* A JSON string literal: escape '"', '\\' and control bytes; UTF-8 passes through. */
static void sb_json(sbuf *s, const char *str)
{
    sb_put(s, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        char b[8];
        if (*c == '"' || *c == '\\') {
            b[0] = '\\';
            b[1] = (char)*c;
            sb_put(s, b, 2);
        } else if (*c < 0x20) {
            sb_put(s, b, (size_t)snprintf(b, sizeof b, "\\u%04x", *c));
        } else {
            sb_put(s, (const char *)c, 1);
        }
    }
    sb_put(s, "\"", 1);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names must be non-NULL, valid UTF-8 and unique; what says "tensor" or "metadata key". */
static fp4moe_status check_names(const char *path, const char **names, int n, const char *what,
                                 fp4_err *e)
{
    for (int i = 0; i < n; i++) {
        if (!names[i])
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': %s #%d: name is NULL", path,
                            what, i);
        size_t len = strlen(names[i]);
        if (utf8_bad_at((const uint8_t *)names[i], len) != len)
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': %s #%d: name is not valid "
                            "UTF-8", path, what, i);
    }
    const char **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    if (!sorted)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory", path);
    if (n > 0)
        memcpy(sorted, names, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str_ptr);
    fp4moe_status st = FP4MOE_OK;
    for (int i = 1; i < n; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) {
            st = fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': %s '%s' appears twice", path,
                          what, sorted[i]);
            break;
        }
    free(sorted);
    return st;
}

static fp4moe_status write_all(fp4_st_writer *w, const void *p, size_t n, fp4_err *e)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = write(w->fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            w->failed = 1;
            return fp4_fail(e, FP4MOE_ERR_IO, "file '%s': write failed: %s", w->tmp,
                            k < 0 ? strerror(errno) : "no progress");
        }
        b += k;
        n -= (size_t)k;
    }
    return FP4MOE_OK;
}

static fp4moe_status flush_buf(fp4_st_writer *w, fp4_err *e)
{
    fp4moe_status st = write_all(w, w->buf, w->used, e);
    w->used = 0;
    return st;
}

/* Buffered append of raw bytes (header or data). */
static fp4moe_status append(fp4_st_writer *w, const void *p, size_t n, fp4_err *e)
{
    fp4moe_status st;
    if (w->used + n <= FP4_ST_WBUF) {
        memcpy(w->buf + w->used, p, n);
        w->used += n;
        return FP4MOE_OK;
    }
    if ((st = flush_buf(w, e)) != FP4MOE_OK)
        return st;
    if (n >= FP4_ST_WBUF)
        return write_all(w, p, n, e);
    memcpy(w->buf, p, n);
    w->used = n;
    return FP4MOE_OK;
}

static void writer_free(fp4_st_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    for (int i = 0; w->names && i < w->n; i++)
        free(w->names[i]);
    free(w->names);
    free(w->ends);
    free(w->buf);
    free(w->tmp);
    free(w->path);
    free(w);
}

void fp4_st_writer_abort(fp4_st_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    unlink(w->tmp);
    writer_free(w);
}

/* Validate the descriptions, compute offsets in order and build the padded JSON header. */
static fp4moe_status build_header(const char *path, const fp4_st_desc *d, int n,
                                  const char *const *kv, int n_meta, sbuf *s, size_t *ends,
                                  fp4_err *e)
{
    size_t off = 0;
    char shp[256];
    sb_str(s, "{");
    if (n_meta > 0) {
        sb_str(s, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (!kv[2 * i + 1])
                return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': metadata key '%s': "
                                "value is NULL", path, kv[2 * i]);
            size_t len = strlen(kv[2 * i + 1]);
            if (utf8_bad_at((const uint8_t *)kv[2 * i + 1], len) != len)
                return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': metadata key '%s': "
                                "value is not valid UTF-8", path, kv[2 * i]);
            sb_str(s, i ? "," : "");
            sb_json(s, kv[2 * i]);
            sb_str(s, ":");
            sb_json(s, kv[2 * i + 1]);
        }
        sb_str(s, "}");
    }
    for (int i = 0; i < n; i++) {
        size_t esize = fp4_dtype_size(d[i].dtype), numel = 1, nbytes = 0;
        int overflow = 0;
        if (strcmp(d[i].name, "__metadata__") == 0)
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': tensor #%d: the name "
                            "'__metadata__' is reserved", path, i);
        if (esize == 0)
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': tensor '%s': invalid dtype "
                            "code %d", path, d[i].name, (int)d[i].dtype);
        if (d[i].ndim < 0 || d[i].ndim > FP4_ST_MAX_DIMS)
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': tensor '%s': ndim %d, "
                            "expected 0..%d", path, d[i].name, d[i].ndim, FP4_ST_MAX_DIMS);
        shape_str(shp, sizeof shp, d[i].shape, d[i].ndim);
        for (int k = 0; k < d[i].ndim; k++) {
            if (d[i].shape[k] < 0 || (double)d[i].shape[k] >= FP4_ST_MAX_EXACT)
                return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': tensor '%s': shape %s: "
                                "dim %d must be in [0, 2^53)", path, d[i].name, shp, k);
            overflow |= !fp4_mul_size(numel, (size_t)d[i].shape[k], &numel);
        }
        if (overflow || !fp4_mul_size(numel, esize, &nbytes) || nbytes > SIZE_MAX - off)
            return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': tensor '%s': shape %s of %s "
                            "overflows the file size", path, d[i].name, shp,
                            fp4_dtype_name(d[i].dtype));
        sb_str(s, (i || n_meta > 0) ? "," : "");
        sb_json(s, d[i].name);
        sb_str(s, ":{\"dtype\":\"");
        sb_str(s, fp4_dtype_name(d[i].dtype));
        sb_str(s, "\",\"shape\":[");
        for (int k = 0; k < d[i].ndim; k++) {
            sb_str(s, k ? "," : "");
            sb_u64(s, (uint64_t)d[i].shape[k]);
        }
        sb_str(s, "],\"data_offsets\":[");
        sb_u64(s, off);
        sb_str(s, ",");
        sb_u64(s, off + nbytes);
        sb_str(s, "]}");
        off += nbytes;
        ends[i] = off;
    }
    sb_str(s, "}");
    while (s->len % 8 != 0)
        sb_str(s, " ");
    if (s->oom)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory for the header", path);
    if (s->len > FP4_ST_MAX_HEADER)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': header of %zu bytes exceeds the "
                        "limit of %u", path, s->len, FP4_ST_MAX_HEADER);
    return FP4MOE_OK;
}

fp4moe_status fp4_st_writer_begin(const char *path, const fp4_st_desc *descs, int n,
                                  const char *const *meta_kv, int n_meta, fp4_st_writer **out,
                                  fp4_err *e)
{
    *out = NULL;
    if (!path || n < 0 || n_meta < 0 || (n > 0 && !descs) || (n_meta > 0 && !meta_kv))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': writer: bad arguments (n %d, "
                        "n_meta %d, descs %s, meta %s)", path ? path : "(null)", n, n_meta,
                        descs ? "set" : "NULL", meta_kv ? "set" : "NULL");
    fp4moe_status st;
    sbuf s = {0};
    const char **names = malloc(((size_t)n + (size_t)n_meta + 1) * sizeof *names);
    fp4_st_writer *w = calloc(1, sizeof *w);
    if (!names || !w) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory", path);
        goto free_names;
    }
    w->fd = -1;
    w->n = n;
    size_t plen = strlen(path);
    w->path = xstrdup(path);
    w->tmp = malloc(plen + 5);
    w->buf = malloc(FP4_ST_WBUF);
    w->names = calloc((size_t)n + 1, sizeof *w->names);
    w->ends = calloc((size_t)n + 1, sizeof *w->ends);
    if (!w->path || !w->tmp || !w->buf || !w->names || !w->ends) {
        st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory", path);
        goto free_names;
    }
    memcpy(w->tmp, path, plen);
    memcpy(w->tmp + plen, ".tmp", 5);

    for (int i = 0; i < n; i++)
        names[i] = descs[i].name;
    if ((st = check_names(path, names, n, "tensor", e)) != FP4MOE_OK)
        goto free_names;
    for (int i = 0; i < n_meta; i++)
        names[i] = meta_kv[2 * i];
    if ((st = check_names(path, names, n_meta, "metadata key", e)) != FP4MOE_OK)
        goto free_names;
    if ((st = build_header(path, descs, n, meta_kv, n_meta, &s, w->ends, e)) != FP4MOE_OK)
        goto free_names;
    for (int i = 0; i < n; i++)
        if (!(w->names[i] = xstrdup(descs[i].name))) {
            st = fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "file '%s': out of memory", path);
            goto free_names;
        }
    w->total = n > 0 ? w->ends[n - 1] : 0;

    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': cannot create: %s", w->tmp, strerror(errno));
        goto free_names;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)s.len >> (8 * i));
    if ((st = append(w, len8, 8, e)) != FP4MOE_OK || (st = append(w, s.p, s.len, e)) != FP4MOE_OK) {
        fp4_st_writer_abort(w);
        w = NULL;
        goto free_names;
    }
    *out = w;
    w = NULL;
free_names:
    if (w)
        writer_free(w);
    free(s.p);
    free(names);
    return st;
}

/* Index of the tensor that holds data byte off (the first with end > off); n if none. */
static int tensor_at(const fp4_st_writer *w, size_t off)
{
    int lo = 0, hi = w->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (w->ends[mid] > off)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

fp4moe_status fp4_st_writer_put(fp4_st_writer *w, const void *bytes, size_t n, fp4_err *e)
{
    if (w->failed)
        return fp4_fail(e, FP4MOE_ERR_IO, "file '%s': an earlier write failed", w->tmp);
    if (n > w->total - w->written)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': put of %zu bytes at data offset "
                        "%zu exceeds the %zu bytes the tensors declare (last tensor '%s')", w->path,
                        n, w->written, w->total, w->n ? w->names[w->n - 1] : "(none)");
    fp4moe_status st = append(w, bytes, n, e);
    if (st == FP4MOE_OK)
        w->written += n;
    return st;
}

fp4moe_status fp4_st_writer_finish(fp4_st_writer *w, fp4_err *e)
{
    fp4moe_status st;
    if (w->failed) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': an earlier write failed", w->tmp);
        goto abort;
    }
    if (w->written != w->total) {
        int i = tensor_at(w, w->written);
        size_t begin = i > 0 ? w->ends[i - 1] : 0;
        st = fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "file '%s': tensor '%s' fell short: got %zu of "
                      "its %zu bytes (%zu of %zu data bytes put in all)", w->path, w->names[i],
                      w->written - begin, w->ends[i] - begin, w->written, w->total);
        goto abort;
    }
    if ((st = flush_buf(w, e)) != FP4MOE_OK)
        goto abort;
    if (fsync(w->fd) != 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': fsync failed: %s", w->tmp, strerror(errno));
        goto abort;
    }
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': close failed: %s", w->tmp, strerror(errno));
        goto abort;
    }
    if (rename(w->tmp, w->path) != 0) {
        st = fp4_fail(e, FP4MOE_ERR_IO, "file '%s': cannot rename from '%s': %s", w->path, w->tmp,
                      strerror(errno));
        goto abort;
    }
    writer_free(w);
    return FP4MOE_OK;
abort:
    fp4_st_writer_abort(w);
    return st;
}
