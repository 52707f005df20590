/*
 * cli.h - shared pieces of the command-line tool: argument parsing helpers and the entry
 * point of each subcommand (one file each: cmd_gen.c, cmd_inspect.c, cmd_check.c, ...).
 */
#ifndef FP4MOE_CLI_H
#define FP4MOE_CLI_H

#include <stdint.h>

#include "common.h"

/* Exit codes: 0 success, 1 failure (bad input, failed check), 2 usage error. */
#define CLI_OK 0
#define CLI_FAIL 1
#define CLI_USAGE 2

/* Parse a flag value: on error print "fp4moe <cmd>: <flag>: ..." and return 0. */
int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out);
int cli_u64(const char *cmd, const char *flag, const char *v, uint64_t *out);
/* The value after a flag, or NULL with a message when it is missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* Print an fp4_err as "fp4moe <cmd>: error: <msg>" and return CLI_FAIL. */
int cli_error(const char *cmd, const fp4_err *e);

int cmd_gen(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_layer(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif /* FP4MOE_CLI_H */
