/*
 * fp4moe.c - the command-line tool: gen, inspect, check, layer, bench. Each subcommand lives
 * in its own file (cmd_*.c); this one dispatches and holds the small parsing helpers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fp4moe.h"

static void usage(FILE *f)
{
    fprintf(f,
            "fp4moe %s - NVFP4 Mixture-of-Experts checkpoints on NVIDIA Hopper (W4A16)\n"
            "\n"
            "usage: fp4moe <command> [options]\n"
            "  gen DIR --preset NAME [--layers N] [--seed S] [--act-scheme none|static|per-token]\n"
            "          [--format modelopt|compressed-tensors|minimax-m31] [--shard-size BYTES] [--topk K]\n"
            "  inspect DIR [--json] [--layers N] [--verify] [--device-arch ARCH] [--moe-backend NAME]\n"
            "  check DIR [--layer L|--all] [--tokens M] [--moe-backend NAME|--all-backends]\n"
            "          [--routing uniform|skewed] [--seed S] [--layers N] [--device-arch ARCH]\n"
            "  layer DIR --layer L --input IN.safetensors --output OUT.safetensors [--moe-backend NAME]\n"
            "  bench [--problems FILE] [--moe-backend NAME] [--reps N] [--json FILE] [--seed S]\n"
            "\n"
            "Run 'fp4moe <command> --help' for details. See README.md.\n",
            FP4MOE_VERSION);
}

int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "fp4moe %s: %s: expected an integer in [%ld, %ld], found '%s'\n", cmd, flag, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int cli_u64(const char *cmd, const char *flag, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-') {
        fprintf(stderr, "fp4moe %s: %s: expected a non-negative integer, found '%s'\n", cmd, flag, v);
        return 0;
    }
    *out = (uint64_t)x;
    return 1;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "fp4moe %s: %s: expected a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_error(const char *cmd, const fp4_err *e)
{
    fprintf(stderr, "fp4moe %s: error: %s\n", cmd, e->msg[0] ? e->msg : fp4moe_status_string(e->status));
    return CLI_FAIL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *c = argv[1];
    if (!strcmp(c, "-h") || !strcmp(c, "--help") || !strcmp(c, "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(c, "--version")) {
        printf("fp4moe %s\n", FP4MOE_VERSION);
        return CLI_OK;
    }
    if (!strcmp(c, "gen"))
        return cmd_gen(argc - 1, argv + 1);
    if (!strcmp(c, "inspect"))
        return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(c, "check"))
        return cmd_check(argc - 1, argv + 1);
    if (!strcmp(c, "layer"))
        return cmd_layer(argc - 1, argv + 1);
    if (!strcmp(c, "bench"))
        return cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "fp4moe: unknown command '%s' (expected gen, inspect, check, layer or bench)\n", c);
    usage(stderr);
    return CLI_USAGE;
}
