#!/bin/sh
# Device run of the wgmma lab (from the repository root): uses the carried build-wgmma/
# binary, rebuilds there if it does not start; full lab, then memcheck on the edge cases.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
./build-wgmma/wgmma_lab --probe || sh dev/sm90_wgmma/build.sh
./build-wgmma/wgmma_lab > "$OUT/lab.txt" 2>&1
echo "lab rc $?" >> "$OUT/lab.txt"
grep -E "FAIL|TIME|passed|rc " "$OUT/lab.txt"
timeout 90 compute-sanitizer --tool memcheck ./build-wgmma/wgmma_lab --small > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc $?"; tail -3 "$OUT/memcheck.txt"
