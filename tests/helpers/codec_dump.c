/*
 * codec_dump.c - exposes the scalar codecs of src/formats.c to tests/py/test_codecs.py, which
 * cross-checks them against ml_dtypes and numpy. Binary files are raw little-endian arrays
 * (the host's order; the tests run on the host that built this).
 *
 *   codec_dump decode             print "<fmt> <code> <value as %a>" for every code of e2m1
 *                                 (16), e4m3 (256) and ue8m0 (256); NaN prints as "nan"
 *   codec_dump bf16_decode OUT    write float32[65536]: bf16_to_float of every bit pattern
 *   codec_dump encode IN OUT      IN float32[n]; OUT = e2m1 u8[n] (one code per byte),
 *                                 e4m3 u8[n], ue8m0 u8[n], bf16 u16[n], concatenated
 *   codec_dump nvfp4 IN OUT G     n % 16 == 0, G the global decode scale (strtof: decimal or
 *                                 hex float); OUT = packed u8[n/2], scales u8[n/16],
 *                                 dequantized float32[n]
 *   codec_dump mxfp8 IN OUT       n % 32 == 0; OUT = q u8[n], scales u8[n/32], float32[n]
 * Exits 0 on success, 2 on a usage or I/O error (with a message on stderr).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4moe.h"

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "codec_dump: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(2);
}

static float *read_floats(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open '%s'", path);
    if (fseek(f, 0, SEEK_END) != 0)
        die("cannot seek '%s'", path);
    long len = ftell(f);
    if (len < 0 || len % 4 != 0)
        die("'%s': size is not a multiple of 4 bytes (float32)", path);
    rewind(f);
    *n = (size_t)len / 4;
    float *x = malloc(*n ? *n * sizeof *x : 1);
    if (!x || fread(x, sizeof *x, *n, f) != *n)
        die("cannot read '%s'", path);
    fclose(f);
    return x;
}

static void write_all(FILE *f, const void *p, size_t size, const char *path)
{
    if (size && fwrite(p, 1, size, f) != size)
        die("cannot write '%s'", path);
}

static FILE *open_out(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        die("cannot create '%s'", path);
    return f;
}

static void close_out(FILE *f, const char *path)
{
    if (fclose(f) != 0)
        die("cannot write '%s'", path);
}

static void print_code(const char *fmt, unsigned code, float v)
{
    if (isnan(v))
        printf("%s %u nan\n", fmt, code);
    else
        printf("%s %u %a\n", fmt, code, v);
}

static int cmd_decode(void)
{
    for (unsigned c = 0; c < 16; c++)
        print_code("e2m1", c, fp4moe_e2m1_to_float((uint8_t)c));
    for (unsigned c = 0; c < 256; c++)
        print_code("e4m3", c, fp4moe_e4m3_to_float((uint8_t)c));
    for (unsigned c = 0; c < 256; c++)
        print_code("ue8m0", c, fp4moe_ue8m0_to_float((uint8_t)c));
    return 0;
}

static int cmd_bf16_decode(const char *out)
{
    static float v[65536];
    for (uint32_t b = 0; b < 65536; b++)
        v[b] = fp4moe_bf16_to_float((uint16_t)b);
    FILE *f = open_out(out);
    write_all(f, v, sizeof v, out);
    close_out(f, out);
    return 0;
}

static int cmd_encode(const char *in, const char *out)
{
    size_t n;
    float *x = read_floats(in, &n);
    uint8_t *e2m1 = malloc(n + 1), *e4m3 = malloc(n + 1), *ue8m0 = malloc(n + 1);
    uint16_t *bf16 = malloc(2 * n + 2);
    if (!e2m1 || !e4m3 || !ue8m0 || !bf16)
        die("out of memory for %s values", in);
    for (size_t i = 0; i < n; i++) {
        e2m1[i] = fp4moe_e2m1_from_float(x[i]);
        e4m3[i] = fp4moe_e4m3_from_float(x[i]);
        ue8m0[i] = fp4moe_ue8m0_from_float(x[i]);
        bf16[i] = fp4moe_bf16_from_float(x[i]);
    }
    FILE *f = open_out(out);
    write_all(f, e2m1, n, out);
    write_all(f, e4m3, n, out);
    write_all(f, ue8m0, n, out);
    write_all(f, bf16, 2 * n, out);
    close_out(f, out);
    free(x), free(e2m1), free(e4m3), free(ue8m0), free(bf16);
    return 0;
}

static int cmd_nvfp4(const char *in, const char *out, const char *global)
{
    char *end;
    float g = strtof(global, &end);
    if (*end || !(g > 0.0f) || isinf(g))
        die("global scale '%s' is not a finite float > 0", global);
    size_t n;
    float *x = read_floats(in, &n);
    if (n % 16)
        die("'%s': element count is not a multiple of 16", in);
    uint8_t *packed = malloc(n / 2 + 1), *scales = malloc(n / 16 + 1);
    float *deq = malloc(n * sizeof *deq + 1);
    if (!packed || !scales || !deq)
        die("out of memory for %s", in);
    fp4moe_nvfp4_quantize(x, n, g, packed, scales);
    fp4moe_nvfp4_dequantize(packed, scales, g, n, deq);
    FILE *f = open_out(out);
    write_all(f, packed, n / 2, out);
    write_all(f, scales, n / 16, out);
    write_all(f, deq, n * sizeof *deq, out);
    close_out(f, out);
    free(x), free(packed), free(scales), free(deq);
    return 0;
}

static int cmd_mxfp8(const char *in, const char *out)
{
    size_t n;
    float *x = read_floats(in, &n);
    if (n % 32)
        die("'%s': element count is not a multiple of 32", in);
    uint8_t *q = malloc(n + 1), *scales = malloc(n / 32 + 1);
    float *deq = malloc(n * sizeof *deq + 1);
    if (!q || !scales || !deq)
        die("out of memory for %s", in);
    fp4moe_mxfp8_quantize(x, n, q, scales);
    fp4moe_mxfp8_dequantize(q, scales, n, deq);
    FILE *f = open_out(out);
    write_all(f, q, n, out);
    write_all(f, scales, n / 32, out);
    write_all(f, deq, n * sizeof *deq, out);
    close_out(f, out);
    free(x), free(q), free(scales), free(deq);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "decode") && argc == 2)
        return cmd_decode();
    if (!strcmp(mode, "bf16_decode") && argc == 3)
        return cmd_bf16_decode(argv[2]);
    if (!strcmp(mode, "encode") && argc == 4)
        return cmd_encode(argv[2], argv[3]);
    if (!strcmp(mode, "nvfp4") && argc == 5)
        return cmd_nvfp4(argv[2], argv[3], argv[4]);
    if (!strcmp(mode, "mxfp8") && argc == 4)
        return cmd_mxfp8(argv[2], argv[3]);
    fprintf(stderr, "usage: codec_dump decode | bf16_decode OUT | encode IN OUT | "
                    "nvfp4 IN OUT GLOBAL | mxfp8 IN OUT\n");
    return 2;
}
