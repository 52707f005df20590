#!/bin/sh
# run_all.sh BUILD_DIR - run the GPU tests from a prebuilt build directory (made with
# -DFP4MOE_WITH_CUDA=ON) on a machine with a CUDA device; logs go under $OUT (default ./gpu-logs).
# Usage from the repository root: tests/gpu/run_all.sh build-gpu
# test_gpu_moe checks every kernel (mma, decode, sm90-wgmma on sm_90); FP4MOE_GPU_TIMING=1 in
# the environment adds its timing table (tp8, M 1..256). Also runs compute-sanitizer memcheck
# on the small cases when it is installed
# (FP4MOE_GPU_SANITIZE=0 skips it). Time limits: FP4MOE_GPU_TEST_TIMEOUT (300 s per test),
# FP4MOE_GPU_SANITIZE_TIMEOUT (240 s). Exit status: non-zero if any test failed.
set -u
build=${1:?usage: tests/gpu/run_all.sh BUILD_DIR}
out=${OUT:-./gpu-logs}
mkdir -p "$out"
export LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.txt" 2>&1
status=0
for t in "$build"/test_gpu_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "== $name"
    start=$(date +%s)
    timeout "${FP4MOE_GPU_TEST_TIMEOUT:-300}" "$t" > "$out/$name.log" 2>&1
    rc=$?
    echo "   exit $rc in $(( $(date +%s) - start )) s: $(tail -n 1 "$out/$name.log")"
    grep -E '^(FAIL|SKIP)' "$out/$name.log" | head -20
    [ $rc -eq 0 ] || status=1
done
if [ "${FP4MOE_GPU_SANITIZE:-1}" != 0 ] && command -v compute-sanitizer > /dev/null &&
   [ -x "$build/test_gpu_moe" ]; then
    echo "== compute-sanitizer memcheck (small cases: FP4MOE_GPU_TEST_SMALL=1)"
    FP4MOE_GPU_TEST_SMALL=1 timeout "${FP4MOE_GPU_SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$build/test_gpu_moe" > "$out/memcheck.log" 2>&1
    rc=$?
    echo "   exit $rc: $(grep -E 'ERROR SUMMARY|passed' "$out/memcheck.log" | tr '\n' ' ')"
    [ $rc -eq 0 ] || status=1
fi
exit $status
