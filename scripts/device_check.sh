#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, the progression ladder, a tune-set sweep at
# the reference shape, and PyTorch's SDPA backends on the same shape, with a short
# table printed last. Full logs go to $OUT (the device tool brings them back).
#
#   scripts/device_check.sh BIN_DIR [quick]
# BIN_DIR holds flash_attention and test_gpu built for the GPU (e.g. build/bin).
set -uo pipefail
BIN=${1:?usage: device_check.sh BIN_DIR [quick]}
MODE=${2:-full}
OUT=${OUT:-/tmp/flash_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"

echo "== GPU tests"
if [ "$MODE" = quick ]; then export FLASH_TEST_SEQS=512,2048; fi
"$BIN/test_gpu" --gtest_brief=1 > "$OUT/test_gpu.log" 2>&1
echo "test_gpu exit $?"; tail -n 4 "$OUT/test_gpu.log"

echo "== progression (seq 4096, d_head 128, batch 4, heads 16)"
"$BIN/flash_attention" bench --set progression --seq 4096 --batch 4 --heads 16 --format csv \
    > "$OUT/progression.csv" 2> "$OUT/progression.err"

echo "== bench: every built config at bf16/fp16, seq 4096, batch 4, heads 16"
"$BIN/flash_attention" bench --set tune --seq 4096 --batch 4 --heads 16 --format csv \
    > "$OUT/tune_4096.csv" 2> "$OUT/tune_4096.err"

echo "== PyTorch SDPA backends, same shape"
python3 bench/torch_sdpa.py --batch 4 --heads 16 --seq 4096 --d-head 128 64 > "$OUT/torch.txt" 2>&1

echo "== summary"
python3 scripts/summarize.py "$OUT"
