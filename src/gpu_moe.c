/* gpu_moe.c - placeholder; the GPU pipeline's host side lands here. */
#include "gpu_moe.h"
