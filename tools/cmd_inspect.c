/*
 * cmd_inspect.c - `fp4moe inspect`: what a model directory holds (architecture, layer kinds,
 * per-layer-group schemes, bytes per scheme, shards touched) and what the oracle would run on
 * each MoE layer for a device; --verify reads every tensor and reports NaN/Inf scales or
 * out-of-range values; --json prints one object for scripts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "checkpoint.h"
#include "cli.h"
#include "layer_run.h"
#include "oracle.h"

static const char *usage_text =
    "usage: fp4moe inspect DIR [--json] [--layers N] [--verify] [--device-arch ARCH] [--moe-backend NAME]\n"
    "  --device-arch auto|cpu|sm80|sm86|sm89|sm90|sm100|sm120  ask what would run there (default: this machine)\n"
    "  --moe-backend auto|NAME   the backend to check (default auto)\n";

typedef struct layer_info {
    int moe;
    fp4_scheme fc1, fc2;          /* MoE: routed experts; dense: gate / down */
    fp4_decision d;
    int has_decision;
    char error[FP4_ERR_LEN];
} layer_info;

/* Scheme classification of one tensor for the bytes table. */
static const char *tensor_class(const fp4_ckpt *c, const fp4_st_tensor *t)
{
    static const char *quant_suffixes[] = {"weight_packed", "weight_scale", "weight_scale_2",
                                           "weight_global_scale", "input_scale", "input_global_scale",
                                           "weight_scale_inv"};
    const char *dot = strrchr(t->name, '.');
    const char *suffix = dot ? dot + 1 : t->name;
    int quant = t->dtype == FP4_DT_U8 || t->dtype == FP4_DT_F8_E4M3 || t->dtype == FP4_DT_F8_E8M0;
    for (size_t i = 0; i < sizeof quant_suffixes / sizeof quant_suffixes[0]; i++)
        quant |= strcmp(suffix, quant_suffixes[i]) == 0;
    if (quant && dot) {
        char module[512];
        const char *name = t->name;
        size_t pl = strlen(c->arch.prefix);
        if (pl && strncmp(name, c->arch.prefix, pl) == 0)
            name += pl;
        size_t n = strlen(name) - strlen(suffix) - 1;
        if (n >= sizeof module)
            n = sizeof module - 1;
        memcpy(module, name, n);
        module[n] = '\0';
        return fp4_wscheme_name(fp4_quant_scheme_for(c->quant, module).w);
    }
    switch (t->dtype) {
    case FP4_DT_F32: return "f32";
    case FP4_DT_BF16: return "bf16";
    case FP4_DT_F16: return "f16";
    default: return fp4_dtype_name(t->dtype);
    }
}

/* --verify: count NaN/Inf and out-of-range values of one tensor; 0 when clean. */
static size_t verify_tensor(const fp4_st_tensor *t, char *what, size_t len)
{
    size_t bad = 0;
    const char *dot = strrchr(t->name, '.');
    const char *suffix = dot ? dot + 1 : "";
    int is_scale = strstr(suffix, "scale") != NULL;
    for (size_t i = 0; i < t->numel; i++) {
        float v;
        switch (t->dtype) {
        case FP4_DT_F8_E4M3: {
            uint8_t b = t->data[i];
            if ((b & 0x7f) == 0x7f || (is_scale && (b & 0x80) && b != 0x80))
                bad++;
            continue;
        }
        case FP4_DT_U8:
        case FP4_DT_F8_E8M0:
            /* Packed e2m1 bytes are all valid; a byte scale of 0xff is an E8M0 NaN (or an
             * E4M3 -NaN where e4m3 scales are stored as U8). */
            if ((is_scale || t->dtype == FP4_DT_F8_E8M0) && t->data[i] == 0xff)
                bad++;
            continue;
        case FP4_DT_F32: memcpy(&v, t->data + 4 * i, 4); break;
        case FP4_DT_BF16: {
            uint16_t b;
            memcpy(&b, t->data + 2 * i, 2);
            v = fp4moe_bf16_to_float(b);
            break;
        }
        default: continue;
        }
        if (!isfinite(v) || (is_scale && v <= 0.0f))
            bad++;
    }
    if (bad)
        snprintf(what, len, "%zu of %zu values are NaN/Inf%s", bad, t->numel,
                 is_scale ? " or not a positive scale" : "");
    return bad;
}

int cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL, *arch = NULL, *backend = NULL;
    int json = 0, verify = 0, rc = CLI_OK;
    long layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--verify")) {
            verify = 1;
        } else if (!strcmp(a, "--layers")) {
            if (!(val = cli_value("inspect", argc, argv, &i)) || !cli_int("inspect", a, val, 1, 100000, &layers))
                return CLI_USAGE;
        } else if (!strcmp(a, "--device-arch")) {
            if (!(arch = cli_value("inspect", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--moe-backend")) {
            if (!(backend = cli_value("inspect", argc, argv, &i)))
                return CLI_USAGE;
        } else if (a[0] == '-') {
            fprintf(stderr, "fp4moe inspect: unknown option '%s'\n%s", a, usage_text);
            return CLI_USAGE;
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "fp4moe inspect: unexpected argument '%s'\n", a);
            return CLI_USAGE;
        }
    }
    if (!dir) {
        fprintf(stderr, "fp4moe inspect: expected a model directory\n%s", usage_text);
        return CLI_USAGE;
    }
    fp4_err e = {0};
    fp4_device dev;
    if (fp4_device_resolve(arch, &dev, &e))
        return cli_error("inspect", &e), CLI_USAGE;
    if (backend && strcmp(backend, "auto") != 0) {
        int n;
        const fp4_backend *const *reg = fp4_backend_registry(&n);
        if (!fp4_backend_lookup(reg, n, backend)) {
            char names[512];
            fp4_backend_list(reg, n, names, sizeof names);
            fprintf(stderr, "fp4moe inspect: --moe-backend: unknown backend '%s'; valid backends: auto, %s\n", backend, names);
            return CLI_USAGE;
        }
    }
    fp4_ckpt *c = NULL;
    if (fp4_ckpt_open(dir, (int)layers, &c, &e))
        return cli_error("inspect", &e);
    const fp4_arch *A = &c->arch;
    layer_info *li = calloc((size_t)c->n_layers, sizeof *li);
    if (!li) {
        fp4_ckpt_close(c);
        return CLI_FAIL;
    }
    /* Bind every layer's weights (checks presence, dtype, shape of everything the config
     * promises) and ask the oracle. */
    for (int L = 0; L < c->n_layers; L++) {
        fp4_layer_runner r;
        li[L].moe = A->is_moe[L];
        fp4_err le = {0};
        if (fp4_layer_runner_init(&r, c, &dev, backend, L, &le) != FP4MOE_OK) {
            if (le.status == FP4MOE_ERR_NOT_SUPPORTED || le.status == FP4MOE_ERR_INVALID_ARGUMENT) {
                snprintf(li[L].error, sizeof li[L].error, "%s", le.msg);
                rc = CLI_FAIL;
                fp4_layer_need need;
                if (li[L].moe && fp4_layer_need_of(c, L, &need, &le) == FP4MOE_OK) {
                    li[L].fc1 = need.fc1;
                    li[L].fc2 = need.fc2;
                }
                fp4_layer_runner_free(&r);
                continue;
            }
            fp4_layer_runner_free(&r);
            free(li);
            fp4_ckpt_close(c);
            return cli_error("inspect", &le);
        }
        if (li[L].moe) {
            li[L].fc1 = r.moe.gate[0].scheme;
            li[L].fc2 = r.moe.down[0].scheme;
            li[L].d = r.decision;
            li[L].has_decision = 1;
        } else {
            li[L].fc1 = r.dense.gate.scheme;
            li[L].fc2 = r.dense.down.scheme;
        }
        fp4_layer_runner_free(&r);
    }
    /* Tensors and bytes: every tensor of the opened layers plus the non-layer ones. */
    if (fp4_ckpt_open_all(c, &e)) {
        free(li);
        fp4_ckpt_close(c);
        return cli_error("inspect", &e);
    }
    const char *classes[8];
    double class_bytes[8] = {0};
    int n_classes = 0;
    double total = 0;
    size_t bad_total = 0;
    cJSON *root = cJSON_CreateObject(), *verify_items = cJSON_CreateArray();
    for (int i = 0; i < c->n_entries; i++) {
        const fp4_st_tensor *t;
        if (fp4_ckpt_get(c, c->entries[i].name, &t, &e)) {
            cJSON_Delete(root);
            cJSON_Delete(verify_items);
            free(li);
            fp4_ckpt_close(c);
            return cli_error("inspect", &e);
        }
        const char *cls = tensor_class(c, t);
        int k = 0;
        while (k < n_classes && strcmp(classes[k], cls) != 0)
            k++;
        if (k == n_classes && n_classes < 8)
            classes[n_classes++] = cls;
        if (k < 8)
            class_bytes[k] += (double)t->nbytes;
        total += (double)t->nbytes;
        if (verify) {
            char what[160];
            size_t bad = verify_tensor(t, what, sizeof what);
            if (bad) {
                bad_total += bad;
                if (!json)
                    printf("verify: tensor '%s' in '%s': %s\n", t->name, c->shard_files[c->entries[i].shard], what);
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "tensor", t->name);
                cJSON_AddStringToObject(o, "problem", what);
                cJSON_AddItemToArray(verify_items, o);
            }
        }
    }
    if (bad_total)
        rc = CLI_FAIL;

    /* Layer groups: consecutive layers with the same kind, schemes and decision. */
    cJSON *jl = cJSON_CreateArray();
    if (!json) {
        printf("model        %s\n", dir);
        printf("architecture %s%s, hidden %d, %d layer%s open of %d\n", A->model_type,
               A->prefix[0] ? " (text_config)" : "", A->hidden, c->n_layers, c->n_layers == 1 ? "" : "s",
               A->n_layers);
        printf("experts      %d routed x intermediate %d, top-%d, shared %d, %s", A->n_experts,
               A->moe_intermediate, A->topk, A->shared_intermediate, A->act == FP4_ACT_SWIGLUOAI ? "swigluoai" : "silu");
        if (A->swiglu_limit > 0)
            printf(" (limit %g, alpha %g)", (double)A->swiglu_limit, (double)A->swiglu_alpha);
        printf(", %s%s routing, scaling %g\n", A->scoring == FP4_SCORE_SIGMOID ? "sigmoid" : "softmax",
               A->has_score_bias ? "+bias" : "", (double)A->routed_scaling);
        printf("quantization %s\n", fp4_qformat_name(fp4_quant_format(c->quant)));
        printf("device       %s%s, MoE backend %s\n", dev.name, arch ? "" : " (this machine)", backend ? backend : "auto");
        printf("layer groups:\n");
    }
    for (int L0 = 0; L0 < c->n_layers;) {
        int L1 = L0 + 1;
        while (L1 < c->n_layers && li[L1].moe == li[L0].moe && !memcmp(&li[L1].fc1, &li[L0].fc1, sizeof(fp4_scheme)) &&
               !memcmp(&li[L1].fc2, &li[L0].fc2, sizeof(fp4_scheme)) && li[L1].d.backend == li[L0].d.backend &&
               !strcmp(li[L1].error, li[L0].error) && !strcmp(li[L1].d.dropped, li[L0].d.dropped))
            L1++;
        const layer_info *g = &li[L0];
        char range[32], act[96];
        snprintf(range, sizeof range, L1 - L0 == 1 ? "%d" : "%d-%d", L0, L1 - 1);
        if (g->fc1.a == g->fc2.a)
            snprintf(act, sizeof act, "%s", fp4_ascheme_name(g->fc1.a));
        else
            snprintf(act, sizeof act, "fc1 %s, fc2 %s", fp4_ascheme_name(g->fc1.a), fp4_ascheme_name(g->fc2.a));
        if (!json) {
            printf("  %-6s %-7s %-5s %s weights %s, activations %s\n", L1 - L0 == 1 ? "layer" : "layers", range, g->moe ? "moe" : "dense",
                   g->moe ? "experts" : "mlp", fp4_wscheme_name(g->fc1.w), act);
            if (g->error[0])
                printf("                 error: %s\n", g->error);
            else if (g->moe) {
                char kern[128];
                fp4_backend_kernels_str(g->d.backend, kern, sizeof kern);
                printf("                 backend %s, precision %s%s%s\n", g->d.backend->name, g->d.precision,
                       g->d.dropped[0] ? ", dropped " : "", g->d.dropped);
                if (kern[0])
                    printf("                 kernel by size: %s\n", kern);
                if (g->d.backend->workspace)
                    printf("                 device workspace: %.1f MB for 1 token, %.1f MB for 4096\n",
                           g->d.backend->workspace(A, 1) / 1e6, g->d.backend->workspace(A, 4096) / 1e6);
            }
            else
                printf("                 backend reference (dense MLP layers run on the CPU reference)\n");
            char where[48], note[320];
            snprintf(where, sizeof where, "%s %s", L1 - L0 == 1 ? "layer" : "layers", range);
            fp4_decision_note(&g->d, where, note, sizeof note);
            if (note[0])
                fprintf(stderr, "fp4moe: %s\n", note);
        }
        for (int L = L0; L < L1; L++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "index", L);
            cJSON_AddStringToObject(o, "kind", li[L].moe ? "moe" : "dense");
            cJSON_AddNumberToObject(o, "experts", li[L].moe ? A->n_experts : 0);
            cJSON_AddStringToObject(o, "weight_scheme", fp4_wscheme_name(li[L].fc1.w));
            cJSON_AddStringToObject(o, "activation_scheme", fp4_ascheme_name(li[L].fc1.a));
            cJSON_AddStringToObject(o, "activation_scheme_fc2", fp4_ascheme_name(li[L].fc2.a));
            if (li[L].error[0]) {
                cJSON_AddNullToObject(o, "backend");
                cJSON_AddNullToObject(o, "precision");
                cJSON_AddNullToObject(o, "dropped");
                cJSON_AddStringToObject(o, "error", li[L].error);
            } else {
                cJSON_AddStringToObject(o, "backend", li[L].moe ? li[L].d.backend->name : "reference");
                cJSON_AddStringToObject(o, "precision", li[L].moe ? li[L].d.precision : "reference");
                char kern[128] = "";
                if (li[L].moe)
                    fp4_backend_kernels_str(li[L].d.backend, kern, sizeof kern);
                cJSON_AddStringToObject(o, "kernels", kern);
                if (li[L].moe && li[L].d.backend->workspace)
                    cJSON_AddNumberToObject(o, "workspace_bytes_4096", (double)li[L].d.backend->workspace(A, 4096));
                if (li[L].d.dropped[0])
                    cJSON_AddStringToObject(o, "dropped", li[L].d.dropped);
                else
                    cJSON_AddNullToObject(o, "dropped");
                cJSON_AddNullToObject(o, "error");
            }
            cJSON_AddItemToArray(jl, o);
        }
        L0 = L1;
    }
    int touched = fp4_ckpt_shards_opened(c);
    cJSON *js = cJSON_CreateArray(), *jb = cJSON_CreateObject();
    for (int s = 0; s < c->n_shards; s++)
        if (c->shards[s])
            cJSON_AddItemToArray(js, cJSON_CreateString(c->shard_files[s]));
    for (int k = 0; k < n_classes; k++)
        cJSON_AddNumberToObject(jb, classes[k], class_bytes[k]);
    if (!json) {
        printf("bytes by scheme:");
        for (int k = 0; k < n_classes; k++)
            printf(" %s %.1f MB%s", classes[k], class_bytes[k] / 1e6, k + 1 < n_classes ? "," : "");
        printf("\ntensors      %d, %.1f MB\n", c->n_entries, total / 1e6);
        printf("shards       %d touched of %d:", touched, c->n_shards);
        for (int s = 0; s < c->n_shards; s++)
            if (c->shards[s])
                printf(" %s", c->shard_files[s]);
        printf("\n");
        if (verify)
            printf("verify       %s\n", bad_total ? "FAILED: bad values found (listed above)" : "all tensors read: no NaN/Inf or out-of-range values");
    } else {
        cJSON_AddStringToObject(root, "model", dir);
        cJSON_AddStringToObject(root, "model_type", A->model_type);
        cJSON_AddStringToObject(root, "quantization", fp4_qformat_name(fp4_quant_format(c->quant)));
        cJSON_AddStringToObject(root, "device", dev.name);
        cJSON_AddStringToObject(root, "moe_backend", backend ? backend : "auto");
        cJSON_AddNumberToObject(root, "hidden", A->hidden);
        cJSON_AddNumberToObject(root, "num_layers", c->n_layers);
        cJSON_AddNumberToObject(root, "experts", A->n_experts);
        cJSON_AddNumberToObject(root, "moe_intermediate", A->moe_intermediate);
        cJSON_AddNumberToObject(root, "topk", A->topk);
        cJSON_AddItemToObject(root, "layers", jl);
        jl = NULL;
        cJSON_AddNumberToObject(root, "tensors", c->n_entries);
        cJSON_AddNumberToObject(root, "bytes", total);
        cJSON_AddItemToObject(root, "bytes_by_scheme", jb);
        jb = NULL;
        cJSON_AddItemToObject(root, "shards_touched", js);
        js = NULL;
        cJSON_AddNumberToObject(root, "shards_total", c->n_shards);
        if (verify) {
            cJSON_AddItemToObject(root, "verify", verify_items);
            verify_items = NULL;
        }
        char *text = cJSON_PrintUnformatted(root);
        if (text) {
            printf("%s\n", text);
            free(text);
        }
    }
    cJSON_Delete(jl);
    cJSON_Delete(jb);
    cJSON_Delete(js);
    cJSON_Delete(verify_items);
    cJSON_Delete(root);
    free(li);
    fp4_ckpt_close(c);
    return rc;
}
