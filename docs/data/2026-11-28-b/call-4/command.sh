set -u
xz -dc .dev/carry/ab/sk2.xz > /tmp/fa && chmod +x /tmp/fa
P='(BF16, 128, 192, 80, 16): sm90+stages_3+overlap+pingpong+persistent+lazy'
for name in plain streamk; do
  cfg="$P"; [ $name = streamk ] && cfg="$P+streamk"
  timeout 200 ncu --section WarpStateStats --section SpeedOfLight --section InstructionStats --section LaunchStats \
    -k regex:forward_kernel -c 1 /tmp/fa bench --config "$cfg" --seq 6336 --batch 1 --heads 16 --d-head 128 \
    --runs 1 --rounds 1 --warmup-ms 0 > $OUT/ncu_$name.txt 2>&1
  echo "== $name exit $?"
  grep -E 'Duration|SM Frequency|Executed Instructions  |Issue Slots Busy|Warp Cycles Per Issued|Stall|No Instruction|Registers Per' $OUT/ncu_$name.txt | head -40
done
