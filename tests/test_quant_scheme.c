/*
 * test_quant_scheme.c - fp4_quant_parse / fp4_quant_scheme_for on JSON literals of every
 * metadata shape of DESIGN.md section 3 (ModelOpt hf_quant_config.json and config.json
 * forms, MIXED_PRECISION, compressed-tensors, MiniMax-M3.1), every accepted spelling of the
 * per-token activation scheme, FC1 vs FC2, exclude / ignore lists, and the errors (with
 * message content). Expected schemes are written out by hand.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_scheme.h"

#include "check.h"



enum { W_BF16 = FP4_W_BF16, W_NV = FP4_W_NVFP4, W_MX = FP4_W_MXFP8 };
enum { A_NONE = FP4_A_NONE, A_ST = FP4_A_NVFP4_STATIC, A_TOK = FP4_A_NVFP4_PER_TOKEN };

static cJSON *parse_json(const char *s)
{
    cJSON *c;
    if (!s)
        return NULL;
    c = cJSON_Parse(s);
    if (!c) {
        printf("FAIL: test JSON does not parse: %.100s\n", s);
        n_fail++;
    }
    return c;
}

static fp4moe_status run(const char *config, const char *hf, fp4_quant **q, fp4_err *e)
{
    cJSON *c = parse_json(config), *h = parse_json(hf);
    fp4moe_status st;
    fp4_err_clear(e);
    st = fp4_quant_parse(c, h, "/m", q, e);
    cJSON_Delete(c);
    cJSON_Delete(h);
    return st;
}

static fp4_quant *ok(const char *config, const char *hf, const char *label)
{
    fp4_quant *q = NULL;
    fp4_err e;
    fp4moe_status st = run(config, hf, &q, &e);
    CHECK(st == FP4MOE_OK && q, "%s: expected OK, got %s: %s", label, fp4moe_status_string(st),
          e.msg);
    return st == FP4MOE_OK ? q : NULL;
}

/* Expect status and every NULL-terminated substring in the message. */
static void err(const char *config, const char *hf, fp4moe_status want, const char *label, ...)
{
    fp4_quant *q = NULL;
    fp4_err e;
    fp4moe_status st = run(config, hf, &q, &e);
    va_list ap;
    const char *s;
    CHECK(st == want && !q, "%s: expected %s, got %s (%s)", label, fp4moe_status_string(want),
          fp4moe_status_string(st), e.msg);
    va_start(ap, label);
    while ((s = va_arg(ap, const char *)) != NULL)
        CHECK(strstr(e.msg, s) != NULL, "%s: message lacks \"%s\": %s", label, s, e.msg);
    va_end(ap);
    fp4_quant_destroy(q);
}

static void expect(const fp4_quant *q, const char *module, int w, int a, const char *label)
{
    fp4_scheme s;
    if (!q)
        return;
    s = fp4_quant_scheme_for(q, module);
    CHECK((int)s.w == w && (int)s.a == a, "%s: module %s: got %s/%s, want %s/%s", label, module,
          fp4_wscheme_name(s.w), fp4_ascheme_name(s.a), fp4_wscheme_name((fp4_wscheme)w),
          fp4_ascheme_name((fp4_ascheme)a));
}

#define EXP_M "model.layers.3.mlp.experts.5.gate_proj"

static void test_names_and_none(void)
{
    fp4_quant *q;
    CHECK(!strcmp(fp4_wscheme_name(FP4_W_NVFP4), "nvfp4") &&
          !strcmp(fp4_wscheme_name(FP4_W_MXFP8), "mxfp8") &&
          !strcmp(fp4_wscheme_name(FP4_W_BF16), "bf16"), "weight scheme names");
    CHECK(!strcmp(fp4_ascheme_name(FP4_A_NONE), "none") &&
          !strcmp(fp4_ascheme_name(FP4_A_NVFP4_STATIC), "nvfp4-static") &&
          !strcmp(fp4_ascheme_name(FP4_A_NVFP4_PER_TOKEN), "nvfp4-per-token"),
          "activation scheme names");
    CHECK(!strcmp(fp4_qformat_name(FP4_QF_NONE), "none") &&
          !strcmp(fp4_qformat_name(FP4_QF_MODELOPT), "modelopt") &&
          !strcmp(fp4_qformat_name(FP4_QF_COMPRESSED_TENSORS), "compressed-tensors") &&
          !strcmp(fp4_qformat_name(FP4_QF_MINIMAX_M31), "minimax-m31"), "format names");
    q = ok("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64}", NULL, "no metadata");
    if (q) {
        CHECK(fp4_quant_format(q) == FP4_QF_NONE, "format none");
        expect(q, EXP_M, W_BF16, A_NONE, "none");
        expect(q, "lm_head", W_BF16, A_NONE, "none");
    }
    fp4_quant_destroy(q);
}

