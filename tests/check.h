/*
 * check.h - the one assertion macro of the C tests: a failed check prints its location and
 * every parameter given; check_done() prints the closing line "N passed, M failed" that CTest
 * and CI read, and returns the exit status.
 */
#ifndef FP4MOE_TEST_CHECK_H
#define FP4MOE_TEST_CHECK_H

#include <stdio.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
        } else {                                                                                   \
            n_fail++;                                                                              \
            printf("FAIL %s:%d (%s): ", __FILE__, __LINE__, __func__);                             \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static inline int check_done(void)
{
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif /* FP4MOE_TEST_CHECK_H */
