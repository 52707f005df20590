/*
 * quant_scheme.c - normalize the quantization metadata shapes of DESIGN.md section 3 into
 * rules that answer, for one linear module, {weight scheme, activation scheme}.
 *
 * Where the metadata is read:
 *   hf_quant_config.json {"quantization": {...}}                      -> ModelOpt
 *   config.json quantization_config (top level or under text_config; both present and
 *   different is an error) by quant_method: "modelopt" (keys flat, or nested under
 *   "quantization" as in hf_quant_config), "compressed-tensors", "mxfp8" (MiniMax-M3.1).
 *   Both files present: hf_quant_config wins when config says modelopt too; any other
 *   quant_method beside hf_quant_config.json is an error naming both files.
 *   No metadata: FP4_QF_NONE, every module bf16/none.
 *
 * ModelOpt: quant_algo NVFP4 -> nvfp4/nvfp4-static, W4A16_NVFP4 -> nvfp4/none, MXFP8 ->
 * mxfp8/none, FP8 -> NOT_SUPPORTED, null -> nothing quantized (kv-cache-only exports),
 * MIXED_PRECISION -> per module from "quantized_layers" {key: {"quant_algo", ...}}; modules
 * no key matches are bf16. A key matches exactly (wins), as a dotted prefix (longest wins)
 * or as an fnmatch glob (first in file order wins). group_size, where present, must be 16
 * for NVFP4 and 32 for MXFP8. "exclude_modules" and "ignore" (the flat config.json
 * spelling) list globs; a module matching one, or lying under one (pattern + ".*"), is
 * bf16/none, whatever quantized_layers says. With MIXED_PRECISION a top-level
 * activation_scheme is the default of the NVFP4 entries that have none of their own.
 *
 * compressed-tensors: config_groups {name: {targets, weights, input_activations, format?}},
 * "ignore". weights {num_bits 4, type float, strategy tensor_group, group_size 16} -> nvfp4
 * (format, group or top level, must then be "nvfp4-pack-quantized" if given); {num_bits 8,
 * type float, strategy group, group_size 32} -> mxfp8 (format not checked). Targets:
 * "Linear" (any module), "re:<regex>", or an exact module name (any other class name thus
 * matches nothing). Most specific wins: exact > regex > Linear, ties by file order. Regexes
 * follow compressed-tensors' re.match: anchored at the start of the name, not at its end
 * (write "$" to anchor the end); they run as POSIX ERE with \d \w \s (and upper-case
 * negations) translated; Perl-only "(?" groups are refused. Ignore entries: "re:" regex, or
 * a name / glob as for ModelOpt. Modules no group targets are bf16.
 *
 * MiniMax-M3.1 {"quant_method": "mxfp8", "weight_block_size": [1, 32], "moe_quant_algo":
 * "NVFP4", "moe_quant_format": "nvfp4-pack-quantized"}: every linear mxfp8/none, except
 * modules listed in "ignored_layers" / "modules_to_not_convert" (patterns as for ignore),
 * lm_head and the routers (*.block_sparse_moe.gate, *.mlp.gate) -> bf16 (an mxfp8 config,
 * like other block-FP8 configs, leaves the head and router unquantized); routed experts
 * (module contains ".experts.<digits>.") -> moe_quant_algo NVFP4 (or MXFP8; absent: mxfp8)
 * with the activation scheme below. Shared experts (".shared_experts.") are not routed.
 *
 * Every accepted spelling of an activation scheme (the per-token FC1 declaration included):
 *   compressed-tensors input_activations (also MiniMax "moe_input_activations"):
 *     null or absent                                                  -> none
 *     {num_bits 4, type float, strategy "tensor_group", dynamic false | "local" (or absent)}
 *                                                                     -> nvfp4-static
 *     {num_bits 4, type float, strategy "token", dynamic true}        -> nvfp4-per-token
 *   ModelOpt "activation_scheme" beside quant_algo (in the quantization object or in one
 *   quantized_layers entry), and the MiniMax keys "moe_activation_scheme" (FC1 and FC2),
 *   "moe_fc1_activation_scheme" (w1 / w3 / gate_proj / up_proj, stacked w13 / gate_up_proj
 *   too), "moe_fc2_activation_scheme" (w2 / down_proj); values, case-insensitive:
 *     "static"                                                        -> nvfp4-static
 *     "dynamic_per_token" | "per_token" | "per-token" | "token"       -> nvfp4-per-token
 *     "none"                                                          -> none
 *   MiniMax precedence per expert linear: moe_fc1/fc2_activation_scheme, then
 *   moe_activation_scheme or moe_input_activations (both present is an error), then none.
 * An A4 scheme (static or per-token) with a non-NVFP4 weight, or with W4A16_NVFP4, is a
 * FORMAT error, as is any other value.
 *
 * Every pattern and exact key is tried against the module name as given ("model.layers...",
 * "lm_head"), as "language_model." + name, and with "model." replaced by
 * "model.language_model.", so metadata written for a text_config model's full names matches.
 */
