/* cmd_gen.c - `fp4moe gen`: write a random model directory (see src/gen.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gen.h"

static const char *usage_text =
    "usage: fp4moe gen DIR --preset NAME [--layers N] [--seed S] [--act-scheme none|static|per-token]\n"
    "                  [--format modelopt|compressed-tensors|minimax-m31] [--shard-size BYTES] [--topk K]\n"
    "presets: tiny, minimax-m3.1-flash-tp8, minimax-m3.1-flash. Defaults: --format modelopt,\n"
    "--act-scheme none, --seed 0, --shard-size 5000000000. per-token declares FC1 only.\n";

static void progress(void *ctx, int done, int total)
{
    (void)ctx;
    fprintf(stderr, "\rfp4moe gen: shard %d/%d written", done, total);
    if (done == total)
        fputc('\n', stderr);
}

int cmd_gen(int argc, char **argv)
{
    fp4_gen_options o = {0};
    o.format = FP4_QF_MODELOPT;
    o.act = FP4_A_NONE;
    if (isatty(STDERR_FILENO))
        o.progress = progress; /* shards written, on long runs */
    long v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--preset")) {
            if (!(o.preset = cli_value("gen", argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--layers")) {
            if (!(val = cli_value("gen", argc, argv, &i)) || !cli_int("gen", a, val, 1, 100000, &v))
                return CLI_USAGE;
            o.layers = (int)v;
        } else if (!strcmp(a, "--topk")) {
            if (!(val = cli_value("gen", argc, argv, &i)) || !cli_int("gen", a, val, 1, 100000, &v))
                return CLI_USAGE;
            o.topk = (int)v;
        } else if (!strcmp(a, "--seed")) {
            if (!(val = cli_value("gen", argc, argv, &i)) || !cli_u64("gen", a, val, &o.seed))
                return CLI_USAGE;
        } else if (!strcmp(a, "--shard-size")) {
            if (!(val = cli_value("gen", argc, argv, &i)) || !cli_u64("gen", a, val, &o.shard_size))
                return CLI_USAGE;
            if (o.shard_size == 0) {
                fprintf(stderr, "fp4moe gen: --shard-size: expected a positive byte count, found 0\n");
                return CLI_USAGE;
            }
        } else if (!strcmp(a, "--act-scheme")) {
            if (!(val = cli_value("gen", argc, argv, &i)))
                return CLI_USAGE;
            if (!strcmp(val, "none")) o.act = FP4_A_NONE;
            else if (!strcmp(val, "static")) o.act = FP4_A_NVFP4_STATIC;
            else if (!strcmp(val, "per-token")) o.act = FP4_A_NVFP4_PER_TOKEN;
            else {
                fprintf(stderr, "fp4moe gen: --act-scheme: expected none, static or per-token, found '%s'\n", val);
                return CLI_USAGE;
            }
        } else if (!strcmp(a, "--format")) {
            if (!(val = cli_value("gen", argc, argv, &i)))
                return CLI_USAGE;
            if (!strcmp(val, "modelopt")) o.format = FP4_QF_MODELOPT;
            else if (!strcmp(val, "compressed-tensors")) o.format = FP4_QF_COMPRESSED_TENSORS;
            else if (!strcmp(val, "minimax-m31")) o.format = FP4_QF_MINIMAX_M31;
            else {
                fprintf(stderr, "fp4moe gen: --format: expected modelopt, compressed-tensors or minimax-m31, found '%s'\n", val);
                return CLI_USAGE;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "fp4moe gen: unknown option '%s'\n%s", a, usage_text);
            return CLI_USAGE;
        } else if (!o.dir) {
            o.dir = a;
        } else {
            fprintf(stderr, "fp4moe gen: unexpected argument '%s' (the directory is '%s')\n", a, o.dir);
            return CLI_USAGE;
        }
    }
    if (!o.dir || !o.preset) {
        fprintf(stderr, "fp4moe gen: expected DIR and --preset NAME\n%s", usage_text);
        return CLI_USAGE;
    }
    fp4_err e = {0};
    if (fp4_gen(&o, &e) != FP4MOE_OK)
        return cli_error("gen", &e);
    printf("wrote %s (preset %s)\n", o.dir, o.preset);
    return CLI_OK;
}
