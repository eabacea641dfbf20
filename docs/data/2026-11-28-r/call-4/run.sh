#!/bin/bash
# compare.py in two regimes, same package, same call: the grid's (batches of 5 calls, fixed order) and long batches
# (50 calls, shuffled order), bf16 and fp16, d_head 64 and 256 non-causal at 2k / 8k / 16k.
set -u
export PATH=/usr/local/cuda/bin:$PATH
REPO=$(pwd)
s=$(date +%s)
mkdir -p /tmp/fresh_pip && tar cf - --exclude='./build*' --exclude='./.git' --exclude='./.dev' . | (cd /tmp/fresh_pip && tar xf -)
(cd /tmp/fresh_pip && CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 400 python3 -m pip install --no-build-isolation --no-deps --target /tmp/site .) > $OUT/pip.log 2>&1
echo "pip: exit $? $(( $(date +%s) - s )) s"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
cells="--dtypes bfloat16 float16 --d-heads 64 256 --seqs 2048 8192 16384"
cd /tmp
s=$(date +%s); PYTHONPATH=/tmp/site timeout 200 python3 $REPO/bench/compare.py $cells --out $OUT/grid_regime > $OUT/grid_regime.log 2>&1
echo "grid regime: exit $? $(( $(date +%s) - s )) s"
s=$(date +%s); PYTHONPATH=/tmp/site timeout 300 python3 $REPO/bench/compare.py $cells --runs 200 --rounds 4 --order shuffled --out $OUT/long_regime > $OUT/long_regime.log 2>&1
echo "long regime: exit $? $(( $(date +%s) - s )) s"
for f in grid_regime long_regime; do echo "== $f"; grep -E "^\| (bfloat16|float16)" $OUT/$f.md | awk -F'|' '{printf "%s d%s %6s ours %7s cuDNN %7s ratio %s\n", $2, $3, $4, $5, $7, $10}'; done
