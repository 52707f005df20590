/*
 * cmd_layer.c - `fp4moe layer`: run one decoder layer's MLP/MoE block on the user's own
 * activations. Input: a safetensors file with tensor "x" [M, H] (BF16 or F32). Output: a new
 * safetensors file with "y" [M, H] F32 and, for MoE layers, "topk_ids" [M, k] I32 and
 * "topk_weights" [M, k] F32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "cli.h"
#include "layer_run.h"
#include "oracle.h"

static const char *usage_text =
    "usage: fp4moe layer DIR --layer L --input IN.safetensors --output OUT.safetensors\n"
    "                    [--moe-backend NAME] [--device-arch ARCH]\n"
    "IN holds \"x\" [M, hidden] BF16 or F32; OUT gets \"y\" [M, hidden] F32, \"topk_ids\" and \"topk_weights\".\n";

static int read_x(const char *path, int H, float **out, int *m, fp4_err *e)
{
    fp4_st_file *f = NULL;
    if (fp4_st_open(path, &f, e))
        return 0;
    const fp4_st_tensor *t = fp4_st_find(f, "x");
    int ok = 0;
    if (!t) {
        fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': expected a tensor named 'x' [M, %d], found none", path, H);
    } else if (t->ndim != 2 || t->shape[1] != H || t->shape[0] < 1 || t->shape[0] > (1 << 24)) {
        fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor 'x': expected shape [M, %d] with M >= 1, found %d dims [%lld, %lld]",
                 path, H, t->ndim, (long long)t->shape[0], t->ndim > 1 ? (long long)t->shape[1] : -1LL);
    } else if (t->dtype != FP4_DT_F32 && t->dtype != FP4_DT_BF16) {
        fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': tensor 'x': expected dtype BF16 or F32, found %s", path,
                 fp4_dtype_name(t->dtype));
    } else {
        *m = (int)t->shape[0];
        *out = malloc(t->numel * sizeof(float));
        if (!*out) {
            fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", path);
        } else {
            for (size_t i = 0; i < t->numel; i++) {
                if (t->dtype == FP4_DT_F32) {
                    memcpy(&(*out)[i], t->data + 4 * i, 4);
                } else {
                    uint16_t b;
                    memcpy(&b, t->data + 2 * i, 2);
                    (*out)[i] = fp4moe_bf16_to_float(b);
                }
            }
            ok = 1;
        }
    }
    fp4_st_close(f);
    return ok;
}

int cmd_layer(int argc, char **argv)
{
    const char *dir = NULL, *in = NULL, *outp = NULL, *backend = NULL, *arch = NULL;
    long layer = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--layer")) {
            if (!(val = cli_value("layer", argc, argv, &i)) || !cli_int("layer", a, val, 0, 100000, &layer))
                return CLI_USAGE;
        } else if (!strcmp(a, "--input")) {
            if (!(in = cli_value("layer", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--output")) {
            if (!(outp = cli_value("layer", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--moe-backend")) {
            if (!(backend = cli_value("layer", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--device-arch")) {
            if (!(arch = cli_value("layer", argc, argv, &i)))
                return CLI_USAGE;
        } else if (a[0] == '-') {
            fprintf(stderr, "fp4moe layer: unknown option '%s'\n%s", a, usage_text);
            return CLI_USAGE;
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "fp4moe layer: unexpected argument '%s'\n", a);
            return CLI_USAGE;
        }
    }
    if (!dir || layer < 0 || !in || !outp) {
        fprintf(stderr, "fp4moe layer: expected DIR, --layer, --input and --output\n%s", usage_text);
        return CLI_USAGE;
    }
    fp4_err e = {0};
    fp4_device dev;
    if (fp4_device_resolve(arch, &dev, &e))
        return cli_error("layer", &e), CLI_USAGE;
    fp4_ckpt *c = NULL;
    if (fp4_ckpt_open(dir, (int)layer + 1, &c, &e))
        return cli_error("layer", &e);
    const fp4_arch *A = &c->arch;
    int rc = CLI_FAIL, m = 0, k = A->topk, H = A->hidden;
    float *x = NULL, *y = NULL, *w = NULL;
    int32_t *ids = NULL;
    fp4_layer_runner r;
    memset(&r, 0, sizeof r);
    if ((int)layer >= c->n_layers) {
        fprintf(stderr, "fp4moe layer: --layer %ld: expected 0..%d for '%s'\n", layer, c->n_layers - 1, dir);
        rc = CLI_USAGE;
        goto out;
    }
    if (fp4_layer_runner_init(&r, c, &dev, backend, (int)layer, &e) || !read_x(in, H, &x, &m, &e)) {
        cli_error("layer", &e);
        goto out;
    }
    char where[32], note[320];
    snprintf(where, sizeof where, "layer %ld", layer);
    fp4_decision_note(&r.decision, where, note, sizeof note);
    if (r.is_moe && note[0])
        fprintf(stderr, "fp4moe: %s\n", note);
    y = malloc((size_t)m * H * sizeof *y);
    ids = malloc((size_t)m * k * sizeof *ids);
    w = malloc((size_t)m * k * sizeof *w);
    if (!y || !ids || !w) {
        fprintf(stderr, "fp4moe layer: out of memory for %d tokens\n", m);
        goto out;
    }
    if (fp4_layer_runner_forward(&r, A, x, m, y, r.is_moe ? ids : NULL, r.is_moe ? w : NULL, &e)) {
        cli_error("layer", &e);
        goto out;
    }
    fp4_st_desc d[3] = {{"y", FP4_DT_F32, 2, {m, H}}, {"topk_ids", FP4_DT_I32, 2, {m, k}},
                        {"topk_weights", FP4_DT_F32, 2, {m, k}}};
    char backend_name[64], layer_s[16];
    snprintf(backend_name, sizeof backend_name, "%s", r.is_moe ? r.decision.backend->name : "reference");
    snprintf(layer_s, sizeof layer_s, "%ld", layer);
    const char *meta[4] = {"backend", backend_name, "layer", layer_s};
    fp4_st_writer *wr = NULL;
    if (fp4_st_writer_begin(outp, d, r.is_moe ? 3 : 1, meta, 2, &wr, &e) ||
        fp4_st_writer_put(wr, y, (size_t)m * H * 4, &e) ||
        (r.is_moe && (fp4_st_writer_put(wr, ids, (size_t)m * k * 4, &e) ||
                      fp4_st_writer_put(wr, w, (size_t)m * k * 4, &e)))) {
        if (wr)
            fp4_st_writer_abort(wr);
        cli_error("layer", &e);
        goto out;
    }
    if (fp4_st_writer_finish(wr, &e)) {
        cli_error("layer", &e);
        goto out;
    }
    printf("layer %ld (%s, backend %s): %d tokens -> %s\n", layer, r.is_moe ? "moe" : "dense", backend_name, m, outp);
    rc = CLI_OK;
out:
    fp4_layer_runner_free(&r);
    free(x);
    free(y);
    free(ids);
    free(w);
    fp4_ckpt_close(c);
    return rc;
}
