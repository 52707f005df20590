/* moe_random.c - see moe_random.h. */
#include "moe_random.h"

#include <stdlib.h>
#include <string.h>

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float unif(uint64_t *s) /* [-1, 1) */
{
    return (float)(next(s) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

void fp4_arch_for_bench(fp4_arch *a, int hidden, int inter, int experts, int topk, int shared)
{
    memset(a, 0, sizeof *a);
    strcpy(a->model_type, "minimax_m3");
    a->hidden = hidden;
    a->n_layers = 1;
    a->n_experts = experts;
    a->moe_intermediate = inter;
    a->shared_intermediate = shared;
    a->topk = topk;
    a->act = FP4_ACT_SWIGLUOAI;
    a->swiglu_limit = 7.0f;
    a->swiglu_alpha = 1.702f;
    a->scoring = FP4_SCORE_SIGMOID;
    a->has_score_bias = 1;
    a->norm_topk = 1;
    a->routed_scaling = 2.0f;
    a->is_moe[0] = 1;
}

static void fill_nvfp4(fp4_linear *l, int n, int k, uint8_t *q, uint8_t *s, float gscale, uint64_t *rng)
{
    size_t nq = (size_t)n * k / 2, ns = (size_t)n * k / 16;
    for (size_t i = 0; i < nq; i += 8) {
        uint64_t v = next(rng);
        memcpy(q + i, &v, nq - i < 8 ? nq - i : 8);
    }
    for (size_t i = 0; i < ns; i++)
        s[i] = (uint8_t)(0x30 + (next(rng) % 16)); /* e4m3 0.5 .. 0.98: normal, positive */
    l->scheme.w = FP4_W_NVFP4;
    l->scheme.a = FP4_A_NONE;
    l->n = n;
    l->k = k;
    l->w = q;
    l->scale = s;
    l->global_scale = gscale;
}

static void fill_bf16(fp4_linear *l, int n, int k, uint8_t *w, float amp, uint64_t *rng)
{
    for (size_t i = 0; i < (size_t)n * k; i++) {
        uint16_t b = fp4moe_bf16_from_float(amp * unif(rng));
        memcpy(w + 2 * i, &b, 2);
    }
    l->scheme.w = FP4_W_BF16;
    l->scheme.a = FP4_A_NONE;
    l->n = n;
    l->k = k;
    l->w = w;
}

fp4moe_status fp4_moe_random_create(const fp4_arch *a, uint64_t seed, fp4_moe_random *out,
                                    fp4_err *e)
{
    memset(out, 0, sizeof *out);
    int E = a->n_experts, H = a->hidden, I = a->moe_intermediate, S = a->shared_intermediate;
    if (H % 16 || I % 16 || E <= 0)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "random layer: hidden %d and intermediate %d must be multiples of 16, experts %d > 0", H, I, E);
    size_t per = (size_t)3 * I * H;           /* params per expert */
    size_t bytes = (size_t)E * (per / 2 + per / 16) + (size_t)3 * S * H * 2;
    fp4_moe_weights *w = &out->w;
    out->storage = malloc(bytes);
    w->router = malloc((size_t)E * H * sizeof(float));
    w->router_bias = malloc((size_t)E * sizeof(float));
    w->gate = calloc((size_t)E, sizeof *w->gate);
    w->up = calloc((size_t)E, sizeof *w->up);
    w->down = calloc((size_t)E, sizeof *w->down);
    if (!out->storage || !w->router || !w->router_bias || !w->gate || !w->up || !w->down) {
        fp4_moe_random_free(out);
        return fp4_fail(e, FP4MOE_ERR_OUT_OF_MEMORY, "random layer: cannot allocate %zu bytes", bytes);
    }
    uint64_t rng = seed * 0x2545f4914f6cdd1dull + 1;
    w->n_experts = E;
    w->hidden = H;
    w->inter = I;
    float ramp = 1.0f / (float)H; /* router logits of order 1 for inputs of order 1 */
    for (size_t i = 0; i < (size_t)E * H; i++)
        w->router[i] = ramp * 4.0f * unif(&rng);
    for (int j = 0; j < E; j++)
        w->router_bias[j] = 0.01f * unif(&rng);
    uint8_t *p = out->storage;
    for (int j = 0; j < E; j++) {
        /* Global scales such that weights are of order 1/sqrt(K). */
        float g1 = 0.25f / (float)H, g2 = 0.25f / (float)I;
        fp4_linear *ls[3] = {&w->gate[j], &w->up[j], &w->down[j]};
        int ns[3] = {I, I, H}, ks[3] = {H, H, I};
        for (int m = 0; m < 3; m++) {
            size_t nq = (size_t)ns[m] * ks[m] / 2, nsc = (size_t)ns[m] * ks[m] / 16;
            float g = (m == 2 ? g2 : g1) * 32.0f * (0.75f + 0.5f * (unif(&rng) + 1.0f) / 2.0f);
            fill_nvfp4(ls[m], ns[m], ks[m], p, p + nq, g, &rng);
            p += nq + nsc;
        }
    }
    if (S > 0) {
        w->has_shared = 1;
        w->shared_inter = S;
        fill_bf16(&w->sh_gate, S, H, p, 1.0f / (float)H * 16.0f, &rng);
        p += (size_t)S * H * 2;
        fill_bf16(&w->sh_up, S, H, p, 1.0f / (float)H * 16.0f, &rng);
        p += (size_t)S * H * 2;
        fill_bf16(&w->sh_down, H, S, p, 1.0f / (float)S * 16.0f, &rng);
    }
    return FP4MOE_OK;
}

void fp4_moe_random_free(fp4_moe_random *r)
{
    fp4_moe_weights_free(&r->w);
    free(r->storage);
    r->storage = NULL;
}