#include "quant_scheme.h"

#include <fnmatch.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MOD_MAX 512

typedef enum rule_kind { RK_MODELOPT = 0, RK_CT_LINEAR, RK_CT_REGEX, RK_CT_EXACT } rule_kind;

/* A name pattern: "re:" regex, or an exact name / fnmatch glob (also matching below it). */
typedef struct pat {
    char *s;      /* as written (without "re:") */
    char *under;  /* s + ".*": matches the modules below s */
    int is_re;
    regex_t re;
} pat;

typedef struct rule {
    rule_kind kind;
    pat p;
    fp4_scheme s;
} rule;

struct fp4_quant {
    fp4_qformat fmt;
    int mixed;          /* ModelOpt MIXED_PRECISION: rules decide, else base */
    fp4_scheme base;    /* modules no rule decides */
    pat *excl;          /* -> bf16/none */
    int n_excl;
    rule *rules;
    int n_rules;
    fp4_scheme moe_fc1, moe_fc2, moe_other; /* MiniMax form: routed experts */
};

static const fp4_scheme k_bf16 = {FP4_W_BF16, FP4_A_NONE};

const char *fp4_wscheme_name(fp4_wscheme w)
{
    switch (w) {
    case FP4_W_BF16: return "bf16";
    case FP4_W_NVFP4: return "nvfp4";
    case FP4_W_MXFP8: return "mxfp8";
    }
    return "?";
}

const char *fp4_ascheme_name(fp4_ascheme a)
{
    switch (a) {
    case FP4_A_NONE: return "none";
    case FP4_A_NVFP4_STATIC: return "nvfp4-static";
    case FP4_A_NVFP4_PER_TOKEN: return "nvfp4-per-token";
    }
    return "?";
}

const char *fp4_qformat_name(fp4_qformat f)
{
    switch (f) {
    case FP4_QF_NONE: return "none";
    case FP4_QF_MODELOPT: return "modelopt";
    case FP4_QF_COMPRESSED_TENSORS: return "compressed-tensors";
    case FP4_QF_MINIMAX_M31: return "minimax-m31";
    }
    return "?";
}

/* Where we are, for messages: file and the dotted key path of the object being read. */
typedef struct where {
    const char *file;
    char kp[256]; /* e.g. "quantization_config.config_groups.group_0." */
    fp4_err *e;
} where;

static void sub(where *dst, const where *w, const char *key)
{
    int n;
    *dst = *w;
    n = snprintf(dst->kp, sizeof dst->kp, "%s%s.", w->kp, key);
    if (n < 0 || (size_t)n >= sizeof dst->kp) /* keep messages readable when truncated */
        memcpy(dst->kp + sizeof dst->kp - 5, "...", 4);
}

static void render(const cJSON *v, char *buf, size_t len)
{
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    if (!s) {
        snprintf(buf, len, "nothing (key missing)");
        return;
    }
    if (strlen(s) > 80)
        snprintf(buf, len, "%.77s...", s);
    else
        snprintf(buf, len, "%s", s);
    free(s);
}

static fp4moe_status bad(const where *w, const char *key, const char *expected, const cJSON *v)
{
    char found[96];
    render(v, found, sizeof found);
    return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "%s: key '%s%s': expected %s, found %s", w->file,
                    w->kp, key, expected, found);
}

static const cJSON *item(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static const char *str_of(const cJSON *o, const char *key)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* ---- patterns ------------------------------------------------------------------------- */

/* Python-flavoured regex -> POSIX ERE anchored at the start. 0 if it cannot be expressed. */
static int translate_regex(const char *src, char *dst, size_t len)
{
    size_t o = 0;
    int in_bracket = 0;
#define PUT(str) do { size_t l_ = strlen(str); if (o + l_ + 1 >= len) return 0; \
                      memcpy(dst + o, str, l_); o += l_; } while (0)
    PUT("^(");
    for (const char *p = src; *p; p++) {
        char ch[3] = {p[0], 0, 0};
        if (p[0] == '(' && p[1] == '?' && !in_bracket)
            return 0;
        if (p[0] == '\\' && p[1]) {
            const char *cls = NULL;
            switch (p[1]) {
            case 'd': cls = in_bracket ? "0-9" : "[0-9]"; break;
            case 'D': cls = in_bracket ? NULL : "[^0-9]"; break;
            case 'w': cls = in_bracket ? "[:alnum:]_" : "[[:alnum:]_]"; break;
            case 'W': cls = in_bracket ? NULL : "[^[:alnum:]_]"; break;
            case 's': cls = in_bracket ? "[:space:]" : "[[:space:]]"; break;
            case 'S': cls = in_bracket ? NULL : "[^[:space:]]"; break;
            default: break;
            }
            if (!cls && in_bracket && (p[1] == 'D' || p[1] == 'W' || p[1] == 'S'))
                return 0;
            if (cls) {
                PUT(cls);
            } else if (in_bracket) { /* backslash is literal inside POSIX brackets */
                ch[0] = p[1];
                PUT(ch);
            } else {
                ch[1] = p[1];
                PUT(ch);
            }
            p++;
            continue;
        }
        if (p[0] == '[' && !in_bracket) {
            in_bracket = 1;
            PUT("[");
            if (p[1] == '^') { PUT("^"); p++; }
            if (p[1] == ']') { PUT("]"); p++; }
            continue;
        }
        if (p[0] == ']' && in_bracket)
            in_bracket = 0;
        PUT(ch);
    }
    PUT(")");
    dst[o] = '\0';
    return 1;
#undef PUT
}

