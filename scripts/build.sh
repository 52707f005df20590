#!/usr/bin/env bash
# Configure and build fp4moe into build/ (CUDA kernels for sm_90a and sm_80 when nvcc is
# available; set FP4MOE_WITH_CUDA=OFF to build the host library alone).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cuda="${FP4MOE_WITH_CUDA:-}"
if [ -z "$cuda" ]; then
  if command -v nvcc >/dev/null; then cuda=ON; else
    echo "build: no nvcc found: building without CUDA kernels (FP4MOE_WITH_CUDA=OFF)" >&2; cuda=OFF; fi
fi
cmake -S . -B "${BUILD_DIR:-build}" -DFP4MOE_WITH_CUDA="$cuda" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "${BUILD_DIR:-build}" -j"$(nproc)"
