#!/bin/bash
# The SM clock and power under sustained load (nvidia-smi sampled every 50 ms): the synthetic round
# (round_rate.cu, the release step for 4M rounds) and the release CLI's d_head 64 and 256 tiles at
# 16k keys (CLI from .dev/carry/ab/loads.xz). Output in $OUT; the summary last.
set -uo pipefail
here=$(dirname "$0")
nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -I src -I include -o /tmp/rr \
  "$here/round_rate.cu" > "$OUT/build.txt" 2>&1 || exit 1
xz -dc .dev/carry/ab/loads.xz > /tmp/cli && chmod +x /tmp/cli
sampled() {  # name, command...
  local name=$1
  shift
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 > "$OUT/smi_$name.txt" &
  local p=$!
  "$@" > "$OUT/$name.txt" 2>&1
  kill $p
}
sampled synthetic /tmp/rr 4000000
sampled d64 /tmp/cli bench --config "(BF16, 64, 192, 128, 16): sm90+stages_3+overlap+pingpong+persistent+lazy" \
  --seq 16384 --batch 1 --heads 32 --d-head 64 --runs 1000 --rounds 1 --warmup-ms 500
sampled d256 /tmp/cli bench --config "(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+persistent+lazy+trim" \
  --seq 16384 --batch 1 --heads 8 --d-head 256 --runs 1000 --rounds 1 --warmup-ms 500
for name in synthetic d64 d256; do
  python3 - "$OUT/smi_$name.txt" "$name" <<'PY'
import statistics, sys
rows = [l.split(",") for l in open(sys.argv[1]) if l.strip()]
busy = [(float(c), float(p)) for c, p in rows if float(p) > 250]
if busy:
    print(f"{sys.argv[2]}: {len(busy)} samples above 250 W: median clock {statistics.median(c for c, _ in busy):.0f} MHz, "
          f"median power {statistics.median(p for _, p in busy):.0f} W")
PY
  grep -E "cycles a round|clock:|^\(BF16" "$OUT/$name.txt" | head -4
done
