#!/usr/bin/env bash
# The README's first command: install, build, and run the main job on a small built-in
# example: generate a tiny NVFP4 MoE checkpoint whose FC1 declares per-token activations,
# show what it holds and what would run on an H200, and check every backend against the
# reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
dir="${TMPDIR:-/tmp}/fp4moe-example-$$"
trap 'rm -rf "$dir"' EXIT
./build/fp4moe gen "$dir" --preset tiny --act-scheme per-token --format minimax-m31
./build/fp4moe inspect "$dir"
./build/fp4moe inspect "$dir" --device-arch sm90
./build/fp4moe check "$dir" --all --all-backends --tokens 32 --seed 1
