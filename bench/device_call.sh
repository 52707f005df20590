#!/usr/bin/env bash
# One device call of a session (run from the repository root on the GPU machine):
#   OUT=... bash bench/device_call.sh STEPS
# STEPS (comma list): tests (bench/run_device.sh build-dev tests,scenario: every C test
# binary, both sanitizers, the scenario; 286-340 s on the H200, the scenario about half:
# give it 400 s or more), suite (the same without the scenario), scenario (the scenario
# alone), gpumoe (test_gpu_moe of build-dev alone), test:NAME (the test binary NAME of
# build-dev alone), sanitize (the small cases of test_gpu_moe and test_gpu_route under
# memcheck and racecheck; tests and suite run it already), ab:LIST[:T] (A/B of build-dev, or
# the build AB_NEW names, against build-base, or the build AB_BASE names, on
# bench/problems_LIST.txt, AB_PASSES default 3; T: the new build runs with
# --dec-slot-tokens T), prof:LIST
# (ncu per problem of bench/problems_LIST.txt, all kernels of w4a16-sm90, L2 and issue
# metrics; PROF_KERNELS replaces the ncu kernel filter, PROF_BENCH_ARGS the bench flags),
# stalls:LIST (ncu sections: warp state, pipes, scheduler, instructions, occupancy; the
# first NCU_COUNT kernels of PROF_KERNELS per problem), sass:LIST (ncu stall samples per SASS
# instruction of the first such kernel per problem), timeline:LIST (per problem: an nsys
# trace of the forward graph's nodes, when nsys is there, and ncu durations of every fp4_
# kernel at the boost clock), humming (the peer at the sweep sizes). Logs under $OUT/r, packed as $OUT/all.tgz.
set -uo pipefail
if [ $# -ne 1 ]; then # "gpumoe sanitize" would run gpumoe alone
  echo "device_call.sh: STEPS is one comma-separated argument (got $# arguments: $*)" >&2
  exit 2
fi
R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH=.peer/pylibs PEER_DIR=.peer
IFS=, read -ra steps <<< "$1"
for st in "${steps[@]}"; do # every step known before the first runs
  case "$st" in
  tests|suite|scenario|gpumoe|sanitize|humming|test:?*|ab:?*|prof:?*|stalls:?*|sass:?*|timeline:?*) ;;
  *) echo "device_call.sh: unknown step '$st' (the steps: this script's header)" >&2; exit 2 ;;
  esac