/* Compile text into p; a regex when allow_re and it starts with "re:". */
static fp4moe_status pat_init(pat *p, const char *text, int allow_re, const where *w,
                              const char *key)
{
    char ere[1024], msg[160];
    int rc;
    memset(p, 0, sizeof *p);
    p->is_re = allow_re && strncmp(text, "re:", 3) == 0;
    p->s = strdup(p->is_re ? text + 3 : text);
    p->under = malloc(strlen(text) + 3);
    if (!p->s || !p->under)
        return fp4_fail(w->e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory reading %s", w->file);
    sprintf(p->under, "%s.*", p->s);
    if (!p->is_re)
        return FP4MOE_OK;
    if (!translate_regex(p->s, ere, sizeof ere))
        return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "%s: key '%s%s': regex \"%s\" uses syntax POSIX "
                        "ERE cannot express (\"(?\" groups, negated classes in brackets) or is "
                        "too long", w->file, w->kp, key, p->s);
    rc = regcomp(&p->re, ere, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        regerror(rc, &p->re, msg, sizeof msg);
        p->is_re = 0; /* nothing to free */
        return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "%s: key '%s%s': bad regex \"%s\": %s",
                        w->file, w->kp, key, p->s, msg);
    }
    return FP4MOE_OK;
}

static void pat_free(pat *p)
{
    if (p->is_re)
        regfree(&p->re);
    free(p->s);
    free(p->under);
}

/* The spellings a module is tried under (see the file head). Returns how many. */
static int name_forms(const char *m, char f[3][MOD_MAX])
{
    int n = 0;
    if (snprintf(f[n], MOD_MAX, "%s", m) < MOD_MAX)
        n++;
    if (snprintf(f[n], MOD_MAX, "language_model.%s", m) < MOD_MAX)
        n++;
    if (strncmp(m, "model.", 6) == 0 &&
        snprintf(f[n], MOD_MAX, "model.language_model.%s", m + 6) < MOD_MAX)
        n++;
    return n;
}

static int glob_match(const pat *p, const char *m)
{
    return strcmp(p->s, m) == 0 || fnmatch(p->s, m, 0) == 0 || fnmatch(p->under, m, 0) == 0;
}

static int pat_match1(const pat *p, const char *m)
{
    return p->is_re ? regexec(&p->re, m, 0, NULL, 0) == 0 : glob_match(p, m);
}

/* Score of a rule for one spelling of the module (0: no match; higher: more specific). */
static long rule_score1(const rule *r, const char *m)
{
    size_t n = strlen(r->p.s);
    switch (r->kind) {
    case RK_MODELOPT:
        if (strcmp(m, r->p.s) == 0)
            return 3000000;
        if (strncmp(m, r->p.s, n) == 0 && m[n] == '.')
            return 2000000 + (long)n;
        return glob_match(&r->p, m) ? 1000000 : 0;
    case RK_CT_LINEAR: return 1000000;
    case RK_CT_REGEX: return pat_match1(&r->p, m) ? 2000000 : 0;
    case RK_CT_EXACT: return strcmp(m, r->p.s) == 0 ? 3000000 : 0;
    }
    return 0;
}

/* ---- activation schemes --------------------------------------------------------------- */

#define ACT_SPELLINGS "\"static\", \"dynamic_per_token\", \"per_token\", \"per-token\", " \
                      "\"token\", \"none\""

static fp4moe_status parse_act_string(const cJSON *v, const where *w, const char *key,
                                      fp4_ascheme *out)
{
    const char *s = cJSON_GetStringValue(v);
    static const char *const per_token[] = {"dynamic_per_token", "per_token", "per-token",
                                            "token"};
    if (s && strcasecmp(s, "static") == 0) {
        *out = FP4_A_NVFP4_STATIC;
        return FP4MOE_OK;
    }
    if (s && strcasecmp(s, "none") == 0) {
        *out = FP4_A_NONE;
        return FP4MOE_OK;
    }
    for (int i = 0; s && i < 4; i++)
        if (strcasecmp(s, per_token[i]) == 0) {
            *out = FP4_A_NVFP4_PER_TOKEN;
            return FP4MOE_OK;
        }
    return bad(w, key, "one of " ACT_SPELLINGS, v);
}

