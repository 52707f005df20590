/*
 * cuda_check.h - CK(call) for the GPU tests: a CUDA runtime call that fails is not a test
 * result but a broken run, so it prints a FAIL line with the call, the error and the place,
 * and ends the test (exit status 2).
 */
#ifndef FP4MOE_TEST_CUDA_CHECK_H
#define FP4MOE_TEST_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            printf("FAIL %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                       \
                   cudaGetErrorString(err_));                                                      \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#endif /* FP4MOE_TEST_CUDA_CHECK_H */
