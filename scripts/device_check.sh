#!/usr/bin/env bash
# Runs on the GPU machine, in stages, with the full output of each under $OUT and a
# short summary printed last. BIN holds flash_attention and test_gpu built for the GPU
# (here: -DFLASH_KERNELS=tune,progression -DCMAKE_CUDA_ARCHITECTURES=90-real).
#
#   scripts/device_check.sh BIN STAGE...
#
# Stages:
#   tests        every GPU test (all built configs x seq 512..4096, tune -> automatic choice)
#   progression  the 7-step ladder, seq 512..16384
#   bench        every built tune config, seq 512..16384 (CSV + SVG)
#   tune         flash_attention tune over the same grid into $OUT/tuning.json, then the
#                automatic choice against the best config at seq 4096 (d_head 64, 128)
#   repeat       the automatic choice and the sm80 table's configs over seq 512..16384, three
#                times each, every run's time and the clock (repeatability)
#   torch        PyTorch SDPA backends at seq 4096 (batch 4 / heads 16 and 32 at d 128 / 64)
#   python       pip install . (the tune set, sm_90) and the pytest suite
#   compare      bench/compare.py (needs the python stage and a tuning cache)
#   overhead     host time per call: C++ API, direct binding, custom op
#   chart        the automatic choice over seq 512..16384 at bf16/fp16, d_head 64/128 (SVG)
#   sanitize     compute-sanitizer memcheck on odd shapes (one sm80 config per dtype/d_head)
#   sm80-tests   every GPU test except the sm90 kernels' (seq 512 and the odd shapes)
#   generality   issue 5's bars: causal vs not at 8192, 4095/1000 vs 4096/1024, GQA 32/4 vs 32
#   generality-sm80  the same for the sm80 family (tune-sm80 into its own cache first)
#   hopper-tests     the GPU tests of the sm90 family only (quick)
#   hopper-sanitize  compute-sanitizer memcheck and racecheck on sm90 kernels, odd shapes
#   hopper-ladder    the sm90 ladder (progression --family sm90), seq 512..16384
#   hopper-d256      d_head 256 at B_c 80: tests, sanitizers, tune against B_c 64, compare
#                    with cuDNN (needs PYTHONPATH with this build's module)
#   hopper-compare   bench/compare.py at bf16 (d_head 64/128/256, and causal d_head 128):
#                    ours against cuDNN/FA2 in one process (needs the python stage)
set -uo pipefail
BIN=${1:?usage: device_check.sh BIN STAGE...}
shift
OUT=${OUT:-/tmp/flash_out}
# The tuning cache lives outside $OUT (which the device tool empties before each call)
# so a later call on the same machine can use it; a copy is packed with the results.
TUNING=${TUNING:-/tmp/flash_tuning.json}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
FA="$BIN/flash_attention"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader >> "$OUT/gpu.txt"

# Issue 5's timing bars for the automatic choice (with tuning cache $2, or none):
# causal vs not at 8192, 1000/4095 vs 1024/4096 (16k tokens), GQA 32/4 vs MHA 32 heads.
generality_bars() {
  local label=$1 cache=$2
  for c in "" --causal; do
    FLASH_ATTENTION_TUNING="$cache" "$FA" bench --best --seq 8192 --d-head 128 --dtype bf16 --runs 50 $c
  done > "$OUT/causal_$label.txt" 2>&1
  FLASH_ATTENTION_TUNING="$cache" "$FA" bench --best --seq 1000,1024,4095,4096 --d-head 128 --dtype bf16 \
    --runs 50 > "$OUT/odd_lengths_$label.txt" 2>&1
  # GQA against MHA alternately, three times each: their difference is expected to be
  # small, so one pair of runs would compare noise.
  for i in 1 2 3; do
    for kv in 32 4; do
      FLASH_ATTENTION_TUNING="$cache" "$FA" bench --best --seq 4096 --batch 4 --heads 32 --heads-kv $kv \
        --d-head 128 --dtype bf16 --runs 50
    done
  done > "$OUT/gqa_$label.txt" 2>&1
  echo "generality ($label):"
  grep -h "automatic choice" "$OUT/causal_$label.txt" "$OUT/odd_lengths_$label.txt" "$OUT/gqa_$label.txt" |
    grep -v harmonic
}

