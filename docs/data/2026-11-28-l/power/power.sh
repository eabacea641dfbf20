#!/bin/bash
# Clocks and power while ours (the release build's automatic choice, `bench`) and cuDNN (SDPA in a loop)
# each run alone for a few seconds, twice, bf16 d_head 64 causal at 512 and 16k keys, nvidia-smi sampling
# every 20 ms beside them. Needs the release CLI at /tmp/rel/bin/flash_attention. SEQS, D_HEAD (64) and
# CAUSAL (1; 0 for non-causal) choose the shapes; the defaults are the run recorded here.
here=$(dirname "$0")
bin=/tmp/rel/bin/flash_attention
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.sw_power_cap --format=csv,noheader,nounits -lms 20 > $OUT/smi.csv &
SMI=$!
d=${D_HEAD:-64}
causal=$([ "${CAUSAL:-1}" = 1 ] && echo causal)
for seq in ${SEQS:-512 16384}; do
  b=$((16384 / seq))
  runs=$([ $seq = 512 ] && echo 10000 || echo 1500)
  for r in 1 2; do
    t0=$(date +%s.%N); $bin bench ${causal:+--causal} --d-head $d --seq $seq --batch $b --heads $((2048 / d)) --runs $runs --rounds 2 --warmup-ms 500 > $OUT/ours_${seq}_$r.txt 2>&1; t1=$(date +%s.%N)
    echo "ours $seq window $t0 $t1 $(grep -E 'automatic' $OUT/ours_${seq}_$r.txt | tail -1 | awk '{print $(NF-3), $NF}')"
    python3 $here/cudnn_loop.py $seq $d 3 $causal
  done
done
kill $SMI
