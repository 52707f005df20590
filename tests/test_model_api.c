/*
 * test_model_api.c - the public API of fp4moe.h end to end on a generated tiny checkpoint:
 * open (with a layer limit, a device override and a backend request), the per-layer plan the
 * oracle made, forward on the CPU, and errors reported through fp4moe_model_errmsg.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp4moe.h"
#include "gen.h"

#include "check.h"



int main(void)
{
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/fp4moe-api-test-%ld", (long)getpid());
    fp4_gen_options g = {0};
    g.dir = dir;
    g.preset = "tiny";
    g.seed = 7;
    g.act = FP4_A_NVFP4_PER_TOKEN;
    g.format = FP4_QF_COMPRESSED_TENSORS;
    g.shard_size = 1 << 20;
    fp4_err e = {0};
    if (fp4_gen(&g, &e) != FP4MOE_OK) {
        printf("FAIL: gen: %s\n0 passed, 1 failed\n", e.msg);
        return 1;
    }

    fp4moe_model_t m = NULL;
    fp4moe_open_options o = {3, "cpu", NULL};
    fp4moe_status st = fp4moe_model_open(dir, &o, &m);
    CHECK(st == FP4MOE_OK, "open: %s", fp4moe_model_errmsg(m));
    if (st == FP4MOE_OK) {
        CHECK(fp4moe_model_num_layers(m) == 3, "layers %d, expected 3 (max_layers)", fp4moe_model_num_layers(m));
        CHECK(fp4moe_model_hidden_size(m) == 256, "hidden %d", fp4moe_model_hidden_size(m));
        CHECK(!fp4moe_model_layer_is_moe(m, 0) && fp4moe_model_layer_is_moe(m, 1), "layer kinds");
        fp4moe_layer_plan p;
        CHECK(fp4moe_model_layer_plan(m, 1, &p) == FP4MOE_OK, "plan: %s", fp4moe_model_errmsg(m));
        CHECK(!strcmp(p.backend, "reference") && !strcmp(p.precision, "reference") &&
                  strstr(p.dropped, "nvfp4-per-token"),
              "plan: backend %s precision %s dropped '%s'", p.backend, p.precision, p.dropped);
        int M = 5, H = 256, k = fp4moe_model_topk(m);
        float *x = malloc(sizeof(float) * M * H), *y = malloc(sizeof(float) * M * H);
        int32_t *ids = malloc(sizeof(int32_t) * M * k);
        float *w = malloc(sizeof(float) * M * k);
        for (int i = 0; i < M * H; i++)
            x[i] = sinf(0.37f * (float)i);
        for (int L = 0; L < 3; L++) {
            for (int i = 0; i < M * H; i++)
                y[i] = NAN;
            st = fp4moe_model_layer_forward(m, L, x, M, y, ids, w);
            CHECK(st == FP4MOE_OK, "forward layer %d: %s", L, fp4moe_model_errmsg(m));
            int finite = 1;
            for (int i = 0; i < M * H; i++)
                finite &= isfinite(y[i]) != 0;
            CHECK(finite, "layer %d: every output written and finite", L);
            if (L > 0) {
                float sum = 0;
                for (int i = 0; i < k; i++)
                    sum += w[i];
                CHECK(fabsf(sum - 2.0f) < 1e-5f, "layer %d: routing weights sum %g, expected routed_scaling 2", L, sum);
                CHECK(ids[0] != ids[1] && ids[0] >= 0 && ids[0] < 8, "layer %d: ids %d %d", L, ids[0], ids[1]);
            }
        }
        st = fp4moe_model_layer_forward(m, 9, x, M, y, ids, w);
        CHECK(st == FP4MOE_ERR_INVALID_ARGUMENT && strstr(fp4moe_model_errmsg(m), "layer 9"), "bad layer: %s",
              fp4moe_model_errmsg(m));
        free(x), free(y), free(ids), free(w);
    }
    fp4moe_model_destroy(m);

    /* An explicit GPU backend on a CPU device fails at open with the oracle's sentence. */
    fp4moe_open_options o2 = {0, "cpu", "marlin"};
    m = NULL;
    st = fp4moe_model_open(dir, &o2, &m);
    CHECK(st == FP4MOE_ERR_NOT_SUPPORTED &&
              strstr(fp4moe_model_errmsg(m), "backend 'w4a16-mma' cannot run layer 1 (nvfp4/fc1 nvfp4-per-token, fc2 none)"),
          "explicit GPU backend on cpu: %s (%s)", fp4moe_status_string(st), fp4moe_model_errmsg(m));
    fp4moe_model_destroy(m);

    /* Emulation runs the declared per-token FC1 scheme. */
    fp4moe_open_options o3 = {2, "sm90", "emulation"};
    m = NULL;
    st = fp4moe_model_open(dir, &o3, &m);
    CHECK(st == FP4MOE_OK, "emulation open: %s", fp4moe_model_errmsg(m));
    if (st == FP4MOE_OK) {
        fp4moe_layer_plan p;
        fp4moe_model_layer_plan(m, 1, &p);
        CHECK(!strcmp(p.precision, "W4A4-emulated") && p.dropped[0] == '\0', "emulation plan: %s '%s'", p.precision,
              p.dropped);
    }
    fp4moe_model_destroy(m);

    /* A missing directory names itself. */
    m = NULL;
    st = fp4moe_model_open("/nonexistent/model", NULL, &m);
    CHECK(st == FP4MOE_ERR_IO && strstr(fp4moe_model_errmsg(m), "/nonexistent/model"), "missing dir: %s",
          fp4moe_model_errmsg(m));
    fp4moe_model_destroy(m);

    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    return check_done();
}
