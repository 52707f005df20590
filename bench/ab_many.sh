#!/usr/bin/env bash
# Several builds against each other in one device call:
#   OUT=... bench/ab_many.sh PROBLEMS PASSES BUILD...
# runs `fp4moe bench` (the backend's own choice of kernel, w4a16-sm90 unless AB_BACKEND says
# otherwise) over PROBLEMS with the fp4moe of each BUILD, PASSES times, the builds in order on
# odd passes and in reverse order on even ones, so that drift within the lease falls on every
# build alike; JSON and logs as ab__TAG__BUILD__PASS.{json,txt}, packed into $OUT/ab__TAG.tgz
# at the end (the device tool returns only a few files of $OUT). A build needs only fp4moe
# and libcjson.so.1. Thirty-second session: five builds x two passes over 13-15 problems
# took 80-180 s on the H200.
set -uo pipefail
if [ $# -lt 3 ]; then echo "usage: OUT=DIR bench/ab_many.sh PROBLEMS PASSES BUILD..." >&2; exit 2; fi
[ -f "$1" ] || { echo "ab_many.sh: no problem file $1" >&2; exit 2; }
P="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; N="$2"; shift 2
OUT="${OUT:-/tmp/fp4moe-out}"; mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)" # the runs cd into builds
tag=$(basename "$P" .txt)
case "$N" in '' | *[!0-9]* | 0) echo "ab_many.sh: PASSES must be a positive integer, got '$N'" >&2; exit 2 ;; esac
for b in "$@"; do [ -x "$b/fp4moe" ] || { echo "ab_many.sh: no $b/fp4moe" >&2; exit 2; }; done
for ((i = 1; i <= N; i++)); do
  if ((i % 2)); then order=("$@"); else order=(); for ((j = $#; j >= 1; j--)); do order+=("${!j}"); done; fi
  for b in "${order[@]}"; do
    name=$(basename "$b")
    echo "== $name pass $i $tag $(date +%T)"
    (cd "$b" && LD_LIBRARY_PATH=. FP4MOE_SRC="$(dirname "$(dirname "$P")")" ./fp4moe bench \
       --problems "$P" --moe-backend "${AB_BACKEND:-w4a16-sm90}" --reps 15 \
       --json "$OUT/ab__${tag}__${name}__$i.json") 2>&1 | grep -vE "^\s*\[" > "$OUT/ab__${tag}__${name}__$i.txt"
  done
done
(cd "$OUT" && tar -czf "ab__$tag.tgz" ab__"$tag"__* && rm -f ab__"$tag"__*.json ab__"$tag"__*.txt)
