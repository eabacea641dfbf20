#!/usr/bin/env bash
# Packs a build's command line and GPU tests, xz-compressed (about 28 MB each for the release set,
# against 170 MB; 2026-12-06), into a folder for `scripts/gpu_check.sh prebuilt DIR` on a GPU
# machine: built on a machine without a GPU, they spare the GPU machine's minutes the compile. The
# host tests need no GPU: run them where they were built (the two packs and the tree then fit a
# 64 MiB carry).
#
#   scripts/pack_build.sh BUILD DIR
set -euo pipefail
if [ $# -ne 2 ] || [ ! -x "$1/bin/flash_attention" ] || [ ! -x "$1/tests/test_gpu" ]; then
  echo "pack_build.sh: expected BUILD DIR, BUILD a build with the command line and the GPU tests, got: $*" >&2
  exit 2
fi
mkdir -p "$2"
for binary in "$1/bin/flash_attention" "$1/tests/test_gpu"; do
  xz -T0 -6 -c "$binary" > "$2/$(basename "$binary").xz"
done
du -sh "$2"
