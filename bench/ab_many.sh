#!/usr/bin/env bash
# Several builds against each other in one device call:
#   OUT=... bench/ab_many.sh PROBLEMS PASSES BUILD...
# runs `fp4moe bench` (the backend's own choice of kernel, w4a16-sm90 unless AB_BACKEND says
# otherwise) over PROBLEMS with the fp4moe of each BUILD, PASSES times, the builds in order on
# odd passes and in reverse order on even ones, so that drift within the lease falls on every
# build alike; JSON and logs as ab__TAG__BUILD__PASS.{json,txt}, packed into
# $OUT/ab__TAG[__AB_BACKEND].tgz at the end (the device tool returns only a few files of $OUT).
# The summary per problem: bench/summarize.py ab DIR BASE [BUILD...] over the unpacked archive.
# AB_ARGS: more flags for every build's bench (e.g. "--flush clean --prev-layer"), with
# AB_TAG naming them in the files (ab__LIST_TAG__...), so that two modes of one list in the
# same OUT keep apart. A build needs only fp4moe and libcjson.so.1. For one build against a
# base with every kernel of the backend timed (--all-kernels) or extra flags for the new build
# only, use ab_device.sh. Thirty-second session: five builds x two passes over 13-15 problems
# took 80-180 s on the H200.
set -uo pipefail
if [ $# -lt 3 ]; then echo "usage: OUT=DIR bench/ab_many.sh PROBLEMS PASSES BUILD..." >&2; exit 2; fi
[ -f "$1" ] || { echo "ab_many.sh: no problem file $1" >&2; exit 2; }
P="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; N="$2"; shift 2
OUT="${OUT:-/tmp/fp4moe-out}"; mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)" # the runs cd into builds
tag=$(basename "$P" .txt)${AB_TAG:+_$AB_TAG}
case "$N" in [1-9] | [1-9][0-9]) ;; *) echo "ab_many.sh: PASSES must be 1..99, got '$N'" >&2; exit 2 ;; esac
names=" "
for b in "$@"; do
  [ -x "$b/fp4moe" ] || { echo "ab_many.sh: no $b/fp4moe" >&2; exit 2; }
  case "$names" in *" $(basename "$b") "*) # files are named by the build's folder name
    echo "ab_many.sh: two builds named $(basename "$b"): give each its own folder name" >&2; exit 2 ;; esac
  names="$names$(basename "$b") "
done
failed=0
for ((i = 1; i <= N; i++)); do
  if ((i % 2)); then order=("$@"); else order=(); for ((j = $#; j >= 1; j--)); do order+=("${!j}"); done; fi
  for b in "${order[@]}"; do
    name=$(basename "$b")
    echo "== $name pass $i $tag $(date +%T)"
    (cd "$b" && LD_LIBRARY_PATH=. FP4MOE_SRC="$(dirname "$(dirname "$P")")" ./fp4moe bench \
       --problems "$P" --moe-backend "${AB_BACKEND:-w4a16-sm90}" --reps 15 ${AB_ARGS:-} \
       --json "$OUT/ab__${tag}__${name}__$i.json") 2>&1 | grep -vE "^\s*\[" > "$OUT/ab__${tag}__${name}__$i.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "ab_many.sh: $name pass $i exited $rc (ab__${tag}__${name}__$i.txt)" >&2; failed=1; }
  done
done
# the archive is named by the problem list (and AB_BACKEND when set): a later run of the same
# list with another backend in the same OUT does not overwrite it
arc="ab__$tag${AB_BACKEND:+__$AB_BACKEND}.tgz"
(cd "$OUT" && tar -czf "$arc" ab__"$tag"__*.txt $(ls ab__"$tag"__*.json 2>/dev/null) &&
   rm -f ab__"$tag"__*.json ab__"$tag"__*.txt)
exit $failed
