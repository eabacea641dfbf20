#!/bin/bash
# Clocks and power while ours and cuDNN run alone, d_head 128 bf16 non-causal, 512 and 16k.
bin=/tmp/explore/bin/flash_attention
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.sw_power_cap --format=csv,noheader,nounits -lms 20 > $OUT/smi.csv &
SMI=$!
cfg="(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg"
for seq in ${SEQS:-512 16384}; do
  runs=$([ $seq = 512 ] && echo 10000 || echo 700)
  for r in 1 2; do
    t0=$(date +%s.%N); $bin bench --config "$cfg" --seq $seq --runs $runs --warmup-ms 500 > $OUT/ours_${seq}_$r.txt 2>&1; t1=$(date +%s.%N)
    echo "ours $seq window $t0 $t1 $(grep -E '^\(' $OUT/ours_${seq}_$r.txt | awk '{print $(NF-2), $NF}')"
    python3 .dev/cudnn_loop.py $seq 128 2.5
  done
done
kill $SMI
python3 - <<'PY'
import csv, datetime, os, re
out = os.environ["OUT"]
rows = []
for r in csv.reader(open(f"{out}/smi.csv")):
    try:
        t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((t, float(r[1]), float(r[2]), r[4].strip()))
    except Exception:
        pass
print("samples", len(rows))
open(f"{out}/rows.txt", "w").write("\n".join(map(str, rows)))
PY
