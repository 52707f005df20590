/*
 * common.h - internal helpers shared by every host module: the error record that carries
 * "what, where, expected vs found" up to the handle or the command-line tool.
 */
#ifndef FP4MOE_COMMON_H
#define FP4MOE_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe.h"

#define FP4_ERR_LEN 1024

/* The detail of a failure. Functions that can fail take an fp4_err * (never NULL) and, on
 * failure, fill it and return its status; callers may prefix context with fp4_err_prefix. */
typedef struct fp4_err {
    fp4moe_status status;
    char msg[FP4_ERR_LEN];
} fp4_err;

/* Fill e and return st. Use: return fp4_fail(e, FP4MOE_ERR_FORMAT, "file '%s': ...", ...); */
fp4moe_status fp4_fail(fp4_err *e, fp4moe_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepend "context: " to an existing message (keeps the status). */
fp4moe_status fp4_err_prefix(fp4_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fp4_err_clear(fp4_err *e);

/* Overflow-checked size arithmetic: return 0 on overflow. */
int fp4_mul_size(size_t a, size_t b, size_t *out);

/* Join a directory and a file name into buf; returns 0 if it did not fit. */
int fp4_path_join(char *buf, size_t len, const char *dir, const char *name);

#endif /* FP4MOE_COMMON_H */