static void test_modelopt(void)
{
    char cfg[1024];
    fp4_quant *q = ok("{}", "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": "
                      "{\"quant_algo\": \"NVFP4\", \"group_size\": 16, \"kv_cache_quant_algo\": "
                      "null, \"exclude_modules\": [\"lm_head\", \"*.mlp.gate\", "
                      "\"model.layers.0.self_attn\"]}}", "modelopt nvfp4");
    if (q) {
        CHECK(fp4_quant_format(q) == FP4_QF_MODELOPT, "format modelopt");
        expect(q, EXP_M, W_NV, A_ST, "NVFP4 -> static");
        expect(q, "lm_head", W_BF16, A_NONE, "excluded exactly");
        expect(q, "model.layers.3.mlp.gate", W_BF16, A_NONE, "excluded by glob");
        expect(q, "model.layers.3.mlp.gate_proj", W_NV, A_ST, "glob does not match gate_proj");
        expect(q, "model.layers.0.self_attn.q_proj", W_BF16, A_NONE, "excluded as prefix");
        expect(q, "model.layers.1.self_attn.q_proj", W_NV, A_ST, "other layer kept");
        expect(q, "model.layers.0.self_attn_x", W_NV, A_ST, "prefix needs a dot");
    }
    fp4_quant_destroy(q);

    q = ok(NULL, "{\"quantization\": {\"quant_algo\": \"W4A16_NVFP4\"}}", "w4a16");
    expect(q, EXP_M, W_NV, A_NONE, "W4A16_NVFP4 -> none");
    fp4_quant_destroy(q);
    q = ok(NULL, "{\"quantization\": {\"quant_algo\": \"MXFP8\", \"group_size\": 32}}", "mxfp8");
    expect(q, EXP_M, W_MX, A_NONE, "MXFP8");
    fp4_quant_destroy(q);
    q = ok(NULL, "{\"quantization\": {\"quant_algo\": null, \"kv_cache_quant_algo\": \"FP8\"}}",
           "kv only");
    expect(q, EXP_M, W_BF16, A_NONE, "quant_algo null");
    fp4_quant_destroy(q);

    /* every activation_scheme spelling */
    {
        static const struct { const char *v; int a; } sp[] = {
            {"static", A_ST}, {"dynamic_per_token", A_TOK}, {"per_token", A_TOK},
            {"per-token", A_TOK}, {"token", A_TOK}, {"none", A_NONE},
            {"DYNAMIC_PER_TOKEN", A_TOK}, {"Static", A_ST},
        };
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
            snprintf(cfg, sizeof cfg, "{\"quantization\": {\"quant_algo\": \"NVFP4\", "
                     "\"activation_scheme\": \"%s\"}}", sp[i].v);
            q = ok(NULL, cfg, sp[i].v);
            expect(q, EXP_M, W_NV, sp[i].a, sp[i].v);
            fp4_quant_destroy(q);
        }
    }
    q = ok(NULL, "{\"quantization\": {\"quant_algo\": \"W4A16_NVFP4\", \"activation_scheme\": "
           "\"none\"}}", "w4a16 + none");
    expect(q, EXP_M, W_NV, A_NONE, "w4a16 + none");
    fp4_quant_destroy(q);
    q = ok(NULL, "{\"quantization\": {\"quant_algo\": \"MXFP8\", \"activation_scheme\": "
           "\"none\"}}", "mxfp8 + none");
    expect(q, EXP_M, W_MX, A_NONE, "mxfp8 + none");
    fp4_quant_destroy(q);

    /* config.json forms: flat at top level (with "ignore"), under text_config, nested */
    q = ok("{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\","
           " \"activation_scheme\": \"per_token\", \"ignore\": [\"lm_head\", "
           "\"model.layers.*.mlp.gate\"]}}", NULL, "config flat");
    if (q) {
        CHECK(fp4_quant_format(q) == FP4_QF_MODELOPT, "config modelopt format");
        expect(q, EXP_M, W_NV, A_TOK, "config flat per-token");
        expect(q, "lm_head", W_BF16, A_NONE, "config ignore");
        expect(q, "model.layers.9.mlp.gate", W_BF16, A_NONE, "config ignore glob");
    }
    fp4_quant_destroy(q);
    q = ok("{\"text_config\": {\"quantization_config\": {\"quant_method\": \"modelopt\", "
           "\"quant_algo\": \"W4A16_NVFP4\", \"exclude_modules\": "
           "[\"language_model.model.layers.2.*\"]}}}", NULL, "config under text_config");
    if (q) {
        expect(q, EXP_M, W_NV, A_NONE, "text_config modelopt");
        expect(q, "model.layers.2.mlp.experts.0.down_proj", W_BF16, A_NONE,
               "exclude written with language_model. prefix");
    }
    fp4_quant_destroy(q);
    q = ok("{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quantization\": "
           "{\"quant_algo\": \"MXFP8\"}}}", NULL, "config nested");
    expect(q, EXP_M, W_MX, A_NONE, "config nested");
    fp4_quant_destroy(q);

    /* both files: hf_quant_config wins */
    q = ok("{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": "
           "\"NVFP4\"}}", "{\"quantization\": {\"quant_algo\": \"W4A16_NVFP4\"}}", "both");
    expect(q, EXP_M, W_NV, A_NONE, "hf_quant_config wins");
    fp4_quant_destroy(q);
}