done
for st in "${steps[@]}"; do
  echo "== $st $(date +%T)"
  case "$st" in
  tests) OUT="$R" bash bench/run_device.sh build-dev tests,scenario > "$R/run.log" 2>&1 ;;
  suite) OUT="$R" bash bench/run_device.sh build-dev tests > "$R/run.log" 2>&1
    grep -E ': (PASS|FAIL)|failing' "$R/run.log" ;;
  scenario) OUT="$R" bash bench/run_device.sh build-dev scenario > "$R/scenario.log" 2>&1
    grep -cE 'PASS' "$R/scenario.log" | sed 's/^/scenario PASS lines: /'; grep -E 'FAIL|failing' "$R/scenario.log" ;;
  gpumoe) (cd build-dev && LD_LIBRARY_PATH=. timeout 300 ./test_gpu_moe) > "$R/gpumoe.log" 2>&1
    echo "test_gpu_moe rc=$? $(tail -n 1 "$R/gpumoe.log")" ;;
  test:*) t="${st#test:}" # one test binary of build-dev
    (cd build-dev && LD_LIBRARY_PATH=. timeout 300 "./$t") > "$R/$t.log" 2>&1
    echo "$t rc=$? $(tail -n 1 "$R/$t.log")"; grep '^FAIL' "$R/$t.log" | head -5 ;;
  sanitize) OUT="$R" bash bench/run_device.sh build-dev sanitize > "$R/sanitize.log" 2>&1
    grep -E '^(memcheck|racecheck):' "$R/sanitize.log" ;;
  ab:*) l="${st#ab:}"; t=""; case "$l" in *:*) t="${l#*:}"; l="${l%%:*}" ;; esac
    mkdir -p "$R/ab_$l$t"
    OUT="$R/ab_$l$t" AB_NEW_ARGS="${t:+--dec-slot-tokens $t}" AB_PASSES="${AB_PASSES:-3}" bash bench/ab_device.sh \
      "${AB_NEW:-build-dev}" "${AB_BASE:-build-base}" "bench/problems_$l.txt" > "$R/ab_$l$t.log" 2>&1 ;;
  prof:*) l="${st#prof:}"; i=0
    grep -v '^#' "bench/problems_$l.txt" | while read -r line; do
      i=$((i+1)); echo "$line" > "/tmp/prof_$i.txt"; mkdir -p "$R/prof_${l}_$i"
      OUT="$R/prof_${l}_$i" NSYS=0 NCU_COUNT="${NCU_COUNT:-24}" \
        NCU_KERNELS="${PROF_KERNELS:-regex:fp4_dec_kernel|fp4_sm90}" BENCH_ARGS="${PROF_BENCH_ARGS:---all-kernels --moe-backend w4a16-sm90}" \
        NCU_METRICS=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.avg.per_cycle_active,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size \
        bash bench/profile_device.sh build-dev "/tmp/prof_$i.txt" > "$R/prof_${l}_$i/log.txt" 2>&1
    done ;;
  stalls:*) l="${st#stalls:}"; i=0 # ncu sections per problem: warp stalls, pipes, issue
    grep -v '^#' "bench/problems_$l.txt" | while read -r line; do
      i=$((i+1)); echo "$line" > "/tmp/st_$i.txt"
      (cd build-dev && LD_LIBRARY_PATH=. timeout 200 ncu -k "${PROF_KERNELS:-regex:fp4_dec_kernel|fp4_sm90}" \
        -c "${NCU_COUNT:-3}" --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section SchedulerStats --section InstructionStats --section Occupancy --csv --page raw \
        ./fp4moe bench --problems "/tmp/st_$i.txt" --reps 3 ${PROF_BENCH_ARGS:---moe-backend w4a16-sm90}) \
        > "$R/stalls_${l}_$i.csv" 2> "$R/stalls_${l}_$i.err"
    done ;;
  sass:*) l="${st#sass:}"; i=0 # ncu per-SASS-instruction stall samples, first kernel per problem
    grep -v '^#' "bench/problems_$l.txt" | while read -r line; do
      i=$((i+1)); echo "$line" > "/tmp/ss_$i.txt"
      (cd build-dev && LD_LIBRARY_PATH=. timeout 200 ncu -k "${PROF_KERNELS:-regex:fp4_dec_kernel|fp4_sm90}" \
        -c 1 --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
        ./fp4moe bench --problems "/tmp/ss_$i.txt" --reps 3 ${PROF_BENCH_ARGS:---moe-backend w4a16-sm90}) \
        > "$R/sass_${l}_$i.csv" 2> "$R/sass_${l}_$i.err"
    done ;;
  timeline:*) l="${st#timeline:}"; i=0 # per problem: nsys graph-node trace, ncu at boost clock
    # (the w4a16-sm90 backend unless PROF_BENCH_ARGS says otherwise: without one the bench
    # times every backend, w4a16-mma first, and ncu's first NCU_COUNT kernels are that one's)
    NS="$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2> /dev/null | head -n 1)"
    echo "nsys: ${NS:-not found}"
    grep -v '^#' "bench/problems_$l.txt" | while read -r line; do
      i=$((i+1)); echo "$line" > "/tmp/tl_$i.txt"
      if [ -n "$NS" ]; then
        (cd build-dev && LD_LIBRARY_PATH=. timeout 200 "$NS" profile --cuda-graph-trace=node -o "/tmp/tl_$i" -f true \
          ./fp4moe bench --problems "/tmp/tl_$i.txt" --reps 15 ${PROF_BENCH_ARGS:---moe-backend w4a16-sm90}) > "$R/tl_${l}_$i.log" 2>&1
        "$NS" stats -q --report cuda_gpu_trace --format csv "/tmp/tl_$i.nsys-rep" > "$R/tl_${l}_$i.csv" 2>> "$R/tl_${l}_$i.log"
      fi
      (cd build-dev && LD_LIBRARY_PATH=. timeout 200 ncu -k "${PROF_KERNELS:-regex:fp4_}" -c "${NCU_COUNT:-12}" \
        --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size \
        ./fp4moe bench --problems "/tmp/tl_$i.txt" --reps 3 ${PROF_BENCH_ARGS:---moe-backend w4a16-sm90}) > "$R/tlncu_${l}_$i.csv" 2> "$R/tlncu_${l}_$i.err"
    done ;;
  humming) for k in 8 4; do
      python3 bench/peer/humming_moe_bench.py --hidden 6144 --inter 384 --topk $k --tokens 1 8 32 64 128 192 224 256 288 320 512 576 768 1024 1536 2048 4096 16384 \
        --layouts indexed --no-parts --time-budget 40 --json "$R/humming_i384_k$k.json" >> "$R/humming.log" 2>&1
    done ;;
  esac
done
echo "== done $(date +%T)"
tar -czf "$OUT/all.tgz" -C "$R" . && rm -rf "$R"
