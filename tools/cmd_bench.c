/*
 * cmd_bench.c - `fp4moe bench`: time one MoE layer per problem (bench/problems.txt format:
 * "hidden intermediate experts topk M routing [shared]") for every GPU backend that serves
 * it, beside floors measured in the same run:
 *   memory floor  = bytes actually touched (expert weights hit + activations) / device copy
 *                   bandwidth (cudaMemcpy device to device, bytes read + written);
 *   compute floor = FLOPs (2 M topk 3 H I) / cuBLAS BF16 GEMM rate on an 8192^3 product;
 * and the time cuBLAS takes for a dense BF16 GEMM of the same FLOPs ([M topk, H] x [H, 3I]).
 * Each timing: the layer's forward captured in a CUDA graph, L2 flushed (a 256 MB memset)
 * before every repetition, inputs rotated over 4 sets, median of the repetitions (CUDA events).
 * --flush clean: the flush reads 256 MB instead (cublasSasum of a buffer written once at the
 * start), so the forward starts with L2 full of clean lines rather than dirty ones, as after a
 * layer that mostly read; the memset (dirty) is the default and how the peer is timed.
 * --prev-layer: after each flush and before the timed forward, untimed, the forward of a second
 * layer of the same shapes (its own copy of the weights), as in a model where the layer before
 * ran the same kernels: their code and that layer's data are in the L2, this layer's weights
 * are not.
 * Scope: "us" is the whole layer, routing included; "route_us" is its prologue alone (routing
 * and grouping, timed the same way) and "exp_us" = us - route_us the expert computation, the
 * scope the peer script times (it builds routing and its sorted ids outside the timed region).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fp4moe.h"

#ifndef FP4MOE_WITH_CUDA
int cmd_bench(int argc, char **argv)
{
    (void)argc, (void)argv;
    fprintf(stderr, "fp4moe bench: this build has no CUDA support (built with FP4MOE_WITH_CUDA=OFF)\n");
    return CLI_FAIL;
}
#else

#include <math.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "gpu_moe.h"
#include "moe_random.h"
#include "oracle.h"

static const char *usage_text =
    "usage: fp4moe bench [--problems FILE] [--moe-backend NAME] [--all-kernels] [--reps N] [--json FILE] [--seed S]\n"
    "                    [--dec-slot-tokens 8|16|32] [--prev-layer] [--flush dirty|clean]\n"
    "--all-kernels: time every kernel of each backend, not only the one the oracle picks (marked *).\n"
    "--dec-slot-tokens: the decode kernel's slot width for M > 32 instead of its rule (for measuring the rule).\n"
    "--prev-layer: before each timed forward (after the L2 flush) run, untimed, another layer of the same shapes\n"
    "              with its own weights, as the layer before it in a model (kernel code warm, weights cold).\n"
    "--flush: how L2 is flushed before each timed forward: dirty (default; a 256 MB memset, as the peer is timed)\n"
    "         or clean (a 256 MB read: L2 holds clean lines, nothing to write back).\n"
    "default problems: bench/problems.txt of the source tree (FP4MOE_SRC, else the current directory).\n";

#define ROTATE 4
#define FLUSH_BYTES (256u << 20)

typedef struct problem {
    int hidden, inter, experts, topk, m, skewed, shared;
} problem;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "fp4moe bench: %s failed: %s\n", #call, cudaGetErrorString(err_));    \
            exit(CLI_FAIL);                                                                        \
        }                                                                                          \
    } while (0)

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void *flush_buf;
static cublasHandle_t flush_reader; /* --flush clean: reads flush_buf (Sasum into flush_sum) */
static float *flush_sum;

static void flush_l2(int r, cudaStream_t s)
{
    if (!flush_reader) {
        CK(cudaMemsetAsync(flush_buf, r & 0xff, FLUSH_BYTES, s));
        return;
    }
    if (cublasSasum(flush_reader, (int)(FLUSH_BYTES / 4), flush_buf, 1, flush_sum) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "fp4moe bench: cublasSasum (the clean L2 flush) failed\n");
        exit(CLI_FAIL);
    }
}

/* Median microseconds of a graph launch, L2 flushed before each. graphs[r % n]; with prev,
 * prev[r % n] runs after the flush and before the timed launch. */