/* A compressed-tensors input_activations value (null/absent: none). */
static fp4moe_status parse_ct_act(const cJSON *v, const where *w, const char *key,
                                  fp4_ascheme *out)
{
    static const char expected[] =
        "null, {\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"tensor_group\", "
        "\"dynamic\": false or \"local\"} or {\"num_bits\": 4, \"type\": \"float\", "
        "\"strategy\": \"token\", \"dynamic\": true}";
    const cJSON *bits, *dyn;
    const char *type, *strategy;
    *out = FP4_A_NONE;
    if (!v)
        return FP4MOE_OK;
    if (!cJSON_IsObject(v))
        return bad(w, key, expected, v);
    bits = cJSON_GetObjectItemCaseSensitive(v, "num_bits");
    type = str_of(v, "type");
    strategy = str_of(v, "strategy");
    dyn = cJSON_GetObjectItemCaseSensitive(v, "dynamic");
    if (!cJSON_IsNumber(bits) || bits->valuedouble != 4 || !type || strcmp(type, "float") != 0 ||
        !strategy)
        return bad(w, key, expected, v);
    if (strcmp(strategy, "tensor_group") == 0 &&
        (!dyn || cJSON_IsFalse(dyn) ||
         (cJSON_IsString(dyn) && strcmp(dyn->valuestring, "local") == 0))) {
        *out = FP4_A_NVFP4_STATIC;
        return FP4MOE_OK;
    }
    if (strcmp(strategy, "token") == 0 && cJSON_IsTrue(dyn)) {
        *out = FP4_A_NVFP4_PER_TOKEN;
        return FP4MOE_OK;
    }
    return bad(w, key, expected, v);
}

/* An A4 scheme needs NVFP4 weights. */
static fp4moe_status check_pair(fp4_scheme s, const where *w, const char *key)
{
    if (s.a != FP4_A_NONE && s.w != FP4_W_NVFP4)
        return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "%s: key '%s%s': activation scheme '%s' "
                        "declared for weight scheme '%s' (only NVFP4 weights take an NVFP4 "
                        "activation scheme)", w->file, w->kp, key, fp4_ascheme_name(s.a),
                        fp4_wscheme_name(s.w));
    return FP4MOE_OK;
}

/* ---- rule storage --------------------------------------------------------------------- */

static fp4moe_status add_rule(fp4_quant *q, rule_kind kind, const char *text, fp4_scheme s,
                              const where *w, const char *key)
{
    rule *r = realloc(q->rules, (size_t)(q->n_rules + 1) * sizeof *r);
    if (!r)
        return fp4_fail(w->e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory reading %s", w->file);
    q->rules = r;
    r = &q->rules[q->n_rules];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->s = s;
    if (pat_init(&r->p, text, kind == RK_CT_REGEX, w, key) != FP4MOE_OK) {
        pat_free(&r->p);
        return w->e->status;
    }
    q->n_rules++;
    return FP4MOE_OK;
}

/* A list of exclusion patterns (array of strings) under key; absent is fine. */
static fp4moe_status add_excludes(fp4_quant *q, const cJSON *o, const where *w, const char *key)
{
    const cJSON *list = item(o, key), *it;
    if (!list)
        return FP4MOE_OK;
    if (!cJSON_IsArray(list))
        return bad(w, key, "a list of module names or patterns", list);
    cJSON_ArrayForEach(it, list) {
        pat *p;
        if (!cJSON_IsString(it))
            return bad(w, key, "a list of module names or patterns", list);
        p = realloc(q->excl, (size_t)(q->n_excl + 1) * sizeof *p);
        if (!p)
            return fp4_fail(w->e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory reading %s", w->file);
        q->excl = p;
        if (pat_init(&q->excl[q->n_excl], it->valuestring, 1, w, key) != FP4MOE_OK) {
            pat_free(&q->excl[q->n_excl]);
            return w->e->status;
        }
        q->n_excl++;
    }
    return FP4MOE_OK;
}

/* ---- ModelOpt ------------------------------------------------------------------------- */

/* One {"quant_algo", "group_size"?, "activation_scheme"?} object. *mixed set for
 * MIXED_PRECISION when allowed. dflt_act: activation_scheme inherited by NVFP4 (or NULL). */
static fp4moe_status modelopt_algo(const cJSON *o, const where *w, int allow_mixed,
                                   const cJSON *dflt_act, fp4_scheme *s, int *mixed)
{
    static const char expected[] = "one of NVFP4, W4A16_NVFP4, MXFP8, MIXED_PRECISION";
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "quant_algo"), *gs, *act;
    const char *a = cJSON_GetStringValue(v);
    int w4a16 = 0, want_gs = 0;
    *s = k_bf16;
    if (mixed)
        *mixed = 0;
    if (!v)
        return bad(w, "quant_algo", expected, NULL);
    if (cJSON_IsNull(v) && allow_mixed)
        return FP4MOE_OK; /* nothing quantized */
    if (!a)
        return bad(w, "quant_algo", expected, v);
    if (strcasecmp(a, "NVFP4") == 0) {
        *s = (fp4_scheme){FP4_W_NVFP4, FP4_A_NVFP4_STATIC};
        want_gs = 16;
    } else if (strcasecmp(a, "W4A16_NVFP4") == 0) {
        *s = (fp4_scheme){FP4_W_NVFP4, FP4_A_NONE};
        want_gs = 16;
        w4a16 = 1;
    } else if (strcasecmp(a, "MXFP8") == 0) {
        *s = (fp4_scheme){FP4_W_MXFP8, FP4_A_NONE};
        want_gs = 32;
    } else if (strcasecmp(a, "MIXED_PRECISION") == 0 && allow_mixed) {
        *mixed = 1;
    } else if (strcasecmp(a, "FP8") == 0) {
        return fp4_fail(w->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%squant_algo': FP8 "
                        "quantization is not supported (fp4moe runs NVFP4, W4A16_NVFP4 and "
                        "MXFP8 weights)", w->file, w->kp);
    } else {
        return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "unknown quant_algo '%s' in %s key '%squant_algo'"
                        " (expected %s)", a, w->file, w->kp,
                        allow_mixed ? expected : "one of NVFP4, W4A16_NVFP4, MXFP8");
    }

    gs = item(o, "group_size");
    if (gs && want_gs && (!cJSON_IsNumber(gs) || gs->valuedouble != want_gs)) {
        char exp[64];
        snprintf(exp, sizeof exp, "%d for %s", want_gs, a);
        return bad(w, "group_size", exp, gs);
    }

    act = item(o, "activation_scheme");
    if (!act && s->w == FP4_W_NVFP4 && !w4a16)
        act = dflt_act;
    if (act) {
        fp4_ascheme as;
        if (parse_act_string(act, w, "activation_scheme", &as) != FP4MOE_OK)
            return w->e->status;
        if (mixed && *mixed)
            return FP4MOE_OK; /* MIXED_PRECISION top level: applied per entry */
        if (w4a16 && as != FP4_A_NONE)
            return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "%s: key '%sactivation_scheme' = \"%s\" "
                            "contradicts quant_algo W4A16_NVFP4 (16-bit activations)", w->file,
                            w->kp, act->valuestring);
        s->a = as;
        return check_pair(*s, w, "activation_scheme");
    }
    return FP4MOE_OK;
}