static void test_modelopt_mixed(void)
{
    fp4_quant *q = ok(NULL,
        "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"activation_scheme\": "
        "\"dynamic_per_token\", \"exclude_modules\": [\"model.layers.5.mlp.experts.1.*\"], "
        "\"quantized_layers\": {"
        "\"model.layers.*.mlp.experts.*\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16},"
        "\"model.layers.3.mlp\": {\"quant_algo\": \"MXFP8\"},"
        "\"model.layers.3.mlp.experts\": {\"quant_algo\": \"W4A16_NVFP4\"},"
        "\"model.layers.3.mlp.experts.0.gate_proj\": {\"quant_algo\": \"NVFP4\", "
        "\"activation_scheme\": \"static\"},"
        "\"model.layers.*.self_attn.*\": {\"quant_algo\": \"MXFP8\"},"
        "\"model.layers.*.self_attn.o_proj\": {\"quant_algo\": \"W4A16_NVFP4\"}}}}", "mixed");
    if (!q)
        return;
    expect(q, "model.layers.3.mlp.experts.0.gate_proj", W_NV, A_ST, "exact wins");
    expect(q, "model.layers.3.mlp.experts.0.up_proj", W_NV, A_NONE, "longest prefix");
    expect(q, "model.layers.3.mlp.shared_experts.gate_proj", W_MX, A_NONE, "shorter prefix");
    expect(q, "model.layers.4.mlp.experts.2.down_proj", W_NV, A_TOK,
           "glob; top-level activation_scheme inherited");
    expect(q, "model.layers.4.self_attn.q_proj", W_MX, A_NONE, "glob");
    expect(q, "model.layers.4.self_attn.o_proj", W_MX, A_NONE, "globs: first in file order");
    expect(q, "model.layers.4.mlp.gate", W_BF16, A_NONE, "unlisted -> bf16");
    expect(q, "model.layers.5.mlp.experts.1.gate_proj", W_BF16, A_NONE, "exclude wins");
    expect(q, "model.layers.5.mlp.experts.2.gate_proj", W_NV, A_TOK, "not excluded");
    expect(q, "lm_head", W_BF16, A_NONE, "lm_head unlisted");
    fp4_quant_destroy(q);

    q = ok(NULL, "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\":"
           " {\"model.layers.1.mlp.experts\": {\"quant_algo\": \"NVFP4\", \"activation_scheme\":"
           " \"per-token\"}, \"model.layers.2.mlp.experts\": {\"quant_algo\": \"NVFP4\"}}}}",
           "mixed per-entry activation");
    expect(q, "model.layers.1.mlp.experts.0.gate_proj", W_NV, A_TOK, "entry per-token");
    expect(q, "model.layers.2.mlp.experts.0.gate_proj", W_NV, A_ST, "entry NVFP4 static");
    fp4_quant_destroy(q);

    err(NULL, "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": "
        "{\"model.layers.0.self_attn.q_proj\": {\"quant_algo\": \"FP8\"}}}}",
        FP4MOE_ERR_NOT_SUPPORTED, "mixed FP8 entry", "FP8",
        "quantization.quantized_layers.model.layers.0.self_attn.q_proj.quant_algo", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": "
        "{\"x\": {\"quant_algo\": \"INT4_AWQ\"}}}}", FP4MOE_ERR_FORMAT, "mixed unknown entry",
        "unknown quant_algo 'INT4_AWQ'", "quantization.quantized_layers.x.quant_algo", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": "
        "{\"x\": {\"quant_algo\": \"MIXED_PRECISION\"}}}}", FP4MOE_ERR_FORMAT, "nested mixed",
        "MIXED_PRECISION", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\"}}", FP4MOE_ERR_FORMAT,
        "mixed without layers", "'quantization.quantized_layers'", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": "
        "{\"x\": {\"quant_algo\": \"NVFP4\", \"group_size\": 32}}}}", FP4MOE_ERR_FORMAT,
        "entry group_size", "quantization.quantized_layers.x.group_size", "16", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": "
        "{\"x\": {\"quant_algo\": \"MXFP8\", \"activation_scheme\": \"token\"}}}}",
        FP4MOE_ERR_FORMAT, "entry A4 on mxfp8", "only NVFP4", NULL);
}

