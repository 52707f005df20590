/*
 * layer_run.h - run one layer's MLP/MoE block with the backend the oracle chose. The only
 * place that maps a decision to code: reference and emulation on the CPU, GPU kernels
 * through gpu_moe. Used by the public model API and by the tool's check and layer commands.
 */
#ifndef FP4MOE_LAYER_RUN_H
#define FP4MOE_LAYER_RUN_H

#include "checkpoint.h"
#include "gpu_moe.h"
#include "moe_weights.h"
#include "oracle.h"

/* A layer bound for running: its weights, the decision, and the backend's loaded state. */
typedef struct fp4_layer_runner {
    int layer;
    int is_moe;
    fp4_moe_weights moe;
    fp4_dense_weights dense;
    fp4_decision decision;    /* MoE layers only; dense layers always run on the reference */
    fp4_gpu_moe *gpu;         /* loaded lazily for GPU backends */
} fp4_layer_runner;

/* Bind weights and decide (requested: NULL/"auto" or a backend name). */
fp4moe_status fp4_layer_runner_init(fp4_layer_runner *r, fp4_ckpt *c, const fp4_device *dev,
                                    const char *requested, int layer, fp4_err *e);
void fp4_layer_runner_free(fp4_layer_runner *r);

/* x[M, H] fp32 host -> y[M, H] fp32 host; ids/weights [M, k] may be NULL (MoE layers). */
fp4moe_status fp4_layer_runner_forward(fp4_layer_runner *r, const fp4_arch *a, const float *x,
                                       int m, float *y, int32_t *ids, float *weights, fp4_err *e);

/* The layer's needs as the oracle sees them. */
fp4moe_status fp4_layer_need_of(fp4_ckpt *c, int layer, fp4_layer_need *need, fp4_err *e);

#endif /* FP4MOE_LAYER_RUN_H */
