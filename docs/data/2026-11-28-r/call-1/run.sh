#!/bin/bash
# ncu at the card's clocks (--clock-control none): ours (release d_head 256 tile, and B_c 80) and cuDNN,
# bf16 d_head 256 non-causal at 2k (batch 8) and 16k (batch 1), 8 heads.
set -u
export PATH=/usr/local/cuda/bin:$PATH
L=/tmp/clk; mkdir -p $L
s=$(date +%s)
cmake -S . -B /tmp/b -G Ninja -DFLASH_KERNELS=@bench/explore/2026-12-29-clock-d256.txt -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF > $L/cfg.log 2>&1 && cmake --build /tmp/b > $L/build.log 2>&1
echo "build: exit $? $(( $(date +%s) - s )) s"
bin=/tmp/b/bin/flash_attention
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
mapfile -t cfgs < <(grep '^(' bench/explore/2026-12-29-clock-d256.txt)
for seq in 16384 2048; do
  b=$((16384 / seq))
  for i in 0 1; do
    [ $seq = 2048 ] && [ $i = 1 ] && continue
    n=ours${i}_$seq
    timeout 150 ncu --clock-control none --set full --import-source no -k regex:forward_kernel -s 2 -c 1 -o $L/$n \
      $bin run --config "${cfgs[$i]}" --seq $seq --batch $b --heads 8 --d-head 256 --repeat 3 > $L/$n.log 2>&1
    echo "ncu $n: exit $?"
  done
  n=cudnn_$seq
  timeout 150 ncu --clock-control none --set full --profile-from-start off -c 1 -o $L/$n \
    python3 bench/torch_sdpa.py --profile cudnn --batch $b --heads 8 --seq $seq --d-head 256 --dtype bfloat16 > $L/$n.log 2>&1
  echo "ncu $n: exit $?"
done
for r in $L/*.ncu-rep; do
  n=$(basename $r .ncu-rep)
  ncu --import $r --page raw --csv > $L/${n}_raw.csv 2>/dev/null
  ncu --import $r --page details --csv > $L/${n}_details.csv 2>/dev/null
  ncu --import $r --page source --csv --print-source sass > $L/${n}_sass.csv 2>/dev/null
done
python3 .dev/carry/clk/summary.py $L | tee $OUT/summary.txt
(cd $L && tar czf $OUT/raw.tgz *_raw.csv *_details.csv *.log)
(cd $L && tar cJf $OUT/sass.txz ours*_sass.csv) 2>/dev/null
ls -la $OUT
