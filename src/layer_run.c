/* layer_run.c - see layer_run.h. */
#include "layer_run.h"

#include <string.h>

#include "layer_load.h"
#include "ref/moe_ref.h"

fp4moe_status fp4_layer_need_of(fp4_ckpt *c, int layer, fp4_layer_need *need, fp4_err *e)
{
    memset(need, 0, sizeof *need);
    need->layer = layer;
    need->act = c->arch.act;
    need->swiglu_limit = c->arch.swiglu_limit;
    return fp4_layer_expert_schemes(c, layer, &need->fc1, &need->fc2, e);
}

fp4moe_status fp4_layer_runner_init(fp4_layer_runner *r, fp4_ckpt *c, const fp4_device *dev,
                                    const char *requested, int layer, fp4_err *e)
{
    fp4moe_status st;
    memset(r, 0, sizeof *r);
    r->layer = layer;
    if (layer < 0 || layer >= c->n_layers)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "--layer %d: expected 0..%d for '%s'", layer,
                        c->n_layers - 1, c->dir);
    r->is_moe = c->arch.is_moe[layer];
    if (!r->is_moe)
        return fp4_load_dense_weights(c, layer, &r->dense, e);
    fp4_layer_need need;
    if ((st = fp4_layer_need_of(c, layer, &need, e)) ||
        (st = fp4_oracle_select(NULL, 0, dev, requested, &need, &r->decision, e)))
        return st;
    return fp4_load_moe_weights(c, layer, &r->moe, e);
}

void fp4_layer_runner_free(fp4_layer_runner *r)
{
    if (r->gpu)
        fp4_gpu_moe_destroy(r->gpu);
    if (r->is_moe)
        fp4_moe_weights_free(&r->moe);
    memset(r, 0, sizeof *r);
}

fp4moe_status fp4_layer_runner_forward(fp4_layer_runner *r, const fp4_arch *a, const float *x,
                                       int m, float *y, int32_t *ids, float *weights, fp4_err *e)
{
    fp4_ref_opts o = {0, 0};
    if (m <= 0)
        return fp4_fail(e, FP4MOE_ERR_INVALID_ARGUMENT, "expected at least one token, found %d", m);
    if (!r->is_moe)
        return fp4_ref_dense_forward(a, &r->dense, x, m, &o, y, e);
    const fp4_backend *b = r->decision.backend;
    if (b->gpu) {
        fp4moe_status st;
        if (!r->gpu && (st = fp4_gpu_moe_create(a, &r->moe, &r->gpu, e)))
            return st;
        int kernel = fp4_oracle_kernel(b, m, a->topk, a->n_experts);
        return fp4_gpu_moe_forward_host(r->gpu, (fp4_gpu_kernel)kernel, x, m, y, ids, weights, e);
    }
    o.emulate_a4 = !b->a16;
    return fp4_ref_moe_forward(a, &r->moe, x, m, &o, y, ids, weights, e);
}