static void test_modelopt_errors(void)
{
    fp4_quant *q = NULL;
    fp4_err e;
    run(NULL, "{\"quantization\": {\"quant_algo\": \"NVFP5\"}}", &q, &e);
    CHECK(!strcmp(e.msg, "unknown quant_algo 'NVFP5' in /m/hf_quant_config.json key "
                  "'quantization.quant_algo' (expected one of NVFP4, W4A16_NVFP4, MXFP8, "
                  "MIXED_PRECISION)") && e.status == FP4MOE_ERR_FORMAT,
          "exact unknown-algo message: %s", e.msg);
    err("{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"W8A8\"}}",
        NULL, FP4MOE_ERR_FORMAT, "config unknown algo", "unknown quant_algo 'W8A8'",
        "/m/config.json", "'quantization_config.quant_algo'", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"FP8\"}}", FP4MOE_ERR_NOT_SUPPORTED, "FP8",
        "FP8", "'quantization.quant_algo'", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": 4}}", FP4MOE_ERR_FORMAT, "algo not string",
        "'quantization.quant_algo'", NULL);
    err(NULL, "{\"quantization\": {\"group_size\": 16}}", FP4MOE_ERR_FORMAT, "algo missing",
        "'quantization.quant_algo'", "missing", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 32}}",
        FP4MOE_ERR_FORMAT, "nvfp4 group 32", "'quantization.group_size'", "16", "32", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"activation_scheme\": "
        "\"dynamic\"}}", FP4MOE_ERR_FORMAT, "unknown activation spelling",
        "'quantization.activation_scheme'", "\"dynamic\"", "dynamic_per_token", "per-token",
        "\"token\"", "\"static\"", "\"none\"", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"W4A16_NVFP4\", \"activation_scheme\": "
        "\"per_token\"}}", FP4MOE_ERR_FORMAT, "w4a16 + per-token", "contradicts", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"MXFP8\", \"activation_scheme\": "
        "\"static\"}}", FP4MOE_ERR_FORMAT, "mxfp8 + static", "only NVFP4", "mxfp8", NULL);
    err(NULL, "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"exclude_modules\": "
        "\"lm_head\"}}", FP4MOE_ERR_FORMAT, "exclude not a list",
        "'quantization.exclude_modules'", NULL);
    err(NULL, "{\"quant_algo\": \"NVFP4\"}", FP4MOE_ERR_FORMAT, "hf without quantization",
        "hf_quant_config.json", "'quantization'", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"compressed-tensors\"}}",
        "{\"quantization\": {\"quant_algo\": \"NVFP4\"}}", FP4MOE_ERR_FORMAT, "files disagree",
        "/m/hf_quant_config.json", "/m/config.json", "compressed-tensors", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}}", NULL,
        FP4MOE_ERR_NOT_SUPPORTED, "gptq", "\"gptq\"", "'quantization_config.quant_method'",
        NULL);
    err("{\"quantization_config\": {\"quant_algo\": \"NVFP4\"}}", NULL, FP4MOE_ERR_FORMAT,
        "quant_method missing", "'quantization_config.quant_method'", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\"},"
        " \"text_config\": {\"quantization_config\": {\"quant_method\": \"modelopt\", "
        "\"quant_algo\": \"MXFP8\"}}}", NULL, FP4MOE_ERR_FORMAT, "two differing configs",
        "text_config.quantization_config", NULL);
}

