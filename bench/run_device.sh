#!/usr/bin/env bash
# The GPU check and benchmark of fp4moe, with logs under $OUT.
#   bench/run_device.sh BUILD_DIR [STEPS]     STEPS: comma list of tests,scenario,bench,peer
#                                             (default: all; a 10-minute call fits about
#                                             tests,scenario,bench, and peer in a second call),
#                                             or sanitize (the sanitizer part of tests alone)
# BUILD_DIR holds binaries built on the development machine (scripts/build.sh) plus
# libcjson.so.1 (copied there, since the device image lacks it). Steps:
#   1. every C test binary and the Python cross-checks (GPU tests run for real here);
#   2. the scenario of DESIGN.md section 1 at layer level: a tp8-rank checkpoint with
#      per-token FC1 metadata, inspected and checked with auto and each W4A16 backend,
#      beside the emulated A4 per-token error;
#   3. fp4moe bench over bench/problems.txt (skipped with "quick");
#   4. the peer (Humming, bench/peer/) on the same shapes, when .peer/ was carried.
set -uo pipefail
B="$(cd "$1" && pwd)"
STEPS=",${2:-tests,scenario,bench,peer},"
want() { case "$STEPS" in *",$1,"*) return 0 ;; esac; return 1; }
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/fp4moe-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FP4MOE_BIN="$B/fp4moe" FP4MOE_BUILD="$B" FP4MOE_SRC="$ROOT"
fails=0
step() { echo; echo "== $* =="; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# At most 8 files come back from $OUT: logs are concatenated into tests.log and scenario.txt.
TL="$OUT/tests.log" SC="$OUT/scenario.txt"
: > "$TL"; : > "$SC"

if want tests; then
step "C tests"
for t in "$B"/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  echo "==== $name" >> "$TL"
  if (cd "$B" && "$t") > /tmp/fp4moe-test.log 2>&1; then r=PASS; else r=FAIL; fails=$((fails+1)); fi
  cat /tmp/fp4moe-test.log >> "$TL"
  echo "$name: $r ($(tail -n 1 /tmp/fp4moe-test.log))"
done

fi
if want pytest; then
step "Python cross-checks (CPU only; CI runs them too)"
echo "==== pytest tests/py" >> "$TL"
if python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/py" > /tmp/fp4moe-pytest.log 2>&1; then echo "pytest: PASS";
else echo "pytest: FAIL"; fails=$((fails+1)); fi
cat /tmp/fp4moe-pytest.log >> "$TL"
tail -n 3 /tmp/fp4moe-pytest.log

fi
if want tests || want sanitize; then
step "compute-sanitizer memcheck and racecheck (small cases)"
if command -v compute-sanitizer >/dev/null; then
  # test_gpu_moe's small cases (every kernel), test_gpu_route (the routers' shared memory)
  # and test_gpu_scale_chunks (the decode and sm90-wgmma GEMMs' scale chunks)
  for t in test_gpu_moe test_gpu_route test_gpu_scale_chunks; do
    for tool in memcheck racecheck; do
      echo "==== compute-sanitizer $tool $t" >> "$TL"
      t0=$SECONDS
      (cd "$B" && FP4MOE_GPU_TEST_SMALL=1 timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 ./$t) \
        > /tmp/fp4moe-$tool.log 2>&1 && echo "$tool: clean ($t, $((SECONDS-t0)) s)" || { echo "$tool: FAIL ($t)"; fails=$((fails+1)); }
      cat /tmp/fp4moe-$tool.log >> "$TL"
      tail -n 2 /tmp/fp4moe-$tool.log
    done
  done
fi

fi
if want scenario; then
step "scenario: tp8 rank, per-token FC1, 4 layers"
M=/tmp/fp4moe-scenario
rm -rf "$M"
"$B/fp4moe" gen "$M" --preset minimax-m3.1-flash-tp8 --layers 4 --act-scheme per-token --format minimax-m31 --seed 11
"$B/fp4moe" inspect "$M" 2>&1 | tee -a "$SC"
"$B/fp4moe" inspect "$M" --json >> "$SC" 2>/dev/null
for be in auto w4a16-sm90 humming w4a16-mma marlin; do
  for m in 1 7 64 1000; do
    "$B/fp4moe" check "$M" --layer 3 --tokens $m --moe-backend $be --seed $m --routing uniform 2>&1 | tee -a "$SC" | grep -E "layer|FAIL" \
      || fails=$((fails+1))
  done
done
"$B/fp4moe" check "$M" --layer 3 --tokens 64 --all-backends --seed 5 --routing skewed 2>&1 | tee -a "$SC" \
  || fails=$((fails+1))
"$B/fp4moe" check "$M" --all --tokens 16 --seed 6 > /tmp/fp4moe-check-all.txt 2>&1 || fails=$((fails+1))
cat /tmp/fp4moe-check-all.txt >> "$SC"
tail -n 1 /tmp/fp4moe-check-all.txt
rm -rf "$M"
fi
if want bench; then
  step "fp4moe bench (every kernel; * = the oracle's pick)"
  "$B/fp4moe" bench --problems "${FP4MOE_PROBLEMS:-$ROOT/bench/problems.txt}" --all-kernels --json "$OUT/bench.json" --reps 15 2> /dev/null \
    || fails=$((fails+1))
fi
if want peer; then
  if [ -d "$ROOT/.peer/humming" ]; then
    step "peer: Humming (bench/peer/humming_moe_bench.py: indexed layout, graph replay, L2 cold)"
    export PYTHONPATH="$ROOT/.peer/pylibs${PYTHONPATH:+:$PYTHONPATH}" PEER_DIR="$ROOT/.peer"
    HP="$ROOT/bench/peer/humming_moe_bench.py"
    timeout 120 python3 "$HP" --hidden 6144 --inter 384 --topk 8 --layouts indexed --selftest-api > "$OUT/humming.txt" 2>&1
    echo "peer selftest rc=$?"; tail -n 5 "$OUT/humming.txt"
    for spec in "384 8" "384 4" "3072 8"; do
      set -- $spec
      timeout 170 python3 "$HP" --hidden 6144 --inter "$1" --topk "$2" --tokens 1 8 64 512 4096 16384 \
        --layouts indexed --no-parts --time-budget 110 --json "$OUT/humming_i$1_k$2.json" >> "$OUT/humming.txt" 2>&1
      echo "peer I=$1 top-$2 rc=$?"
    done
    tail -n 40 "$OUT/humming.txt"
  fi
fi
echo
echo "device run: $fails failing step(s)"
exit $((fails > 0))