static fp4moe_status parse_modelopt(fp4_quant *q, const cJSON *o, const where *w)
{
    const cJSON *layers, *ent;
    if (!cJSON_IsObject(o))
        return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "%s: key '%s': expected an object", w->file,
                        w->kp);
    q->fmt = FP4_QF_MODELOPT;
    if (modelopt_algo(o, w, 1, NULL, &q->base, &q->mixed) != FP4MOE_OK)
        return w->e->status;
    if (add_excludes(q, o, w, "exclude_modules") != FP4MOE_OK ||
        add_excludes(q, o, w, "ignore") != FP4MOE_OK)
        return w->e->status;
    if (!q->mixed)
        return FP4MOE_OK;
    layers = item(o, "quantized_layers");
    if (!cJSON_IsObject(layers))
        return bad(w, "quantized_layers", "an object {module: {\"quant_algo\": ...}} for "
                   "MIXED_PRECISION", layers);
    cJSON_ArrayForEach(ent, layers) {
        where we;
        fp4_scheme s;
        char key[300];
        snprintf(key, sizeof key, "quantized_layers.%s", ent->string);
        sub(&we, w, key);
        if (!cJSON_IsObject(ent))
            return bad(w, key, "an object {\"quant_algo\": ...}", ent);
        if (modelopt_algo(ent, &we, 0, item(o, "activation_scheme"), &s, NULL) != FP4MOE_OK ||
            add_rule(q, RK_MODELOPT, ent->string, s, w, key) != FP4MOE_OK)
            return w->e->status;
    }
    return FP4MOE_OK;
}

/* ---- compressed-tensors --------------------------------------------------------------- */

static int num_is(const cJSON *o, const char *key, double v)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(n) && n->valuedouble == v;
}

static int num_is_item(const cJSON *arr, int i, double v)
{
    const cJSON *n = cJSON_GetArrayItem(arr, i);
    return cJSON_IsNumber(n) && n->valuedouble == v;
}

/* The weights of one group; the group's "format", else the top-level one (top, topw),
 * must say nvfp4-pack-quantized for NVFP4 weights. */