#define NVW "\"weights\": {\"num_bits\": 4, \"type\": \"float\", \"strategy\": " \
            "\"tensor_group\", \"group_size\": 16, \"symmetric\": true, \"dynamic\": false}"
#define MXW "\"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"group\", " \
            "\"group_size\": 32}"
#define TOK "{\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"token\", \"dynamic\": true}"
#define STAT "{\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"tensor_group\", " \
             "\"dynamic\": false}"

static void test_ct(void)
{
    char cfg[2048];
    fp4_quant *q = ok(
        "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
        "\"nvfp4-pack-quantized\", \"config_groups\": {"
        "\"group_0\": {\"targets\": [\"Linear\"], " NVW ", \"input_activations\": null},"
        "\"group_1\": {\"targets\": [\"re:.*experts\\\\.\\\\d+\\\\.(gate|up)_proj$\"], " NVW ", "
        "\"input_activations\": " TOK "},"
        "\"group_2\": {\"targets\": [\"re:.*experts\\\\.\\\\d+\\\\.down_proj$\"], " NVW ", "
        "\"input_activations\": " STAT "},"
        "\"group_3\": {\"targets\": [\"model.layers.1.mlp.experts.0.gate_proj\"], " NVW "},"
        "\"group_4\": {\"targets\": [\"re:.*self_attn.*\"], " MXW ", \"format\": "
        "\"float-quantized\"},"
        "\"group_5\": {\"targets\": [\"re:.*self_attn\\\\.o_proj\"], " NVW "},"
        "\"group_6\": {\"targets\": [\"re:language_model\\\\.model\\\\.layers\\\\.7\\\\..*\"], "
        NVW ", \"input_activations\": " STAT "}},"
        "\"ignore\": [\"lm_head\", \"re:.*mlp\\\\.gate$\"]}}", NULL, "compressed-tensors");
    if (q) {
        CHECK(fp4_quant_format(q) == FP4_QF_COMPRESSED_TENSORS, "format ct");
        expect(q, "model.layers.1.mlp.experts.0.gate_proj", W_NV, A_NONE, "exact > regex");
        expect(q, "model.layers.1.mlp.experts.1.gate_proj", W_NV, A_TOK, "FC1 gate per-token");
        expect(q, "model.layers.1.mlp.experts.1.up_proj", W_NV, A_TOK, "FC1 up per-token");
        expect(q, "model.layers.1.mlp.experts.1.down_proj", W_NV, A_ST, "FC2 static");
        expect(q, "model.layers.1.self_attn.q_proj", W_MX, A_NONE, "mxfp8 group");
        expect(q, "model.layers.1.self_attn.o_proj", W_MX, A_NONE, "regex tie: file order");
        expect(q, "model.layers.1.mlp.shared_experts.gate_proj", W_NV, A_NONE, "Linear");
        expect(q, "model.layers.1.mlp.gate", W_BF16, A_NONE, "ignored by regex");
        expect(q, "model.layers.1.mlp.gate_proj", W_NV, A_NONE, "$ anchors the ignore regex");
        expect(q, "lm_head", W_BF16, A_NONE, "ignored exactly");
        expect(q, "model.layers.7.mlp.shared_experts.up_proj", W_NV, A_ST,
               "regex written for language_model. names");
        expect(q, "model.layers.1.mlp.experts.1.gate_proj_x", W_NV, A_NONE, "$ in target");
    }
    fp4_quant_destroy(q);

    /* regexes anchor at the start only (re.match), \d only matches digits, dynamic "local" */
    q = ok("{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", "
           "\"config_groups\": {\"g\": {\"targets\": [\"re:model\\\\.layers\\\\.\\\\d\\\\.mlp\"],"
           " " NVW ", \"input_activations\": {\"num_bits\": 4, \"type\": \"float\", "
           "\"strategy\": \"tensor_group\", \"dynamic\": \"local\"}}}}}", NULL, "ct anchors");
    expect(q, "model.layers.4.mlp.experts.0.w1", W_NV, A_ST, "prefix regex + local");
    expect(q, "model.layers.x.mlp.experts.0.w1", W_BF16, A_NONE, "\\d needs a digit");
    expect(q, "x.model.layers.4.mlp.experts.0.w1", W_BF16, A_NONE, "anchored at start");
    fp4_quant_destroy(q);

    /* errors, each naming group and key */
    static const struct { const char *group; fp4moe_status st; const char *want; } bad[] = {
        {"{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\", "
         "\"strategy\": \"tensor_group\", \"group_size\": 32}}", FP4MOE_ERR_FORMAT,
         "config_groups.g.weights.group_size"},
        {"{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", "
         "\"strategy\": \"group\", \"group_size\": 128}}", FP4MOE_ERR_FORMAT,
         "config_groups.g.weights.type"},
        {"{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\", "
         "\"strategy\": \"channel\", \"group_size\": 16}}", FP4MOE_ERR_FORMAT,
         "config_groups.g.weights.strategy"},
        {"{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": \"float\", "
         "\"strategy\": \"channel\"}}", FP4MOE_ERR_FORMAT, "config_groups.g.weights.strategy"},
        {"{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 6, \"type\": \"float\"}}",
         FP4MOE_ERR_FORMAT, "config_groups.g.weights.num_bits"},
        {"{\"targets\": [\"Linear\"], " NVW ", \"input_activations\": {\"num_bits\": 4, "
         "\"type\": \"float\", \"strategy\": \"tensor\", \"dynamic\": true}}",
         FP4MOE_ERR_FORMAT, "config_groups.g.input_activations"},
        {"{\"targets\": [\"Linear\"], " NVW ", \"input_activations\": {\"num_bits\": 4, "
         "\"type\": \"float\", \"strategy\": \"token\", \"dynamic\": false}}",
         FP4MOE_ERR_FORMAT, "config_groups.g.input_activations"},
        {"{\"targets\": [\"Linear\"], " NVW ", \"input_activations\": {\"num_bits\": 8, "
         "\"type\": \"float\", \"strategy\": \"token\", \"dynamic\": true}}",
         FP4MOE_ERR_FORMAT, "config_groups.g.input_activations"},
        {"{\"targets\": [\"Linear\"], " MXW ", \"input_activations\": " TOK "}",
         FP4MOE_ERR_FORMAT, "only NVFP4"},
        {"{\"targets\": [\"Linear\"], " NVW ", \"format\": \"float-quantized\"}",
         FP4MOE_ERR_FORMAT, "config_groups.g.format"},
        {"{\"targets\": [], " NVW "}", FP4MOE_ERR_FORMAT, "config_groups.g.targets"},
        {"{\"targets\": [\"Linear\"]}", FP4MOE_ERR_FORMAT, "config_groups.g.weights"},
        {"{\"targets\": [\"re:(\"], " NVW "}", FP4MOE_ERR_FORMAT, "bad regex"},
        {"{\"targets\": [\"re:(?:a|b)\"], " NVW "}", FP4MOE_ERR_FORMAT, "(?"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cfg, sizeof cfg, "{\"quantization_config\": {\"quant_method\": "
                 "\"compressed-tensors\", \"config_groups\": {\"g\": %s}}}", bad[i].group);
        err(cfg, NULL, bad[i].st, bad[i].want, bad[i].want, "/m/config.json", NULL);
    }
    err("{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
        "\"int-quantized\", \"config_groups\": {\"g\": {\"targets\": [\"Linear\"], " NVW "}}}}",
        NULL, FP4MOE_ERR_FORMAT, "top format", "'quantization_config.format'",
        "nvfp4-pack-quantized", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"compressed-tensors\"}}", NULL,
        FP4MOE_ERR_FORMAT, "no groups", "'quantization_config.config_groups'", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"config_groups\":"
        " {\"g\": {\"targets\": [\"Linear\"], " NVW "}}, \"ignore\": [\"re:[\"]}}", NULL,
        FP4MOE_ERR_FORMAT, "bad ignore regex", "'quantization_config.ignore'", NULL);
}

