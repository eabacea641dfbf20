#!/usr/bin/env bash
# Installs what the build and the tests need on Debian/Ubuntu (the CUDA toolkit,
# with nvcc on PATH or at /usr/local/cuda/bin, must already be present).
set -euo pipefail
packages=(cmake ninja-build g++ libgtest-dev libcli11-dev nlohmann-json3-dev)
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: add /usr/local/cuda/bin to PATH (nvcc)" >&2
fi
