#!/bin/bash
# Builds and runs round_rate.cu on the device (sm_90a); output to $OUT/round_rate.txt.
set -euo pipefail
here=$(dirname "$0")
nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -I src -I include -Xptxas -v \
  -o "$OUT/round_rate" "$here/round_rate.cu" > "$OUT/round_rate_build.txt" 2>&1
"$OUT/round_rate" | tee "$OUT/round_rate.txt"
rm -f "$OUT/round_rate"