static float time_graphs(cudaGraphExec_t *graphs, cudaGraphExec_t *prev, int n, int reps, cudaStream_t s)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float *t = malloc((size_t)reps * sizeof *t);
    for (int w = 0; w < 3; w++)
        CK(cudaGraphLaunch(graphs[w % n], s));
    for (int r = 0; r < reps; r++) {
        flush_l2(r, s);
        if (prev)
            CK(cudaGraphLaunch(prev[r % n], s));
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(graphs[r % n], s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[r], a, b));
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_float);
    float med = t[reps / 2] * 1000.0f;
    free(t);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return med;
}

/* Device-to-device copy bandwidth in bytes/s (read + write). */
static double copy_bandwidth(cudaStream_t s)
{
    size_t n = (size_t)1 << 30;
    void *x, *y;
    CK(cudaMalloc(&x, n));
    CK(cudaMalloc(&y, n));
    CK(cudaMemsetAsync(x, 1, n, s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[9];
    for (int r = 0; r < 9; r++) {
        CK(cudaEventRecord(a, s));
        CK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[r], a, b));
    }
    qsort(t, 9, sizeof *t, cmp_float);
    cudaFree(x);
    cudaFree(y);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 2.0 * (double)n / (t[4] * 1e-3);
}

/* Median microseconds of a cuBLAS BF16 GEMM C[m,n] = A[m,k] B[k,n], fp32 accumulate. Inputs
 * random (never zeros). */
static float cublas_us(cublasHandle_t h, int m, int n, int k, cudaStream_t s)
{
    void *A, *B, *C;
    size_t na = (size_t)m * k, nb = (size_t)k * n;
    CK(cudaMalloc(&A, na * 2));
    CK(cudaMalloc(&B, nb * 2));
    CK(cudaMalloc(&C, (size_t)m * n * 2));
    uint16_t *host = malloc((na > nb ? na : nb) * 2);
    uint64_t st = 12345;
    for (size_t i = 0; i < (na > nb ? na : nb); i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = fp4moe_bf16_from_float((float)((st >> 40) & 0xffff) / 65536.0f - 0.5f);
    }
    CK(cudaMemcpy(A, host, na * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, host, nb * 2, cudaMemcpyHostToDevice));
    free(host);
    float alpha = 1.0f, beta = 0.0f;
    cublasSetStream(h, s);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    /* column-major: C^T[n, m] = B^T[n, k] A^T[k, m] */
    cublasStatus_t cs = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, B, CUDA_R_16BF, n, A,
                                     CUDA_R_16BF, k, &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    CK(cudaStreamEndCapture(s, &g));
    if (cs != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "fp4moe bench: cublasGemmEx failed (%d)\n", (int)cs);
        exit(CLI_FAIL);
    }
    CK(cudaGraphInstantiate(&ge, g, 0));
    float us = time_graphs(&ge, NULL, 1, 20, s);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    return us;
}

static int load_problems(const char *path, problem **out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fp4moe bench: cannot open problems file '%s'\n", path);
        return -1;
    }
    char line[512], routing[32];
    int n = 0, cap = 0, lineno = 0;
    problem *p = NULL;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *c = line;
        while (*c == ' ' || *c == '\t')
            c++;
        if (*c == '#' || *c == '\n' || *c == '\0')
            continue;
        problem q = {0};
        int got = sscanf(c, "%d %d %d %d %d %31s %d", &q.hidden, &q.inter, &q.experts, &q.topk, &q.m, routing, &q.shared);
        if (got < 6 || q.hidden <= 0 || q.inter <= 0 || q.experts <= 0 || q.topk <= 0 || q.topk > q.experts || q.m <= 0 ||
            (strcmp(routing, "uniform") && strcmp(routing, "skewed")) || q.shared < 0) {
            fprintf(stderr, "fp4moe bench: '%s' line %d: expected \"hidden intermediate experts topk M uniform|skewed [shared]\" with positive sizes and topk <= experts, found: %s",
                    path, lineno, line);
            fclose(f);
            free(p);
            return -1;
        }
        q.skewed = !strcmp(routing, "skewed");
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            p = realloc(p, (size_t)cap * sizeof *p);
        }
        p[n++] = q;
    }
    fclose(f);
    *out = p;
    return n;
}