static fp4moe_status ct_weights(const cJSON *g, const where *gw, const cJSON *top,
                                const where *topw, fp4_wscheme *out)
{
    const cJSON *wt = item(g, "weights"), *fmt_o = g;
    const where *fmt_w = gw;
    const char *type, *strategy, *format;
    where ww;
    if (!cJSON_IsObject(wt))
        return bad(gw, "weights", "an object {num_bits, type, strategy, group_size}", wt);
    sub(&ww, gw, "weights");
    type = str_of(wt, "type");
    strategy = str_of(wt, "strategy");
    if (!type || strcmp(type, "float") != 0)
        return bad(&ww, "type", "\"float\" (NVFP4 or MXFP8 weights)",
                   cJSON_GetObjectItemCaseSensitive(wt, "type"));
    if (num_is(wt, "num_bits", 4)) {
        if (!strategy || strcmp(strategy, "tensor_group") != 0)
            return bad(&ww, "strategy", "\"tensor_group\" for NVFP4 (num_bits 4)",
                       cJSON_GetObjectItemCaseSensitive(wt, "strategy"));
        if (!num_is(wt, "group_size", 16))
            return bad(&ww, "group_size", "16 for NVFP4 (num_bits 4)",
                       cJSON_GetObjectItemCaseSensitive(wt, "group_size"));
        if (!item(g, "format")) {
            fmt_o = top;
            fmt_w = topw;
        }
        format = str_of(fmt_o, "format");
        if (item(fmt_o, "format") && (!format || strcmp(format, "nvfp4-pack-quantized") != 0))
            return bad(fmt_w, "format", "\"nvfp4-pack-quantized\" for NVFP4 weights",
                       item(fmt_o, "format"));
        *out = FP4_W_NVFP4;
        return FP4MOE_OK;
    }
    if (num_is(wt, "num_bits", 8)) {
        if (!strategy || strcmp(strategy, "group") != 0)
            return bad(&ww, "strategy", "\"group\" for MXFP8 (num_bits 8)",
                       cJSON_GetObjectItemCaseSensitive(wt, "strategy"));
        if (!num_is(wt, "group_size", 32))
            return bad(&ww, "group_size", "32 for MXFP8 (num_bits 8)",
                       cJSON_GetObjectItemCaseSensitive(wt, "group_size"));
        *out = FP4_W_MXFP8;
        return FP4MOE_OK;
    }
    return bad(&ww, "num_bits", "4 (NVFP4) or 8 (MXFP8)",
               cJSON_GetObjectItemCaseSensitive(wt, "num_bits"));
}

static fp4moe_status parse_ct(fp4_quant *q, const cJSON *o, const where *w)
{
    const cJSON *groups = item(o, "config_groups"), *g;
    where gsw;
    q->fmt = FP4_QF_COMPRESSED_TENSORS;
    if (!cJSON_IsObject(groups) || cJSON_GetArraySize(groups) == 0)
        return bad(w, "config_groups", "a non-empty object {group: {targets, weights, ...}}",
                   groups);
    sub(&gsw, w, "config_groups");
    cJSON_ArrayForEach(g, groups) {
        where gw;
        const cJSON *targets, *t;
        fp4_scheme s = k_bf16;
        if (!cJSON_IsObject(g))
            return bad(&gsw, g->string, "an object {targets, weights, input_activations}", g);
        sub(&gw, &gsw, g->string);
        if (ct_weights(g, &gw, o, w, &s.w) != FP4MOE_OK ||
            parse_ct_act(item(g, "input_activations"), &gw, "input_activations", &s.a) !=
                FP4MOE_OK ||
            check_pair(s, &gw, "input_activations") != FP4MOE_OK)
            return w->e->status;
        targets = item(g, "targets");
        if (!cJSON_IsArray(targets) || cJSON_GetArraySize(targets) == 0)
            return bad(&gw, "targets", "a non-empty list of \"Linear\", \"re:<regex>\" or "
                       "module names", targets);
        cJSON_ArrayForEach(t, targets) {
            const char *ts = cJSON_GetStringValue(t);
            rule_kind k;
            if (!ts)
                return bad(&gw, "targets", "a list of strings", targets);
            k = strcmp(ts, "Linear") == 0 ? RK_CT_LINEAR
                : strncmp(ts, "re:", 3) == 0 ? RK_CT_REGEX : RK_CT_EXACT;
            if (add_rule(q, k, ts, s, &gw, "targets") != FP4MOE_OK)
                return w->e->status;
        }
    }
    return add_excludes(q, o, w, "ignore");
}

/* ---- MiniMax-M3.1 --------------------------------------------------------------------- */

static fp4moe_status minimax_act(const cJSON *o, const where *w, const char *key,
                                 fp4_ascheme dflt, fp4_ascheme *out)
{
    const cJSON *v = item(o, key);
    *out = dflt;
    return v ? parse_act_string(v, w, key, out) : FP4MOE_OK;
}

