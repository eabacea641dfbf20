#!/bin/bash
# Clock and power while ours (the release's d_head 256 tile, `bench --config`) and cuDNN (SDPA in a loop) each run
# alone for a few seconds, twice each, bf16 d_head 256 non-causal 16k (batch 1) and 2k (batch 8), 8 heads;
# nvidia-smi samples every 20 ms beside them.
set -u
export PATH=/usr/local/cuda/bin:$PATH
here=.dev/carry/pw
s=$(date +%s)
cmake -S . -B /tmp/b -G Ninja -DFLASH_KERNELS=@bench/explore/2026-12-29-clock-d256.txt -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF > $OUT/cfg.log 2>&1 && cmake --build /tmp/b > $OUT/build.log 2>&1
echo "build: exit $? $(( $(date +%s) - s )) s"
bin=/tmp/b/bin/flash_attention
cfg=$(grep -m1 '^(' bench/explore/2026-12-29-clock-d256.txt)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.sw_power_cap --format=csv,noheader,nounits -lms 20 > $OUT/smi.csv &
SMI=$!
: > $OUT/windows.txt
for seq in 16384 2048; do
  b=$((16384 / seq)); runs=$([ $seq = 2048 ] && echo 10000 || echo 1500)
  for r in 1 2; do
    t0=$(date +%s.%N); $bin bench --config "$cfg" --d-head 256 --seq $seq --batch $b --heads 8 --runs $runs --rounds 2 --warmup-ms 500 > $OUT/ours_${seq}_$r.txt 2>&1; t1=$(date +%s.%N)
    echo "ours $seq $t0 $t1 $(grep -E 'BF16' $OUT/ours_${seq}_$r.txt | tail -1 | awk '{print $(NF-3), $NF}')" | tee -a $OUT/windows.txt
    python3 docs/data/2026-11-28-l/power/cudnn_loop.py $seq 256 4 | tee -a $OUT/cudnn_${seq}.txt | awk -v s=$seq '{print "cudnn", s, $(NF-1), $NF, $(NF-7) "us", $(NF-4) "TFLOP/s"}' | tee -a $OUT/windows.txt
  done
done
kill $SMI
python3 $here/summary.py $OUT/smi.csv $OUT/windows.txt | tee $OUT/summary.txt
