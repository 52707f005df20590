/* common.c - the error record and small helpers declared in common.h. */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *fp4moe_status_string(fp4moe_status status)
{
    switch (status) {
    case FP4MOE_OK: return "success";
    case FP4MOE_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FP4MOE_ERR_IO: return "I/O error";
    case FP4MOE_ERR_FORMAT: return "malformed or inconsistent input";
    case FP4MOE_ERR_NOT_SUPPORTED: return "not supported";
    case FP4MOE_ERR_CUDA: return "CUDA error";
    case FP4MOE_ERR_OUT_OF_MEMORY: return "out of memory";
    case FP4MOE_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

fp4moe_status fp4_fail(fp4_err *e, fp4moe_status st, const char *fmt, ...)
{
    va_list ap;
    e->status = st;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return st;
}

fp4moe_status fp4_err_prefix(fp4_err *e, const char *fmt, ...)
{
    char head[FP4_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    size_t hl = strlen(head), ml = strlen(e->msg), cap = sizeof e->msg - 1;
    if (hl + 2 > cap)
        hl = cap - 2;
    if (hl + 2 + ml > cap)
        ml = cap - hl - 2;
    memmove(e->msg + hl + 2, e->msg, ml);
    memcpy(e->msg, head, hl);
    e->msg[hl] = ':';
    e->msg[hl + 1] = ' ';
    e->msg[hl + 2 + ml] = '\0';
    return e->status;
}

void fp4_err_clear(fp4_err *e)
{
    e->status = FP4MOE_OK;
    e->msg[0] = '\0';
}

int fp4_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

int fp4_path_join(char *buf, size_t len, const char *dir, const char *name)
{
    int n = snprintf(buf, len, "%s/%s", dir, name);
    return n >= 0 && (size_t)n < len;
}