#define MM_HEAD "{\"model_type\": \"minimax_m3_vl\", \"text_config\": {\"hidden_size\": 6144}, " \
                "\"quantization_config\": {\"quant_method\": \"mxfp8\", \"weight_block_size\": " \
                "[1, 32], \"moe_quant_algo\": \"NVFP4\", \"moe_quant_format\": " \
                "\"nvfp4-pack-quantized\""

#define E1 "model.layers.3.block_sparse_moe.experts.5.w1"
#define E3 "model.layers.3.block_sparse_moe.experts.5.w3"
#define E2 "model.layers.3.block_sparse_moe.experts.5.w2"

static void mm_case(const char *extra, int a1, int a2, const char *label)
{
    char cfg[2048];
    fp4_quant *q;
    snprintf(cfg, sizeof cfg, MM_HEAD "%s}}", extra);
    q = ok(cfg, NULL, label);
    expect(q, E1, W_NV, a1, label);
    expect(q, E3, W_NV, a1, label);
    expect(q, E2, W_NV, a2, label);
    expect(q, "model.layers.3.mlp.experts.5.gate_proj", W_NV, a1, label);
    expect(q, "model.layers.3.mlp.experts.5.up_proj", W_NV, a1, label);
    expect(q, "model.layers.3.mlp.experts.5.down_proj", W_NV, a2, label);
    fp4_quant_destroy(q);
}

