#!/usr/bin/env bash
# The README's test command (and CI's): install what is missing, build, run every test with
# CTest (C tests, Python cross-checks; GPU tests print "SKIP: no CUDA device" without a GPU),
# then rebuild the host code under AddressSanitizer + UBSan and run the malformed-input tests
# there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j2)
echo "== AddressSanitizer + UBSan: malformed-input tests =="
cmake -S . -B build-asan -DFP4MOE_WITH_CUDA=OFF -DFP4MOE_ASAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
(cd build-asan && ctest --output-on-failure -j2 -R 'test_safetensors|test_model_config|test_quant_scheme|test_formats|test_oracle|bad_checkpoints')
