/*
 * moe_random.h - a random MoE layer held in memory (no checkpoint): NVFP4 experts drawn as
 * real quantized data (random e2m1 codes, e4m3 block scales among normal codes, per-expert
 * global scales), an fp32 router and bias, and a bf16 shared expert. For benchmarks, where
 * writing and mapping a checkpoint per shape would cost more than the measurement.
 */
#ifndef FP4MOE_MOE_RANDOM_H
#define FP4MOE_MOE_RANDOM_H

#include <stdint.h>

#include "model_config.h"
#include "moe_weights.h"

typedef struct fp4_moe_random {
    fp4_moe_weights w;   /* views into storage */
    uint8_t *storage;    /* owned */
} fp4_moe_random;

/* Arch fields used: hidden, n_experts, moe_intermediate, shared_intermediate. */
fp4moe_status fp4_moe_random_create(const fp4_arch *a, uint64_t seed, fp4_moe_random *out,
                                    fp4_err *e);
void fp4_moe_random_free(fp4_moe_random *r);

/* A MiniMax-M3-style arch for benchmarks: sigmoid + bias routing, top-k renormalized times
 * 2.0, SwiGLU-OAI with limit 7 and alpha 1.702. */
void fp4_arch_for_bench(fp4_arch *a, int hidden, int inter, int experts, int topk, int shared);

#endif /* FP4MOE_MOE_RANDOM_H */