static fp4moe_status parse_minimax(fp4_quant *q, const cJSON *o, const where *w)
{
    const cJSON *bs = item(o, "weight_block_size"), *alg = item(o, "moe_quant_algo");
    const char *a = cJSON_GetStringValue(alg), *fmt = str_of(o, "moe_quant_format");
    fp4_wscheme ew = FP4_W_MXFP8;
    fp4_ascheme both = FP4_A_NONE;
    q->fmt = FP4_QF_MINIMAX_M31;
    q->base = (fp4_scheme){FP4_W_MXFP8, FP4_A_NONE};
    if (bs && (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 ||
               !num_is_item(bs, 0, 1) || !num_is_item(bs, 1, 32)))
        return bad(w, "weight_block_size", "[1, 32] (MXFP8 blocks of 32 along K)", bs);
    if (alg) {
        if (a && strcasecmp(a, "NVFP4") == 0)
            ew = FP4_W_NVFP4;
        else if (a && strcasecmp(a, "MXFP8") == 0)
            ew = FP4_W_MXFP8;
        else if (a && strcasecmp(a, "FP8") == 0)
            return fp4_fail(w->e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%smoe_quant_algo': FP8 "
                            "experts are not supported (fp4moe runs NVFP4 and MXFP8)", w->file,
                            w->kp);
        else
            return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "unknown quant_algo '%s' in %s key "
                            "'%smoe_quant_algo' (expected one of NVFP4, MXFP8)",
                            a ? a : "(not a string)", w->file, w->kp);
    }
    if (ew == FP4_W_NVFP4 && fmt && strcmp(fmt, "nvfp4-pack-quantized") != 0)
        return bad(w, "moe_quant_format", "\"nvfp4-pack-quantized\" for NVFP4 experts",
                   item(o, "moe_quant_format"));

    if (item(o, "moe_activation_scheme") && item(o, "moe_input_activations"))
        return fp4_fail(w->e, FP4MOE_ERR_FORMAT, "%s: keys '%smoe_activation_scheme' and "
                        "'%smoe_input_activations' both present: declare one", w->file, w->kp,
                        w->kp);
    if (minimax_act(o, w, "moe_activation_scheme", FP4_A_NONE, &both) != FP4MOE_OK ||
        (item(o, "moe_input_activations") &&
         parse_ct_act(item(o, "moe_input_activations"), w, "moe_input_activations", &both) !=
             FP4MOE_OK))
        return w->e->status;
    q->moe_other = (fp4_scheme){ew, both};
    q->moe_fc1 = q->moe_fc2 = q->moe_other;
    if (minimax_act(o, w, "moe_fc1_activation_scheme", both, &q->moe_fc1.a) != FP4MOE_OK ||
        minimax_act(o, w, "moe_fc2_activation_scheme", both, &q->moe_fc2.a) != FP4MOE_OK)
        return w->e->status;
    if (check_pair(q->moe_fc1, w, item(o, "moe_fc1_activation_scheme") ?
                   "moe_fc1_activation_scheme" : "moe_activation_scheme") != FP4MOE_OK ||
        check_pair(q->moe_fc2, w, item(o, "moe_fc2_activation_scheme") ?
                   "moe_fc2_activation_scheme" : "moe_activation_scheme") != FP4MOE_OK)
        return w->e->status;
    if (add_excludes(q, o, w, "ignored_layers") != FP4MOE_OK ||
        add_excludes(q, o, w, "modules_to_not_convert") != FP4MOE_OK)
        return w->e->status;
    return FP4MOE_OK;
}

/* ---- entry points --------------------------------------------------------------------- */

void fp4_quant_destroy(fp4_quant *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n_excl; i++)
        pat_free(&q->excl[i]);
    for (int i = 0; i < q->n_rules; i++)
        pat_free(&q->rules[i].p);
    free(q->excl);
    free(q->rules);
    free(q);
}

fp4_qformat fp4_quant_format(const fp4_quant *q) { return q ? q->fmt : FP4_QF_NONE; }

/* config.json's quantization_config: top level or under text_config (*kp says which). */
static fp4moe_status find_config_qc(const cJSON *config, const where *cw, const cJSON **qc,
                                    const char **kp)
{
    const cJSON *tc = item(config, "text_config");
    const cJSON *top = item(config, "quantization_config");
    const cJSON *inner = cJSON_IsObject(tc) ? item(tc, "quantization_config") : NULL;
    *qc = top ? top : inner;
    *kp = top ? "quantization_config" : "text_config.quantization_config";
    if (top && inner && !cJSON_Compare(top, inner, 1))
        return fp4_fail(cw->e, FP4MOE_ERR_FORMAT, "%s: keys 'quantization_config' and "
                        "'text_config.quantization_config' both present and different: keep one",
                        cw->file);
    if (*qc && !cJSON_IsObject(*qc))
        return bad(cw, *kp, "an object", *qc);
    return FP4MOE_OK;
}

