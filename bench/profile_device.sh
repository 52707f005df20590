#!/usr/bin/env bash
# Per-kernel profile of the oracle's pick on a few problems (ncu: duration, DRAM bytes and
# throughput per kernel; nsys, when present: the graph-replay timeline summary).
#   bench/profile_device.sh BUILD_DIR [PROBLEMS_FILE]     logs: $OUT/profile_*.txt
# Optional environment: NCU_METRICS (comma list, replaces the default set), NCU_KERNELS
# (ncu -k filter, default regex:fp4_), NCU_COUNT (ncu -c: kernels profiled), NCU_EXTRA (more ncu
# flags, e.g. --clock-control none for boost-clock durations), BENCH_ARGS
# (extra `fp4moe bench` flags, e.g. --all-kernels), NSYS=0 (skip the nsys pass).
set -uo pipefail
B="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/fp4moe-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FP4MOE_SRC="$ROOT"
P="${2:-/tmp/fp4moe-profile-problems.txt}"
if [ ! -f "$P" ]; then
  printf '%s\n' "6144 384 128 8 1 uniform" "6144 384 128 8 8 uniform" "6144 384 128 8 64 uniform" \
    "6144 384 128 8 512 uniform" "6144 384 128 8 4096 uniform" > "$P"
fi
if command -v ncu > /dev/null; then
  M="${NCU_METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size}"
  # shellcheck disable=SC2086
  timeout 300 ncu -k "${NCU_KERNELS:-regex:fp4_}" ${NCU_COUNT:+-c "$NCU_COUNT"} ${NCU_EXTRA:-} --csv --metrics "$M" \
    "$B/fp4moe" bench --problems "$P" --reps 3 ${BENCH_ARGS:-} > "$OUT/profile_ncu.csv" 2> "$OUT/profile_ncu.err"
  echo "ncu rc=$? ($(wc -l < "$OUT/profile_ncu.csv") lines)"
else
  echo "ncu: not installed"
fi
if [ "${NSYS:-1}" = 0 ]; then
  echo "nsys: skipped (NSYS=0)"
elif command -v nsys > /dev/null; then
  # M=1 alone: the kernel sum of the replayed graph and its gaps
  echo "6144 384 128 8 1 uniform" > /tmp/fp4moe-profile-m1.txt
  timeout 200 nsys profile --cuda-graph-trace=node -o /tmp/fp4moe-nsys -f true \
    "$B/fp4moe" bench --problems /tmp/fp4moe-profile-m1.txt --reps 15 > "$OUT/profile_nsys.txt" 2>&1
  nsys stats -q --report cuda_gpu_trace --format csv /tmp/fp4moe-nsys.nsys-rep 2>&1 | tail -n 60 >> "$OUT/profile_nsys.txt"
  nsys stats -q --report cuda_gpu_kern_sum --format csv /tmp/fp4moe-nsys.nsys-rep >> "$OUT/profile_nsys.txt" 2>&1
  echo "nsys rc=$?"
else
  echo "nsys: not installed"
fi