static void test_minimax(void)
{
    char cfg[2048];
    fp4_quant *q = ok(MM_HEAD ", \"moe_fc1_activation_scheme\": \"dynamic_per_token\", "
                      "\"ignored_layers\": [\"model.layers.0.self_attn.q_proj\"], "
                      "\"modules_to_not_convert\": [\"re:.*index_k_proj\"]}}", NULL, "m3.1");
    if (q) {
        CHECK(fp4_quant_format(q) == FP4_QF_MINIMAX_M31, "format minimax");
        expect(q, E1, W_NV, A_TOK, "FC1 w1 per-token");
        expect(q, E3, W_NV, A_TOK, "FC1 w3 per-token");
        expect(q, E2, W_NV, A_NONE, "FC2 w2 none");
        expect(q, "model.layers.3.block_sparse_moe.shared_experts.gate_proj", W_MX, A_NONE,
               "shared expert is base");
        expect(q, "model.layers.0.mlp.gate_proj", W_MX, A_NONE, "dense MLP mxfp8");
        expect(q, "model.layers.0.self_attn.q_proj", W_BF16, A_NONE, "ignored_layers");
        expect(q, "model.layers.1.self_attn.q_proj", W_MX, A_NONE, "attention mxfp8");
        expect(q, "model.layers.1.self_attn.index_k_proj", W_BF16, A_NONE,
               "modules_to_not_convert regex");
        expect(q, "lm_head", W_BF16, A_NONE, "lm_head bf16");
        expect(q, "model.layers.3.block_sparse_moe.gate", W_BF16, A_NONE, "router bf16");
    }
    fp4_quant_destroy(q);

    mm_case("", A_NONE, A_NONE, "no activation keys");
    mm_case(", \"moe_activation_scheme\": \"per-token\"", A_TOK, A_TOK, "both per-token");
    mm_case(", \"moe_activation_scheme\": \"token\", \"moe_fc2_activation_scheme\": \"static\"",
            A_TOK, A_ST, "fc2 overrides");
    mm_case(", \"moe_activation_scheme\": \"static\", \"moe_fc1_activation_scheme\": "
            "\"per_token\"", A_TOK, A_ST, "fc1 overrides");
    mm_case(", \"moe_fc1_activation_scheme\": \"per_token\", \"moe_fc2_activation_scheme\": "
            "\"none\"", A_TOK, A_NONE, "fc2 none");
    mm_case(", \"moe_input_activations\": " TOK, A_TOK, A_TOK, "moe_input_activations");
    mm_case(", \"moe_input_activations\": " TOK ", \"moe_fc2_activation_scheme\": \"none\"",
            A_TOK, A_NONE, "input_activations + fc2 none");
    mm_case(", \"moe_input_activations\": null", A_NONE, A_NONE, "input_activations null");

    /* the stacked gate+up spelling is FC1 too */
    q = ok(MM_HEAD ", \"moe_fc1_activation_scheme\": \"token\"}}", NULL, "stacked");
    expect(q, "model.layers.3.block_sparse_moe.experts.5.w13", W_NV, A_TOK, "w13 is FC1");
    fp4_quant_destroy(q);

    /* quantization_config under text_config; no moe_quant_algo -> experts mxfp8 */
    q = ok("{\"text_config\": {\"quantization_config\": {\"quant_method\": \"mxfp8\"}}}", NULL,
           "minimax plain");
    expect(q, E1, W_MX, A_NONE, "experts follow base");
    expect(q, "model.layers.0.self_attn.o_proj", W_MX, A_NONE, "base");
    fp4_quant_destroy(q);

    snprintf(cfg, sizeof cfg, MM_HEAD ", \"moe_activation_scheme\": \"token\", "
             "\"moe_input_activations\": " TOK "}}");
    err(cfg, NULL, FP4MOE_ERR_FORMAT, "both spellings", "moe_activation_scheme",
        "moe_input_activations", NULL);
    snprintf(cfg, sizeof cfg, MM_HEAD ", \"moe_fc1_activation_scheme\": \"bogus\"}}");
    err(cfg, NULL, FP4MOE_ERR_FORMAT, "bad fc1 value",
        "'quantization_config.moe_fc1_activation_scheme'", "\"bogus\"", "dynamic_per_token",
        "per-token", NULL);
    snprintf(cfg, sizeof cfg, MM_HEAD ", \"moe_fc2_activation_scheme\": 1}}");
    err(cfg, NULL, FP4MOE_ERR_FORMAT, "fc2 not string", "moe_fc2_activation_scheme", NULL);
    snprintf(cfg, sizeof cfg, MM_HEAD ", \"moe_input_activations\": {\"num_bits\": 4, "
             "\"type\": \"float\", \"strategy\": \"token\"}}}");
    err(cfg, NULL, FP4MOE_ERR_FORMAT, "token needs dynamic",
        "'quantization_config.moe_input_activations'", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"mxfp8\", \"moe_quant_algo\": \"MXFP8\","
        " \"moe_activation_scheme\": \"per_token\"}}", NULL, FP4MOE_ERR_FORMAT,
        "A4 on mxfp8 experts", "only NVFP4", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"mxfp8\", \"moe_quant_algo\": \"INT4\"}}",
        NULL, FP4MOE_ERR_FORMAT, "unknown moe algo", "'INT4'",
        "'quantization_config.moe_quant_algo'", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"mxfp8\", \"moe_quant_algo\": \"FP8\"}}",
        NULL, FP4MOE_ERR_NOT_SUPPORTED, "fp8 moe algo", "FP8", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"mxfp8\", \"weight_block_size\": "
        "[128, 128]}}", NULL, FP4MOE_ERR_FORMAT, "block size",
        "'quantization_config.weight_block_size'", "[128,128]", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"mxfp8\", \"moe_quant_algo\": \"NVFP4\","
        " \"moe_quant_format\": \"float-quantized\"}}", NULL, FP4MOE_ERR_FORMAT, "moe format",
        "'quantization_config.moe_quant_format'", NULL);
    err("{\"quantization_config\": {\"quant_method\": \"mxfp8\", \"ignored_layers\": [3]}}",
        NULL, FP4MOE_ERR_FORMAT, "ignored_layers entries", "'quantization_config.ignored_layers'",
        NULL);
    err("{\"quantization_config\": {\"quant_method\": \"mxfp8\"}}",
        "{\"quantization\": {\"quant_algo\": \"NVFP4\"}}", FP4MOE_ERR_FORMAT,
        "mxfp8 beside hf_quant_config", "hf_quant_config.json", "config.json", "\"mxfp8\"",
        NULL);
}

int main(void)
{
    test_names_and_none();
    test_modelopt();
    test_modelopt_mixed();
    test_modelopt_errors();
    test_ct();
    test_minimax();
    return check_done();
}