static fp4moe_status parse_all(fp4_quant *q, const cJSON *config, const cJSON *hf,
                               const char *dir, fp4_err *e)
{
    char cfile[1024], hfile[1024];
    where cw = {cfile, "", e}, hw = {hfile, "", e}, qw;
    const cJSON *qc = NULL;
    const char *kp = NULL, *method = NULL;

    if (!fp4_path_join(cfile, sizeof cfile, dir ? dir : ".", "config.json") ||
        !fp4_path_join(hfile, sizeof hfile, dir ? dir : ".", "hf_quant_config.json"))
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "model directory path too long");
    if (config && find_config_qc(config, &cw, &qc, &kp) != FP4MOE_OK)
        return e->status;
    if (qc) {
        sub(&qw, &cw, kp);
        method = str_of(qc, "quant_method");
        if (!method)
            return bad(&qw, "quant_method", "\"modelopt\", \"compressed-tensors\" or \"mxfp8\"",
                       cJSON_GetObjectItemCaseSensitive(qc, "quant_method"));
    }

    if (hf) {
        const cJSON *hq = item(hf, "quantization");
        if (qc && strcmp(method, "modelopt") != 0)
            return fp4_fail(e, FP4MOE_ERR_FORMAT, "%s declares ModelOpt quantization but %s key "
                            "'%s.quant_method' is \"%s\": the two files disagree, remove one",
                            hfile, cfile, kp, method);
        if (!cJSON_IsObject(hq))
            return bad(&hw, "quantization", "an object {\"quant_algo\": ...}", hq);
        sub(&qw, &hw, "quantization");
        return parse_modelopt(q, hq, &qw);
    }
    if (!qc)
        return FP4MOE_OK; /* unquantized */
    if (strcmp(method, "modelopt") == 0) {
        const cJSON *nested = item(qc, "quantization");
        if (nested) {
            where nw;
            sub(&nw, &qw, "quantization");
            return parse_modelopt(q, nested, &nw);
        }
        return parse_modelopt(q, qc, &qw);
    }
    if (strcmp(method, "compressed-tensors") == 0)
        return parse_ct(q, qc, &qw);
    if (strcmp(method, "mxfp8") == 0)
        return parse_minimax(q, qc, &qw);
    return fp4_fail(e, FP4MOE_ERR_NOT_SUPPORTED, "%s: key '%squant_method' = \"%s\": not "
                    "supported (fp4moe reads \"modelopt\", \"compressed-tensors\" and the "
                    "MiniMax-M3.1 \"mxfp8\" form)", cfile, qw.kp, method);
}

fp4moe_status fp4_quant_parse(const cJSON *config, const cJSON *hf_quant, const char *dir,
                              fp4_quant **out, fp4_err *e)
{
    fp4_quant *q = calloc(1, sizeof *q);
    *out = NULL;
    if (!q)
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory reading quantization "
                        "metadata");
    q->fmt = FP4_QF_NONE;
    q->base = k_bf16;
    if (parse_all(q, config, hf_quant, dir, e) != FP4MOE_OK) {
        fp4_quant_destroy(q);
        return e->status;
    }
    *out = q;
    return FP4MOE_OK;
}

/* Routed expert linear "...experts.<digits>.<proj>": 1 FC1, 2 FC2, 3 other; 0 not one. */
static int routed_expert_kind(const char *m)
{
    const char *p = m, *last;
    while ((p = strstr(p, ".experts.")) != NULL) {
        const char *d = p + 9;
        size_t n = strspn(d, "0123456789");
        if (n > 0 && d[n] == '.') {
            last = strrchr(m, '.') + 1;
            if (!strcmp(last, "w1") || !strcmp(last, "w3") || !strcmp(last, "gate_proj") ||
                !strcmp(last, "up_proj") || !strcmp(last, "w13") ||
                !strcmp(last, "gate_up_proj"))
                return 1;
            if (!strcmp(last, "w2") || !strcmp(last, "down_proj"))
                return 2;
            return 3;
        }
        p++;
    }
    return 0;
}

static int ends_with(const char *s, const char *t)
{
    size_t ls = strlen(s), lt = strlen(t);
    return ls >= lt && strcmp(s + ls - lt, t) == 0;
}

fp4_scheme fp4_quant_scheme_for(const fp4_quant *q, const char *module)
{
    char forms[3][MOD_MAX];
    int nf, best = -1, kind;
    long best_score = 0;
    if (!q || !module || q->fmt == FP4_QF_NONE)
        return k_bf16;
    nf = name_forms(module, forms);
    for (int i = 0; i < q->n_excl; i++)
        for (int f = 0; f < nf; f++)
            if (pat_match1(&q->excl[i], forms[f]))
                return k_bf16;

    switch (q->fmt) {
    case FP4_QF_MODELOPT:
        if (!q->mixed)
            return q->base;
        /* fall through - the rules decide */
    case FP4_QF_COMPRESSED_TENSORS:
        for (int i = 0; i < q->n_rules; i++)
            for (int f = 0; f < nf; f++) {
                long sc = rule_score1(&q->rules[i], forms[f]);
                if (sc > best_score) {
                    best_score = sc;
                    best = i;
                }
            }
        return best >= 0 ? q->rules[best].s : k_bf16;
    case FP4_QF_MINIMAX_M31:
        if (strcmp(module, "lm_head") == 0 || ends_with(module, ".block_sparse_moe.gate") ||
            ends_with(module, ".mlp.gate"))
            return k_bf16;
        kind = routed_expert_kind(module);
        if (kind == 1)
            return q->moe_fc1;
        if (kind == 2)
            return q->moe_fc2;
        if (kind == 3)
            return q->moe_other;
        return q->base;
    case FP4_QF_NONE:
        break;
    }
    return k_bf16;
}
