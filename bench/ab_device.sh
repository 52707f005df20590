#!/usr/bin/env bash
# A/B on the device in one call: bench/ab_device.sh NEW_BUILD BASE_BUILD PROBLEMS [BACKEND]
# runs `fp4moe bench --all-kernels` over PROBLEMS with the fp4moe binary of each build,
# alternating new, base, new (AB_PASSES=2: new, base), so drift within the lease shows;
# logs and JSON under $OUT.
# BASE_BUILD needs only fp4moe and libcjson.so.1. BACKEND (default w4a16-sm90) limits the
# kernels timed. AB_NEW_ARGS: extra `fp4moe bench` flags for the new build only (e.g.
# --dec-slot-tokens 32); AB_NEW_ENV: VAR=VALUE words set for the new build's runs only.
set -uo pipefail
NEW="$(cd "$1" && pwd)" BASE="$(cd "$2" && pwd)" P="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
BE="${4:-w4a16-sm90}"
OUT="${OUT:-/tmp/fp4moe-out}"
mkdir -p "$OUT"
tag=$(basename "$P" .txt)
i=0
order=("$NEW" "$BASE" "$NEW")
for b in "${order[@]:0:${AB_PASSES:-3}}"; do
  i=$((i+1)); name=$([ $i -eq 2 ] && echo base || echo new) # by place: NEW may be BASE
  echo "== $name ($i) $tag"
  (cd "$b" && env $([ "$name" = new ] && echo "${AB_NEW_ENV:-}") LD_LIBRARY_PATH=. \
     FP4MOE_SRC="$(dirname "$(dirname "$P")")" ./fp4moe bench --problems "$P" \
     --moe-backend "$BE" --all-kernels --reps 15 --json "$OUT/ab-$tag-$i-$name.json" \
     $([ "$name" = new ] && echo "${AB_NEW_ARGS:-}")) \
     2>&1 | grep -vE "^\s*\[" | tee "$OUT/ab-$tag-$i-$name.txt" | grep -E "us|problem" | head -60
done
