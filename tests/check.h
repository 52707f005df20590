/*
 * check.h - the one assertion macro of the C tests: a failed check prints its location and
 * every parameter given; check_done() prints the closing line "N passed, M failed" that CTest
 * and CI read, and returns the exit status. Also check_next32, the tests' deterministic
 * generator, so failures reproduce.
 */
#ifndef FP4MOE_TEST_CHECK_H
#define FP4MOE_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>

/* xorshift64 step on *state (seeded non-zero by the test); bits 16..47 of the new state. */
static inline uint32_t check_next32(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state >> 16);
}

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
