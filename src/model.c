/*
 * model.c - the public model handle of fp4moe.h: a checkpoint, the device, the requested
 * backend, and one lazily-built runner per layer (weights bound, oracle decision taken).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "layer_run.h"
#include "oracle.h"

struct fp4moe_model {
    fp4_ckpt *ckpt;
    fp4_device dev;
    char *backend;               /* requested: "auto" or a name */
    fp4_layer_runner *runners;   /* [n_layers], layer == -1 until built */
    fp4_err err;
};

static fp4moe_status set(fp4moe_model_t m, fp4moe_status st)
{
    if (st == FP4MOE_OK)
        fp4_err_clear(&m->err);
    return st;
}

fp4moe_status fp4moe_model_open(const char *dir, const fp4moe_open_options *options,
                                fp4moe_model_t *out)
{
    fp4moe_open_options none = {0, NULL, NULL};
    const fp4moe_open_options *o = options ? options : &none;
    if (!out)
        return FP4MOE_ERR_INVALID_ARGUMENT;
    fp4moe_model_t m = calloc(1, sizeof *m);
    *out = m;
    if (!m)
        return FP4MOE_ERR_OUT_OF_MEMORY;
    if (!dir)
        return fp4_fail(&m->err, FP4MOE_ERR_INVALID_ARGUMENT, "model directory is NULL");
    fp4moe_status st = fp4_device_resolve(o->device_arch, &m->dev, &m->err);
    if (st)
        return st;
    m->backend = strdup(o->moe_backend ? o->moe_backend : "auto");
    if (!m->backend)
        return fp4_fail(&m->err, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = fp4_ckpt_open(dir, o->max_layers, &m->ckpt, &m->err)))
        return st;
    m->runners = calloc((size_t)m->ckpt->n_layers, sizeof *m->runners);
    if (!m->runners)
        return fp4_fail(&m->err, FP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < m->ckpt->n_layers; i++)
        m->runners[i].layer = -1;
    /* Decide every MoE layer now, so a backend that cannot serve fails at open. */
    for (int i = 0; i < m->ckpt->n_layers; i++) {
        fp4moe_layer_plan plan;
        if (m->ckpt->arch.is_moe[i] && (st = fp4moe_model_layer_plan(m, i, &plan)))
            return st;
    }
    return set(m, FP4MOE_OK);
}

void fp4moe_model_destroy(fp4moe_model_t m)
{
    if (!m)
        return;
    if (m->runners)
        for (int i = 0; i < m->ckpt->n_layers; i++)
            if (m->runners[i].layer >= 0)
                fp4_layer_runner_free(&m->runners[i]);
    free(m->runners);
    fp4_ckpt_close(m->ckpt);
    free(m->backend);
    free(m);
}

const char *fp4moe_model_errmsg(fp4moe_model_t m)
{
    return m ? m->err.msg : "no model handle (out of memory)";
}

int fp4moe_model_num_layers(fp4moe_model_t m)
{
    return m && m->ckpt ? m->ckpt->n_layers : 0;
}

int fp4moe_model_hidden_size(fp4moe_model_t m)
{
    return m && m->ckpt ? m->ckpt->arch.hidden : 0;
}

int fp4moe_model_topk(fp4moe_model_t m)
{
    return m && m->ckpt ? m->ckpt->arch.topk : 0;
}

int fp4moe_model_layer_is_moe(fp4moe_model_t m, int layer)
{
    return m && m->ckpt && layer >= 0 && layer < m->ckpt->n_layers && m->ckpt->arch.is_moe[layer];
}

static fp4moe_status runner(fp4moe_model_t m, int layer, fp4_layer_runner **out)
{
    if (!m || !m->ckpt)
        return FP4MOE_ERR_INVALID_ARGUMENT;
    if (layer < 0 || layer >= m->ckpt->n_layers)
        return fp4_fail(&m->err, FP4MOE_ERR_INVALID_ARGUMENT, "layer %d: expected 0..%d", layer,
                        m->ckpt->n_layers - 1);
    fp4_layer_runner *r = &m->runners[layer];
    if (r->layer < 0) {
        fp4moe_status st = fp4_layer_runner_init(r, m->ckpt, &m->dev, m->backend, layer, &m->err);
        if (st) {
            fp4_layer_runner_free(r);
            r->layer = -1;
            return st;
        }
    }
    *out = r;
    return FP4MOE_OK;
}

fp4moe_status fp4moe_model_layer_plan(fp4moe_model_t m, int layer, fp4moe_layer_plan *plan)
{
    fp4_layer_runner *r = NULL;
    fp4moe_status st = runner(m, layer, &r);
    if (st)
        return st;
    memset(plan, 0, sizeof *plan);
    if (!r->is_moe) {
        strcpy(plan->backend, "reference");
        strcpy(plan->precision, "reference");
        return set(m, FP4MOE_OK);
    }
    snprintf(plan->backend, sizeof plan->backend, "%s", r->decision.backend->name);
    snprintf(plan->precision, sizeof plan->precision, "%s", r->decision.precision);
    snprintf(plan->dropped, sizeof plan->dropped, "%s", r->decision.dropped);
    return set(m, FP4MOE_OK);
}

fp4moe_status fp4moe_model_layer_forward(fp4moe_model_t m, int layer, const float *x, int mt,
                                         float *y, int32_t *topk_ids, float *topk_weights)
{
    fp4_layer_runner *r = NULL;
    if (!x || !y || mt <= 0)
        return m ? fp4_fail(&m->err, FP4MOE_ERR_INVALID_ARGUMENT, "layer_forward: x, y and m > 0 are required")
                 : FP4MOE_ERR_INVALID_ARGUMENT;
    fp4moe_status st = runner(m, layer, &r);
    if (st)
        return st;
    return set(m, fp4_layer_runner_forward(r, &m->ckpt->arch, x, mt, y, topk_ids, topk_weights, &m->err));
}
