#!/usr/bin/env bash
# Installs what the build and the tests need on Debian/Ubuntu and is missing (the CUDA
# toolkit, with nvcc on PATH or at /usr/local/cuda/bin, must already be present). Tools
# and headers already available by other means (pip's cmake, a source install of
# GoogleTest) count as present, so machines without apt access that have them pass.
set -euo pipefail
has_header() { echo "#include <$1>" | g++ -std=c++20 -x c++ -fsyntax-only - >/dev/null 2>&1; }
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
if command -v g++ >/dev/null; then
  has_header gtest/gtest.h || [ -f /usr/src/googletest/CMakeLists.txt ] || missing+=(libgtest-dev)
  has_header CLI/CLI.hpp || missing+=(libcli11-dev)
  has_header nlohmann/json.hpp || missing+=(nlohmann-json3-dev)
else
  missing+=(libgtest-dev libcli11-dev nlohmann-json3-dev)
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: add /usr/local/cuda/bin to PATH (nvcc)" >&2
fi