# The built configs as the odd-shape tests name them, a line each:
# "sm90_config12|(BF16, 256, 128, 80, 12): sm90+stages_2+overlap+persistent" (the tests are
# named by config index; gtest's list prints the config).
odd_shape_configs() {
  "$BIN/test_gpu" --gtest_list_tests --gtest_filter='Built/EveryConfigOddShapes.*' |
    sed -n 's/^ *MatchesReference\/\(sm[0-9]*_config[0-9]*\)_.*GetParam() = \(.*\), seq_q .*/\1|\2/p' | sort -u
}
# A gtest filter for the odd-shape tests of the config names on stdin.
odd_shape_filter() {
  awk '{ printf "%sBuilt/EveryConfigOddShapes.*/%s_*", sep, $1; sep=":" }'
}

for stage in "$@"; do
  start=$(date +%s)
  case "$stage" in
    tests)
      "$BIN/test_gpu" --gtest_brief=1 > "$OUT/test_gpu.log" 2>&1
      echo "tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu.log" | tr '\n' ' ')" ;;
    progression)
      "$FA" progression --seq 512,1024,2048,4096,8192,16384 > "$OUT/progression.txt" 2>&1
      echo "progression: exit $?"; cat "$OUT/progression.txt" ;;
    bench)
      "$FA" bench --set tune --format csv --svg "$OUT/bench_tune.svg" > "$OUT/bench_tune.csv" 2> "$OUT/bench_tune.err"
      echo "bench: exit $? $(wc -l < "$OUT/bench_tune.csv") lines" ;;
    tune)
      export FLASH_ATTENTION_TUNING="$TUNING"
      rm -f "$TUNING"
      "$FA" tune --format csv > "$OUT/tune.txt" 2>&1
      cp "$TUNING" "$OUT/tuning.json"
      echo "tune: exit $?"; grep -A40 '^key' "$OUT/tune.txt" | head -30
      for d in 128 64; do
        "$FA" bench --best --set tune --seq 4096 --d-head $d --dtype bf16 --runs 60 --rounds 10 --format csv \
            > "$OUT/auto_vs_best_d$d.csv" 2>&1
      done
      unset FLASH_ATTENTION_TUNING ;;
    repeat)
      # Three repeats of two benches (the built-in choice, sm90 on Hopper; the sm80 table's
      # configs) with every run's time, and the clock, power and throttle reasons every
      # 100 ms: bimodal timings are either placement (by input slot) or clock (by time).
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv -lms 100 > "$OUT/smi_repeat.csv" 2>&1 &
      smi=$!
      sm80=()
      for c in "(BF16, 128, 128, 64, 4)" "(BF16, 64, 128, 64, 4)"; do
        sm80+=(--config "$c: async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax")
      done
      for i in 1 2 3; do
        "$FA" bench --best --d-head 128,64 --dtype bf16 --runs 100 --format json \
          > "$OUT/repeat_auto_$i.json" 2> "$OUT/repeat_auto_$i.err"
        "$FA" bench "${sm80[@]}" --runs 100 --format json \
          > "$OUT/repeat_sm80_$i.json" 2> "$OUT/repeat_sm80_$i.err"
      done
      kill $smi
      python3 scripts/repeatability.py "$OUT"/repeat_*.json | tee "$OUT/repeatability.txt" | tail -40 ;;
    torch)
      python3 bench/torch_sdpa.py --batch 4 --heads 16 --seq 4096 --d-head 128 > "$OUT/torch.txt" 2>&1
      python3 bench/torch_sdpa.py --batch 4 --heads 32 --seq 4096 --d-head 64 >> "$OUT/torch.txt" 2>&1
      cat "$OUT/torch.txt" ;;
    python)
      FLASH_KERNELS=tune FLASH_CUDA_ARCHITECTURES=90-real CMAKE_BUILD_PARALLEL_LEVEL=16 \
        python3 -m pip install --no-build-isolation --no-deps . > "$OUT/pip.log" 2>&1
      echo "pip: exit $?"
      (cd /tmp && FLASH_ATTENTION_TUNING="$TUNING" python3 -m pytest -q "$OLDPWD/python/tests") > "$OUT/pytest.log" 2>&1
      echo "pytest: exit $?"; tail -3 "$OUT/pytest.log" ;;
    compare)
      (cd /tmp && FLASH_ATTENTION_TUNING="$TUNING" python3 "$OLDPWD/bench/compare.py" --out "$OUT/compare") \
        > "$OUT/compare.log" 2>&1
      echo "compare: exit $?"; tail -12 "$OUT/compare.log" ;;
    chart)
      FLASH_ATTENTION_TUNING="$TUNING" "$FA" bench --best --d-head 128,64 --dtype bf16,fp16 --runs 50 \
        --svg "$OUT/bench_auto.svg" > "$OUT/bench_auto.txt" 2>&1
      echo "chart: exit $?"; tail -6 "$OUT/bench_auto.txt" ;;
    sanitize)
      # memcheck on the odd shapes of the first sm80 config of every built (dtype, d_head).
      filter=$(odd_shape_configs |
        awk -F'|' '$1 ~ /^sm80_/ { split($2, f, ", "); if (!seen[f[1] f[2]]++) print $1 }' | odd_shape_filter)
      if [ -z "$filter" ]; then
        echo "memcheck: no sm80 configs in this build"
      else
        compute-sanitizer --tool memcheck --error-exitcode 1 "$BIN/test_gpu" --gtest_filter="$filter" \
          > "$OUT/memcheck.log" 2>&1
        echo "memcheck: exit $? on $filter"; grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY' "$OUT/memcheck.log"
      fi ;;
    sm80-tests)
      # Every test but the sm90 kernels' own, at one regular length (the odd shapes run in full).
      FLASH_TEST_SEQS=512 "$BIN/test_gpu" --gtest_brief=1 --gtest_filter='-*sm90*' > "$OUT/test_gpu_sm80.log" 2>&1
      echo "sm80 tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu_sm80.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED' "$OUT/test_gpu_sm80.log" | head -5 ;;
    generality)
      # Issue 5's bars for the automatic choice: the built-in table (sm90 on Hopper).
      generality_bars builtin "" ;;
    generality-sm80)
      # The same bars for the sm80 family: tune its configs on these shapes into their own
      # cache, then the automatic choice reads that cache.
      cache=/tmp/sm80_tuning.json
      rm -f "$cache"
      for c in "" --causal; do
        FLASH_ATTENTION_TUNING="$cache" "$FA" tune --set tune-sm80 --d-head 128 --dtype bf16 \
          --seq 1000,1024,4095,4096,8192 --runs 20 --format csv $c
      done > "$OUT/tune_sm80.txt" 2>&1
      cp "$cache" "$OUT/tuning_sm80.json"
      generality_bars sm80 "$cache" ;;
    hopper-tests)
      "$BIN/test_gpu" --gtest_brief=1 --gtest_filter='*sm90*' > "$OUT/test_gpu_sm90.log" 2>&1
      echo "hopper tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu_sm90.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED' "$OUT/test_gpu_sm90.log" | head -5 ;;
    hopper-sanitize)
      odd='Built/EveryConfigOddShapes.*/sm90_*q129_k257*:Built/EveryConfigOddShapes.*/sm90_*q1000_k7_*'
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 1 "$BIN/test_gpu" --gtest_filter="$odd" \
          > "$OUT/sm90_$tool.log" 2>&1
        echo "sm90 $tool: exit $?"; tail -3 "$OUT/sm90_$tool.log"
      done ;;
    hopper-ladder)
      "$FA" progression --family sm90 --seq 512,1024,2048,4096,8192,16384 > "$OUT/progression_sm90.txt" 2>&1
      echo "hopper ladder: exit $?"; cat "$OUT/progression_sm90.txt" ;;
    hopper-compare)
      (cd /tmp && FLASH_ATTENTION_TUNING="$TUNING" python3 "$OLDPWD/bench/compare.py" --dtypes bfloat16 \
        --d-heads 64 128 256 --out "$OUT/compare_sm90") > "$OUT/compare_sm90.log" 2>&1
      echo "compare (sm90): exit $?"; grep -E '^\| bfloat16' "$OUT/compare_sm90.md"
      (cd /tmp && FLASH_ATTENTION_TUNING="$TUNING" python3 "$OLDPWD/bench/compare.py" --dtypes bfloat16 \
        --d-heads 128 --seqs 8192 --causal --out "$OUT/compare_sm90_causal") > "$OUT/compare_sm90_causal.log" 2>&1
      echo "compare (sm90, causal): exit $?"; grep -E '^\| bfloat16' "$OUT/compare_sm90_causal.md" ;;
    hopper-d256)
      # d_head 256 with B_c 80: its tests and sanitizers, then tune the d_head 256 configs
      # (B_c 64 against 80) and compare the tuned choice with cuDNN in one process.
      # Needs the Python module of this build (-DFLASH_BUILD_PYTHON=ON): PYTHONPATH below.
      pattern='\((BF16|FP16), 256, 128, 80,'
      odd=$(odd_shape_configs | grep -E "\|$pattern" | cut -d'|' -f1 | odd_shape_filter)
      "$BIN/test_gpu" --gtest_brief=1 --gtest_filter="Built/EveryConfig.*256_128_80*:$odd" \
        > "$OUT/test_d256.log" 2>&1
      echo "d256 B_c 80 tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_d256.log" | tr '\n' ' ')"
      # The sanitizers on two small odd shapes of one config (racecheck is slow).
      one=$(odd_shape_configs |
        awk -F'|' '$2 == "(BF16, 256, 128, 80, 12): sm90+stages_2+overlap+persistent" { print $1 }' |
        odd_shape_filter)
      small="${one//_\*/_q129_k257*}:${one//_\*/_q1000_k7_*}"
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 1 "$BIN/test_gpu" --gtest_filter="$small" \
          > "$OUT/d256_$tool.log" 2>&1
        echo "d256 $tool: exit $? $(grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/d256_$tool.log" | tr '\n' ' ')"
      done
      FLASH_ATTENTION_TUNING="$TUNING" "$FA" tune --set tune-sm90 --d-head 256 --dtype bf16 --runs 30 \
        --format csv > "$OUT/tune_d256.txt" 2>&1
      echo "tune d256: exit $?"; grep -A8 '^key' "$OUT/tune_d256.txt"
      (cd /tmp && FLASH_ATTENTION_TUNING="$TUNING" python3 "$OLDPWD/bench/compare.py" --dtypes bfloat16 \
        --d-heads 256 --out "$OUT/compare_d256") > "$OUT/compare_d256.log" 2>&1
      echo "compare d256: exit $?"; grep -E '^\| bfloat16|^\| dtype' "$OUT/compare_d256.md" ;;
    overhead)
      (cd /tmp && FLASH_ATTENTION_TUNING="$TUNING" python3 "$OLDPWD/bench/compare.py" --overhead-only) ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "[$stage: $(( $(date +%s) - start )) s]"
done
python3 scripts/summarize.py "$OUT" | tee /tmp/flash_summary.txt
# The device tool brings back at most 8 files: pack the rest.
tar czf /tmp/flash_results.tar.gz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && \
  mv /tmp/flash_results.tar.gz "$OUT/results.tar.gz" && cp /tmp/flash_summary.txt "$OUT/summary.txt"
