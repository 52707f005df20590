#!/bin/sh
# Builds the wgmma lab into build-wgmma/ (run from the repository root). No GPU needed.
set -e
mkdir -p build-wgmma
nvcc -O3 -lineinfo -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v,-warn-spills \
    -Isrc/cuda dev/sm90_wgmma/wgmma_lab.cu src/cuda/w4a16_mma_gemm.cu \
    src/cuda/sm90_w4a16_wgmma.cu -o build-wgmma/wgmma_lab 2> build-wgmma/ptxas.txt
grep -E "Used|spill|warn|error" build-wgmma/ptxas.txt | sort | uniq -c || true
