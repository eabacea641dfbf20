set -u
xz -dc .dev/carry/ab/mc.xz > /tmp/mc && chmod +x /tmp/mc
P="(BF16, 256, 128, 64, 12): sm90+stages_2+overlap+pingpong+persistent+lazy+trim"
S="--seq 16384 --batch 1 --heads 8 --d-head 256"
for c in "$P" "$P+multicast"; do
  ncu --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,lts__t_sectors_srcunit_tex.sum,lts__t_sectors.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed -k regex:forward_kernel /tmp/mc run $S --config "$c" 2>&1 | grep -E "forward_kernel|gpu__|sm__|lts__" | sed 's/  */ /g'
done
for rep in 1 2; do
for c in "$P" "$P+multicast"; do
  nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits -lms 50 > /tmp/smi.txt &
  pid=$!
  /tmp/mc bench $S --config "$c" --runs 400 --rounds 1 --warmup-ms 1000 --format json > /tmp/b.json
  kill $pid; wait $pid 2>/dev/null
  python3 - "$c" <<'PY'
import json, statistics, sys
d = json.load(open('/tmp/b.json'))['measurements'][0]
rows = [l.split(',') for l in open('/tmp/smi.txt') if l.strip()]
pw = [float(r[0]) for r in rows[-40:]]; ck = [float(r[1]) for r in rows[-40:]]
print(sys.argv[1][-20:], 'median_ms %.3f' % d['median_ms'], 'tflops %.1f' % d['tflops'], 'power W %.0f' % statistics.median(pw), 'sm MHz %.0f' % statistics.median(ck), 'samples', len(rows))
PY
done
done