int cmd_bench(int argc, char **argv)
{
    const char *problems_path = NULL, *json_path = NULL, *backend = NULL;
    int all_kernels = 0, prev_layer = 0, clean_flush = 0;
    long reps = 30, dec_slot = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--all-kernels")) {
            all_kernels = 1;
        } else if (!strcmp(a, "--prev-layer")) {
            prev_layer = 1;
        } else if (!strcmp(a, "--flush")) {
            if (!(val = cli_value("bench", argc, argv, &i)))
                return CLI_USAGE;
            if (strcmp(val, "dirty") && strcmp(val, "clean")) {
                fprintf(stderr, "fp4moe bench: --flush: expected dirty or clean, found '%s'\n", val);
                return CLI_USAGE;
            }
            clean_flush = !strcmp(val, "clean");
        } else if (!strcmp(a, "--problems")) {
            if (!(problems_path = cli_value("bench", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--json")) {
            if (!(json_path = cli_value("bench", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--moe-backend")) {
            if (!(backend = cli_value("bench", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--reps")) {
            if (!(val = cli_value("bench", argc, argv, &i)) || !cli_int("bench", a, val, 3, 100000, &reps))
                return CLI_USAGE;
        } else if (!strcmp(a, "--dec-slot-tokens")) {
            if (!(val = cli_value("bench", argc, argv, &i)) || !cli_int("bench", a, val, 8, 32, &dec_slot))
                return CLI_USAGE;
            if (dec_slot != 8 && dec_slot != 16 && dec_slot != 32) {
                fprintf(stderr, "fp4moe bench: --dec-slot-tokens: expected 8, 16 or 32, found %ld\n", dec_slot);
                return CLI_USAGE;
            }
        } else if (!strcmp(a, "--seed")) {
            if (!(val = cli_value("bench", argc, argv, &i)) || !cli_u64("bench", a, val, &seed))
                return CLI_USAGE;
        } else {
            fprintf(stderr, "fp4moe bench: unknown argument '%s'\n%s", a, usage_text);
            return CLI_USAGE;
        }
    }
    char default_path[4096];
    if (!problems_path) {
        const char *src = getenv("FP4MOE_SRC");
        snprintf(default_path, sizeof default_path, "%s/bench/problems.txt", src ? src : ".");
        problems_path = default_path;
    }
    problem *probs = NULL;
    int np = load_problems(problems_path, &probs);
    if (np < 0)
        return CLI_USAGE;
    fp4_err e = {0};
    fp4_device dev;
    fp4_device_resolve(NULL, &dev, &e);
    if (!dev.cuda) {
        fprintf(stderr, "fp4moe bench: no CUDA device\n");
        free(probs);
        return CLI_FAIL;
    }
    int nreg;
    const fp4_backend *const *reg = fp4_backend_registry(&nreg);
    if (backend && !fp4_backend_lookup(reg, nreg, backend)) {
        char names[512];
        fp4_backend_list(reg, nreg, names, sizeof names);
        fprintf(stderr, "fp4moe bench: --moe-backend: unknown backend '%s'; valid backends: %s\n", backend, names);
        free(probs);
        return CLI_USAGE;
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&flush_buf, FLUSH_BYTES));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "fp4moe bench: cublasCreate failed\n");
        return CLI_FAIL;
    }
    if (clean_flush) { /* the buffer written once here; every flush then only reads it */
        CK(cudaMalloc((void **)&flush_sum, sizeof *flush_sum));
        CK(cudaMemsetAsync(flush_buf, 0x3c, FLUSH_BYTES, s));
        if (cublasCreate(&flush_reader) != CUBLAS_STATUS_SUCCESS ||
            cublasSetStream(flush_reader, s) != CUBLAS_STATUS_SUCCESS ||
            cublasSetPointerMode(flush_reader, CUBLAS_POINTER_MODE_DEVICE) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "fp4moe bench: cuBLAS setup for --flush clean failed\n");
            return CLI_FAIL;
        }
        flush_l2(0, s);
    }
    double bw = copy_bandwidth(s);
    float peak_us = cublas_us(h, 8192, 8192, 8192, s);
    double peak = 2.0 * 8192.0 * 8192.0 * 8192.0 / (peak_us * 1e-6);
    printf("device %s: copy %.0f GB/s (read+write), cuBLAS BF16 %.0f TFLOP/s (8192^3)\n", dev.name, bw / 1e9, peak / 1e12);
    FILE *jf = NULL;
    if (json_path && !(jf = fopen(json_path, "w"))) {
        fprintf(stderr, "fp4moe bench: cannot write '%s'\n", json_path);
        return CLI_FAIL;
    }
    if (jf)
        fprintf(jf, "{\"device\": \"%s\", \"copy_GBps\": %.1f, \"cublas_peak_TFLOPs\": %.1f, \"dec_slot_tokens\": %ld, \"prev_layer\": %s, \"flush\": \"%s\", \"results\": [\n",
                dev.name, bw / 1e9, peak / 1e12, dec_slot, prev_layer ? "true" : "false", clean_flush ? "clean" : "dirty");
    if (dec_slot) printf("decode slots: %ld tokens (--dec-slot-tokens) where M > 32\n", dec_slot);
    if (prev_layer) printf("each timed forward runs after another layer's forward (--prev-layer)\n");
    if (clean_flush) printf("L2 flushed by a 256 MB read (--flush clean)\n");
    printf("%-32s %-16s %9s %8s %8s %9s %7s %8s %7s %9s %8s\n", "problem (H I E k M routing)", "backend/kernel", "us",
           "route_us", "exp_us", "floor_us", "x_floor", "GB/s", "TFLOP/s", "cublas_us", "bound");
    int first_json = 1;
    fp4_moe_random rw = {0};
    fp4_gpu_moe *g = NULL, *g_prev = NULL; /* kept across problems of one layer shape and top-k */
    int have = 0;
    problem cur = {0};
    for (int pi = 0; pi < np; pi++) {
        problem *p = &probs[pi];
        fprintf(stderr, "[%d/%d] H %d I %d E %d top-%d M %d %s\n", pi + 1, np, p->hidden, p->inter, p->experts, p->topk,
                p->m, p->skewed ? "skewed" : "uniform");
        fp4_arch A;
        fp4_arch_for_bench(&A, p->hidden, p->inter, p->experts, p->topk, p->shared);
        if (!have || cur.hidden != p->hidden || cur.inter != p->inter || cur.experts != p->experts ||
            cur.shared != p->shared) {
            if (have)
                fp4_moe_random_free(&rw);
            if (fp4_moe_random_create(&A, seed, &rw, &e))
                return cli_error("bench", &e);
            have = 1;
            cur = *p;
        }
        /* Skewed routing: a strong bias toward the first 16 experts. */
        for (int j = 0; j < p->experts; j++)
            rw.w.router_bias[j] = (p->skewed && j < 16) ? 1.0f : 0.0f;
        fp4_layer_need need = {0, {FP4_W_NVFP4, FP4_A_NONE}, {FP4_W_NVFP4, FP4_A_NONE}, A.act, A.swiglu_limit};
        unsigned timed = 0;
        for (int b = 0; b < nreg; b++) {
            if (!reg[b]->gpu)
                continue;
            if (backend && fp4_backend_lookup(reg, nreg, backend) != reg[b])
                continue;
            char reason[256];
            if (!fp4_backend_serves(reg[b], &dev, &need, reason, sizeof reason)) {
                printf("  %s: SKIP: %s\n", reg[b]->name, reason);
                continue;
            }
            fp4_gpu_kernel pick = (fp4_gpu_kernel)fp4_oracle_kernel(reg[b], p->m, p->topk, p->experts);
            for (int ki = 0; ki < (all_kernels ? reg[b]->n_kernels : 1); ki++) {
                fp4_gpu_kernel kern = all_kernels ? (fp4_gpu_kernel)reg[b]->kernels[ki].kernel : pick;
                if (timed & (1u << kern))
                    continue; /* the same kernel under another backend: one row is enough */
                timed |= 1u << kern;
                if (!g) {
                    if (fp4_gpu_moe_create(&A, &rw.w, &g, &e)) return cli_error("bench", &e);
                    if (dec_slot) fp4_gpu_moe_set_dec_slot_tokens(g, (int)dec_slot);
                    /* the layer before: the same host weights, its own device copy */
                    if (prev_layer && fp4_gpu_moe_create(&A, &rw.w, &g_prev, &e)) return cli_error("bench", &e);
                    if (prev_layer && dec_slot) fp4_gpu_moe_set_dec_slot_tokens(g_prev, (int)dec_slot);
                }
                size_t wsb = fp4_gpu_moe_workspace_size(g, p->m), xb = (size_t)p->m * p->hidden * 2;
                void *ws, *x[ROTATE];
                float *y, *y_prev = NULL;
                int32_t *ids;
                float *tw;
                CK(cudaMalloc(&ws, wsb ? wsb : 1));
                CK(cudaMalloc((void **)&y, (size_t)p->m * p->hidden * 4));
                if (g_prev)
                    CK(cudaMalloc((void **)&y_prev, (size_t)p->m * p->hidden * 4));
                CK(cudaMalloc((void **)&ids, (size_t)p->m * p->topk * 4));
                CK(cudaMalloc((void **)&tw, (size_t)p->m * p->topk * 4));
                uint16_t *hx = malloc(xb);
                uint64_t st = seed + (uint64_t)pi;
                int32_t *hid = malloc((size_t)p->m * p->topk * 4);
                unsigned char *hit = calloc((size_t)p->experts, 1);
                cudaGraphExec_t ge[ROTATE], gp[ROTATE], gb[ROTATE]; /* forward, prologue only, layer before */
                for (int r = 0; r < ROTATE; r++) {
                    for (size_t i = 0; i < (size_t)p->m * p->hidden; i++) {
                        st = st * 6364136223846793005ull + 1442695040888963407ull;
                        hx[i] = fp4moe_bf16_from_float(((float)((st >> 40) & 0xffff) / 65536.0f - 0.5f) * 3.4f);
                    }
                    CK(cudaMalloc(&x[r], xb));
                    CK(cudaMemcpy(x[r], hx, xb, cudaMemcpyHostToDevice));
                    if (fp4_gpu_moe_forward(g, kern, x[r], p->m, y, ids, tw, ws, wsb, s, &e))
                        return cli_error("bench", &e);
                    CK(cudaStreamSynchronize(s));
                    CK(cudaMemcpy(hid, ids, (size_t)p->m * p->topk * 4, cudaMemcpyDeviceToHost));
                    for (int i = 0; i < p->m * p->topk; i++)
                        if (hid[i] >= 0 && hid[i] < p->experts)
                            hit[hid[i]] = 1;
                    cudaGraph_t gr;
                    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                    fp4moe_status fst = fp4_gpu_moe_forward(g, kern, x[r], p->m, y, ids, tw, ws, wsb, s, &e);
                    CK(cudaStreamEndCapture(s, &gr));
                    if (fst)
                        return cli_error("bench", &e);
                    CK(cudaGraphInstantiate(&ge[r], gr, 0));
                    cudaGraphDestroy(gr);
                    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                    fst = fp4_gpu_moe_prologue(g, kern, x[r], p->m, ids, tw, ws, wsb, s, &e);
                    CK(cudaStreamEndCapture(s, &gr));
                    if (fst)
                        return cli_error("bench", &e);
                    CK(cudaGraphInstantiate(&gp[r], gr, 0));
                    cudaGraphDestroy(gr);
                    if (g_prev) { /* one workspace for both layers, as in a model */
                        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                        fst = fp4_gpu_moe_forward(g_prev, kern, x[r], p->m, y_prev, ids, tw, ws, wsb, s, &e);
                        CK(cudaStreamEndCapture(s, &gr));
                        if (fst)
                            return cli_error("bench", &e);
                        CK(cudaGraphInstantiate(&gb[r], gr, 0));
                        cudaGraphDestroy(gr);
                    }
                }
                int n_hit = 0;
                for (int j = 0; j < p->experts; j++)
                    n_hit += hit[j];
                /* Over the rotated inputs the union of experts hit is an upper bound of the
                 * per-call bytes; report per-call bytes from the expected count instead. */
                double per_expert = 3.0 * p->inter * (double)p->hidden * 0.5625;
                double expect_hit = p->experts * (1.0 - pow(1.0 - (double)p->topk / p->experts, p->m));
                if (p->skewed || expect_hit > n_hit)
                    expect_hit = n_hit;
                double bytes = expect_hit * per_expert + (double)p->shared * 3.0 * p->hidden * 2.0 +
                               (double)p->m * p->hidden * (2.0 + 4.0);
                double flops = 2.0 * p->m * (double)p->topk * 3.0 * p->hidden * p->inter +
                               2.0 * p->m * 3.0 * (double)p->hidden * p->shared;
                cudaGraphExec_t *before = g_prev ? gb : NULL;
                float us = time_graphs(ge, before, ROTATE, (int)reps, s);
                /* experts = forward - prologue (routing + grouping): the peer's timed scope */
                float pro_us = time_graphs(gp, before, ROTATE, (int)reps, s), exp_us = us - pro_us;
                float cb = cublas_us(h, p->m * p->topk, 3 * p->inter, p->hidden, s);
                double floor_mem = bytes / bw * 1e6, floor_tc = flops / peak * 1e6;
                double floor_us = floor_mem > floor_tc ? floor_mem : floor_tc;
                char label[64];
                snprintf(label, sizeof label, "%d %d %d %d %d %s", p->hidden, p->inter, p->experts, p->topk, p->m,
                         p->skewed ? "skewed" : "uniform");
                char bk[48];
                snprintf(bk, sizeof bk, "%s/%s%s", reg[b]->name, fp4_gpu_kernel_name(kern), kern == pick ? "*" : "");
                printf("%-32s %-16s %9.1f %8.1f %8.1f %9.1f %7.2f %8.0f %7.1f %9.1f %8s\n", label, bk, us, pro_us,
                       exp_us, floor_us, us / floor_us, bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12, cb,
                       floor_mem > floor_tc ? "memory" : "compute");
                fflush(stdout);
                if (jf) {
                    fprintf(jf, "%s  {\"hidden\": %d, \"inter\": %d, \"experts\": %d, \"topk\": %d, \"m\": %d, \"routing\": \"%s\", \"shared\": %d, \"backend\": \"%s\", \"kernel\": \"%s\", \"oracle_pick\": %s, \"us\": %.2f, \"prologue_us\": %.2f, \"experts_us\": %.2f, \"bytes\": %.0f, \"flops\": %.0f, \"floor_mem_us\": %.2f, \"floor_tc_us\": %.2f, \"x_floor\": %.3f, \"GBps\": %.1f, \"TFLOPs\": %.2f, \"cublas_same_flops_us\": %.2f, \"experts_hit\": %.1f}",
                            first_json ? "" : ",\n", p->hidden, p->inter, p->experts, p->topk, p->m, p->skewed ? "skewed" : "uniform",
                            p->shared, reg[b]->name, fp4_gpu_kernel_name(kern), kern == pick ? "true" : "false", us, pro_us, exp_us, bytes, flops, floor_mem, floor_tc, us / floor_us,
                            bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12, cb, expect_hit);
                    first_json = 0;
                }
                for (int r = 0; r < ROTATE; r++) {
                    cudaGraphExecDestroy(ge[r]);
                    cudaGraphExecDestroy(gp[r]);
                    if (g_prev)
                        cudaGraphExecDestroy(gb[r]);
                    cudaFree(x[r]);
                }
                cudaFree(ws);
                cudaFree(y);
                cudaFree(y_prev);
                cudaFree(ids);
                cudaFree(tw);
                free(hx);
                free(hid);
                free(hit);
            }
        }
        if (g && (pi + 1 == np || probs[pi + 1].hidden != p->hidden || probs[pi + 1].inter != p->inter ||
                  probs[pi + 1].experts != p->experts || probs[pi + 1].topk != p->topk ||
                  probs[pi + 1].shared != p->shared || probs[pi + 1].skewed != p->skewed)) {
            fp4_gpu_moe_destroy(g); /* the next problem needs another layer */
            if (g_prev)
                fp4_gpu_moe_destroy(g_prev);
            g = g_prev = NULL;
        }
    }
    if (jf) {
        fprintf(jf, "\n]}\n");
        fclose(jf);
    }
    if (have)
        fp4_moe_random_free(&rw);
    cublasDestroy(h);
    if (flush_reader) cublasDestroy(flush_reader);
    cudaFree(flush_sum);
    cudaFree(flush_buf);
    cudaStreamDestroy(s);
    free(probs);
    return CLI_OK;
}
#endif
