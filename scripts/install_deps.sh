#!/usr/bin/env bash
# Install what fp4moe needs to build and test on a fresh Debian machine: a C compiler, CMake,
# cJSON (Debian package), and the Python test packages (requirements-test.txt). The CUDA
# toolkit (nvcc) is expected to be installed already; without it the build has no GPU code.
# Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(build-essential)
command -v python3 >/dev/null || need+=(python3 python3-pip)
dpkg -s libcjson-dev >/dev/null 2>&1 || need+=(libcjson-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! python3 -c "import numpy, ml_dtypes, safetensors, pytest" >/dev/null 2>&1; then
  echo "install_deps: pip install -r requirements-test.txt"
  python3 -m pip install -q -r requirements-test.txt
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install_deps: nvcc found at /usr/local/cuda/bin (add it to PATH)"
fi
echo "install_deps: ok"
