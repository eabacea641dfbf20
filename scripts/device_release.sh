#!/usr/bin/env bash
# Issue 11's checks on the GPU machine, as a new user meets the project: a fresh clone
# built with the README's commands and default options, the default Python package, and
# the default build's automatic choice against a `tune` build's. Full logs under $OUT,
# a short table last.
#
#   scripts/device_release.sh STAGE...
#
# Stages:
#   readme    a fresh copy of the tree, the README's first command verbatim (run --check), a 50-run
#             repeat of it, `choose` for the six (dtype, d_head) pairs, the GPU and host
#             tests, compute-sanitizer memcheck on two odd shapes of every built config, racecheck on
#             the sm90 ones
#   package   pip install . (default options), the import in fresh interpreters in both
#             orders with torch, the extension's exported symbols, the pytest suite
#   refactor  issue 12: the ci build's GPU tests and sanitizers (memcheck, racecheck on
#             sm90 odd shapes; memcheck on the dynamic schedule's tests); starts building the
#             Python packages of .dev/before (a tree from before the change, carried) and of
#             this tree in the background
#   profile   issue 13: ncu of the release kernel and of cuDNN's, bf16 d_head 128 and 64, 16384
#   schedule  issue 13: static against dynamic tile schedule, causal, interleaved (after refactor)
#   causal    bench/compare.py --causal with this tree's package (after refactor)
#   compare   bench/compare.py over the whole grid (bf16/fp16, d_head 64/128/256, causal and
#             not) with the two packages, alternated (after refactor)
#   explore   candidate configs (bench/explore/$EXPLORE) built beside the release set and
#             timed interleaved per d_head, causal and not
#   ab        the configs of the files bench/explore/$AB_CONFIGS built from .dev/before and
#             from this tree, `bench` alternated for three rounds (a change's effect on
#             given kernels; a "#! ARGS" line in a file adds bench arguments)
#   abbin     command-line binaries built elsewhere from different trees, carried xz-packed as
#             .dev/carry/ab/NAME.xz, each `bench`ed on the cases of bench/explore/$ABBIN_CASES (one
#             line of bench arguments each; several files comma-separated), alternated for
#             $ABBIN_ROUNDS rounds (3), each first checked with `run --check` on the lines that start with
#             "check:"; a case runs on the binaries that hold its --config; medians per case
#   tune      `tune` over the configs of the files bench/explore/$TUNE_CONFIGS (each with its
#             own "#! ARGS"), each shape's fastest against the release's automatic choice
#   gqa       the automatic choice at causal seq 16384 and 32768, 32 query / 8 K/V heads,
#             each (dtype, d_head) pair timed alone
#   serving   issue 14: the ci build's GPU tests (the serving ones among them), memcheck and
#             racecheck of the serving tests, the Python package's pytest, bench/serving.py
#   paged_probe issue 14: page sizes 16-256 and split counts against the contiguous cache, ncu
#             of the chunked prefill contiguous and paged 16
#   versus    a `tune` build (90-real), then `bench --best` of the default build and of the
#             tune build, alternated twice, bf16/fp16 x d_head 64/128/256 x seq 512..16384
#   tunevariants `tune` of the carried release CLI's bf16 d_head 128 configs at 16k: plain,
#             softcap 50, causal softcap 50
#   models    the Hugging Face model tests with the default package
#   grid      bench/compare.py over the whole grid with the default package (GRID_ARGS: --causal)
#   pyvariants the default package (pip install .), both import orders, its variant, model and
#             forward tests, bench/serving.py
#   variants  issue 15: the GPU tests of sliding window, softcap and sinks (and top-left causal)
#             on a release build (test_gpu and the command line carried prebuilt in .dev/carry
#             when they run here, else built), memcheck and racecheck of some, the bars (window (4096, 0)
#             against causal at 32k; softcap and sinks against none at 16k, interleaved); the
#             Python side is pyvariants
set -uo pipefail
# The device tool brings back at most 8 files: the summary, and the logs packed after every
# stage (so a call stopped at its time limit still returns what the finished stages wrote).
RESULTS=${OUT:-/tmp/flash_out}
OUT=/tmp/flash_logs
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
REPO=$(pwd)
FRESH=/tmp/fresh
mkdir -p "$RESULTS"
summary="$RESULTS/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
# The serving tests compute-sanitizer runs: varlen, contiguous and paged caches (decoding,
# chunked prefill on every page size and d_head, top-left causal), bad page ids, strided
# caches and the captured decode step.
SERVING_MEMCHECK_FILTER='Serving/Varlen.*/1?:Serving/Varlen.*/3:Serving/Varlen.*/24:Serving/Varlen.*/25:Serving/Varlen.*/26:Serving/Varlen.*/27:Serving/KVCache.*/?:Serving/KVCache.*/17:Serving/KVCache.*/18:Serving/KVCache.*/19:Serving/KVCache.*/2?:Serving/KVCache.*/3?:KVCachePages.*:KVCacheGraph.*'
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader > "$OUT/gpu.txt"
{ date -u; g++ --version | head -1; nvcc --version | tail -1; cmake --version | head -1; } >> "$OUT/gpu.txt"

# The tree as committed: the checkout that travels to this machine, without build folders
# (its .git may be older than the working tree, so no `git clone` of it).
fresh_clone() {
  [ -d "$FRESH" ] && return
  mkdir -p "$FRESH" && (cd "$REPO" && tar cf - --exclude='./build*' --exclude='./.git' --exclude='./.dev' .) |
    (cd "$FRESH" && tar xf -)
}

# The default Python package (pip install . of the fresh tree) in /tmp/site_after, once a call
# (pyvariants, models, grid).
default_package() {
  [ -d /tmp/site_after ] && return
  # The package stage's install is the same default package.
  [ -d /tmp/site ] && ln -s /tmp/site /tmp/site_after && return
  mkdir -p /tmp/fresh_pip && (cd "$FRESH" && tar cf - .) | (cd /tmp/fresh_pip && tar xf -)
  (cd /tmp/fresh_pip && CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 400 python3 -m pip install --no-build-isolation \
    --no-deps --target /tmp/site_after .) > "$OUT/pip_after.log" 2>&1
  note "pip: exit $? ($(( $(date +%s) - start )) s)"
}

# Config groups (ab, tune): the files of bench/explore/ named in $2 (spaces between) into
# `files`; false, with a note naming the variable $1, if none or one is missing.
group_files() {
  files=()
  for f in $2; do files+=("$REPO/bench/explore/$f"); done
  [ ${#files[@]} -gt 0 ] && ls "${files[@]}" > /dev/null 2>&1 && return 0
  note "$1 must name files in bench/explore/ (got '$2')"
  return 1
}
# One group file's configs as --config arguments (`args`) and its "#! ARGS" line (`extra`).
group_args() {
  args=()
  while IFS= read -r cfg; do args+=(--config "$cfg"); done < <(grep '^(' "$1")
  extra=()
  read -r -a extra < <(sed -n 's/^#! //p' "$1" | head -1)
}

# The command line of .dev/before and of this tree, each built with the kernels of the config
# file $2 (no tests), side by side into /tmp/$1_before and /tmp/$1_after.
build_before_after() {
  for tree in before after; do
    src=$([ $tree = before ] && echo "$REPO/.dev/before" || echo "$FRESH")
    (cmake -S "$src" -B "/tmp/$1_$tree" -G Ninja -DFLASH_KERNELS="@$2" \
      -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF > /dev/null &&
      cmake --build "/tmp/$1_$tree" > "$OUT/build_$1_$tree.log" 2>&1) &
  done
  wait
  note "$1 builds: $(ls "/tmp/$1_before/bin/flash_attention" "/tmp/$1_after/bin/flash_attention" 2>&1 | paste -sd' ')"
}

# The fresh copy's command line built with one sm90 config into /tmp/$1, no tests: the
# serving kernels are always in a build, and the automatic choice takes this config.
build_one_config() {
  fresh_clone
  echo "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic" > "$OUT/$1_configs.txt"
  (cmake -S "$FRESH" -B "/tmp/$1" -G Ninja -DFLASH_KERNELS="@$OUT/$1_configs.txt" \
    -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF > /dev/null &&
    cmake --build "/tmp/$1" > "$OUT/build_$1.log" 2>&1)
  note "build: exit $?"
}

for stage in "$@"; do
  start=$(date +%s)
  case "$stage" in
    readme)
      fresh_clone
      # A new user has no build folder: an earlier stage of a call on a warm machine may have
      # left one (refactor's ci set), which `cmake -B build` would otherwise reuse.
      rm -rf "$FRESH/build"
      # The README's first command, verbatim, from the clone's root.
      (cd "$FRESH" && scripts/install_deps_debian.sh && cmake -S . -B build -G Ninja && cmake --build build &&
        build/bin/flash_attention run --check) > "$OUT/readme.log" 2>&1
      note "readme command: exit $? ($(( $(date +%s) - start )) s with the build)"
      grep -E "^(config|rate|check) " "$OUT/readme.log" | tee -a "$summary"
      B="$FRESH/build"
      "$B/bin/flash_attention" run --check --repeat 50 > "$OUT/run_repeat.log" 2>&1
      note "run --check --repeat 50: exit $?; $(grep -E '^rate' "$OUT/run_repeat.log")"
      for dtype in bf16 fp16; do
        for d in 64 128 256; do
          printf '%s d%s: %s\n' $dtype $d "$("$B/bin/flash_attention" choose --dtype $dtype --d-head $d --seq 4096 | head -1)"
        done
      done | tee "$OUT/choose.txt" | tee -a "$summary"
      # Not brief: after a timeout the last RUN line names the test that did not end.
      timeout 330 "$B/tests/test_gpu" > "$OUT/test_gpu.log" 2>&1
      note "test_gpu: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu.log" | tr '\n' ' ')"
      note "  last started: $(grep -E '^\[ RUN' "$OUT/test_gpu.log" | tail -1)"
      grep -E '^\[  FAILED' "$OUT/test_gpu.log" | head -5 | tee -a "$summary"
      timeout 60 "$B/tests/test_host" --gtest_brief=1 > "$OUT/test_host.log" 2>&1
      note "test_host: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_host.log" | tr '\n' ' ')"
      # API errors are not memory errors: one test makes cudaMalloc fail on purpose.
      timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$B/tests/test_gpu" \
        --gtest_filter='Built/EveryConfigOddShapes.*q129_k257*:Built/EveryConfigOddShapes.*q1000_k7_*:Forward.*' \
        > "$OUT/memcheck.log" 2>&1
      note "memcheck (odd shapes of every built config, Forward.*): exit $? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/memcheck.log" | tr '\n' ' ')"
      # The sm90 kernels' barriers (O apart's region among them) on the default build.
      timeout 80 compute-sanitizer --tool racecheck --error-exitcode 1 "$B/tests/test_gpu" \
        --gtest_filter='Built/EveryConfigOddShapes.*sm90*q129_k257*:Built/EveryConfigOddShapes.*sm90*q1000_k7_*' \
        > "$OUT/racecheck.log" 2>&1
      note "racecheck (sm90 odd shapes): exit $? $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$OUT/racecheck.log" | tr '\n' ' ')" ;;
    package)
      fresh_clone
      (cd "$FRESH" && CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps \
        --target /tmp/site .) > "$OUT/pip.log" 2>&1
      note "pip install . (defaults): exit $? ($(( $(date +%s) - start )) s)"
      export PYTHONPATH=/tmp/site
      so=$(ls /tmp/site/flash_attention_scratch/_C*.so)
      note "exported symbols: $(nm -D --defined-only "$so" | awk '{print $3}' | tr '\n' ' ')"
      for code in "import flash_attention_scratch" "import flash_attention_scratch, torch" \
                  "import torch, flash_attention_scratch" "import flash_attention_scratch as f, torch; print(f.__version__, torch.zeros(3).sum().item())"; do
        (cd /tmp && python3 -c "$code") >> "$OUT/imports.log" 2>&1
        note "python3 -c \"$code\": exit $?"
      done
      (cd /tmp && LD_DEBUG=bindings python3 -c "import flash_attention_scratch, torch" 2>&1 |
        grep -c "to $so") > "$OUT/bindings_to_module.txt"
      note "symbols of other libraries bound to the module: $(cat "$OUT/bindings_to_module.txt")"
      (cd /tmp && FLASH_EXPECT_RELEASE_SET=1 timeout 180 python3 -m pytest -q -rs "$FRESH/python/tests") > "$OUT/pytest.log" 2>&1
      note "pytest: exit $? $(tail -1 "$OUT/pytest.log")"
      grep -E "^FAILED|Error" "$OUT/pytest.log" | head -8 | tee -a "$summary"
      unset PYTHONPATH ;;
    versus)
      fresh_clone
      [ -x "$FRESH/build/bin/flash_attention" ] ||
        (cd "$FRESH" && cmake -S . -B build -G Ninja > /dev/null && cmake --build build > "$OUT/build_default.log" 2>&1)
      (cd "$FRESH" && cmake -S . -B /tmp/tune -G Ninja -DFLASH_KERNELS=tune -DCMAKE_CUDA_ARCHITECTURES=90-real \
        -DFLASH_BUILD_TESTS=OFF > /dev/null && cmake --build /tmp/tune) > "$OUT/build_tune.log" 2>&1
      note "tune build: exit $? ($(( $(date +%s) - start )) s)"
      for i in 1 2; do
        for build in default tune; do
          bin=$([ $build = default ] && echo "$FRESH/build/bin" || echo /tmp/tune/bin)
          timeout 60 "$bin/flash_attention" bench --best --dtype bf16,fp16 --d-head 64,128,256 --runs 30 --format json \
            > "$OUT/bench_${build}_$i.json" 2> "$OUT/bench_${build}_$i.err"
          echo "bench $build $i: exit $?" >> "$OUT/bench.log"
        done
      done
      python3 "$REPO/scripts/compare_builds.py" "$OUT"/bench_default_*.json -- "$OUT"/bench_tune_*.json |
        tee "$OUT/versus.txt" | tee -a "$summary" ;;
    refactor)
      fresh_clone
      # The Python packages of the tree before the change (carried in .dev/before) and of
      # this one build in the background while the ci set (release + knob coverage, the
      # dynamic-schedule kernels among them) builds for the tests.
      mkdir -p /tmp/fresh_pip && (cd "$FRESH" && tar cf - .) | (cd /tmp/fresh_pip && tar xf -)
      for tree in before after; do
        src=$([ $tree = before ] && echo "$REPO/.dev/before" || echo /tmp/fresh_pip)
        ( (cd "$src" && CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps \
          --target /tmp/site_$tree .) > "$OUT/pip_$tree.log" 2>&1; echo $? > "$OUT/pip_$tree.rc" ) &
      done
      B="$FRESH/build"
      (cd "$FRESH" && cmake -S . -B build -G Ninja -DFLASH_KERNELS=ci > /dev/null && cmake --build build) \
        > "$OUT/build_ci.log" 2>&1
      note "ci build: exit $? ($(( $(date +%s) - start )) s)"
      # Bounded: a schedule that deadlocks must not take the whole call with it.
      # Not brief: after a timeout the last RUN line names the test that did not end.
      timeout 330 "$B/tests/test_gpu" > "$OUT/test_gpu.log" 2>&1
      note "test_gpu: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu.log" | tr '\n' ' ')"
      note "  last started: $(grep -E '^\[ RUN' "$OUT/test_gpu.log" | tail -1)"
      grep -E '^\[  FAILED' "$OUT/test_gpu.log" | head -8 | tee -a "$summary"
      "$B/tests/test_host" --gtest_brief=1 > "$OUT/test_host.log" 2>&1
      note "test_host: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_host.log" | tr '\n' ' ')"
      timeout 70 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$B/tests/test_gpu" \
        --gtest_filter='Built/EveryConfigOddShapes.*sm90*q129_k257*:Built/EveryConfigOddShapes.*sm90*q1000_k7_*:Forward.DynamicSchedule*' \
        > "$OUT/sm90_memcheck.log" 2>&1
      note "sm90 memcheck (odd shapes, dynamic schedule): exit $? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/sm90_memcheck.log" | tr '\n' ' ')"
      timeout 80 compute-sanitizer --tool racecheck --error-exitcode 1 "$B/tests/test_gpu" \
        --gtest_filter='Built/EveryConfigOddShapes.*sm90*q129_k257*:Built/EveryConfigOddShapes.*sm90*q1000_k7_*' \
        > "$OUT/sm90_racecheck.log" 2>&1
      note "sm90 racecheck (odd shapes): exit $? $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$OUT/sm90_racecheck.log" | tr '\n' ' ')" ;;
    compare)
      # After refactor, whose background jobs build the two packages.
      wait
      note "pip before: exit $(cat "$OUT/pip_before.rc"); after: exit $(cat "$OUT/pip_after.rc")"
      for causal in "" --causal; do
        for tree in after before; do
          name=compare_${tree}${causal:+_causal}
          (cd /tmp && PYTHONPATH=/tmp/site_$tree python3 "$FRESH/bench/compare.py" $causal --out "$OUT/$name") \
            > "$OUT/$name.log" 2>&1
          note "compare $tree $causal: exit $?"
        done
      done
      python3 "$REPO/scripts/compare_tables.py" "$OUT"/compare_before.md "$OUT"/compare_after.md \
        "$OUT"/compare_before_causal.md "$OUT"/compare_after_causal.md | tee "$OUT/refactor.txt" | tee -a "$summary"
      (cd /tmp && PYTHONPATH=/tmp/site_after FLASH_EXPECT_RELEASE_SET=1 python3 -m pytest -q "$FRESH/python/tests") \
        > "$OUT/pytest.log" 2>&1
      note "pytest: exit $? $(tail -1 "$OUT/pytest.log")" ;;
    causal)
      # After refactor: the product's causal grid (this tree's package) against cuDNN.
      wait
      note "pip after: exit $(cat "$OUT/pip_after.rc")"
      (cd /tmp && PYTHONPATH=/tmp/site_after python3 "$FRESH/bench/compare.py" --causal --out "$OUT/compare_after_causal") \
        > "$OUT/compare_after_causal.log" 2>&1
      note "compare after --causal: exit $?"
      grep -E "^\|" "$OUT/compare_after_causal.md" | head -60 >> "$summary" ;;
    profile)
      # Issue 13: where the time goes, bf16, 16k tokens, hidden 2048: ncu (full set) of this
      # project's automatic choice and of cuDNN's kernel (PyTorch SDPA, one call inside the
      # profiler's range), side by side, for each PROFILE shape d_head:seq[:causal]
      # (default: seq 16384 without causal masking at d_head 128 and 64), and of each config
      # in PROFILE_CONFIGS (a file in bench/explore/). Uses the readme, refactor or explore
      # build; with PROFILE_CONFIGS, or without such a build, builds the release set and
      # those configs on its own.
      fresh_clone
      bin="$FRESH/build/bin/flash_attention"
      [ -x "$bin" ] || bin=/tmp/explore/bin/flash_attention
      if [ -n "${PROFILE_CONFIGS:-}" ] || [ ! -x "$bin" ]; then
        (cmake -S "$FRESH" -B /tmp/profile_build -G Ninja \
          -DFLASH_KERNELS="release${PROFILE_CONFIGS:+,@$REPO/bench/explore/$PROFILE_CONFIGS}" \
          -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF > /dev/null &&
          cmake --build /tmp/profile_build) > "$OUT/build_profile.log" 2>&1
        note "profile build: exit $? ($(( $(date +%s) - start )) s)"
        bin=/tmp/profile_build/bin/flash_attention
      fi
      for shape in ${PROFILE:-128:16384 64:16384}; do
        IFS=: read -r d seq causal <<< "$shape"
        flag=${causal:+--causal}
        name="d${d}_s${seq}${causal:+_causal}"
        batch=$((16384 / seq)); heads=$((2048 / d))
        config=$("$bin" choose --dtype bf16 --d-head $d --seq $seq $flag | head -1)
        configs=("$config")
        [ -n "${PROFILE_CONFIGS:-}" ] && mapfile -t -O 1 configs < <(grep '^(' "$REPO/bench/explore/$PROFILE_CONFIGS")
        columns=()
        for i in "${!configs[@]}"; do
          who=$([ "$i" = 0 ] && echo ours || echo "c$i")
          timeout 120 ncu --set full -k regex:forward_kernel -s 1 -c 1 -o "$OUT/ncu_${who}_$name" \
            "$bin" run --config "${configs[$i]}" --seq $seq --batch $batch --heads $heads $flag --repeat 2 \
            > "$OUT/ncu_${who}_$name.log" 2>&1
          note "ncu $who $name (${configs[$i]}): exit $?"
          columns+=("$who=$OUT/ncu_${who}_${name}_details.csv")
        done
        timeout 120 ncu --set full --profile-from-start off -c 1 -o "$OUT/ncu_cudnn_$name" \
          python3 "$FRESH/bench/torch_sdpa.py" --profile cudnn --batch $batch --heads $heads \
          --seq $seq --d-head $d --dtype bfloat16 $flag > "$OUT/ncu_cudnn_$name.log" 2>&1
        note "ncu cudnn $name: exit $?"
        columns+=("cudnn=$OUT/ncu_cudnn_${name}_details.csv")
        for col in "${columns[@]}"; do
          who=${col%%=*}
          ncu --import "$OUT/ncu_${who}_$name.ncu-rep" --page details --csv > "$OUT/ncu_${who}_${name}_details.csv" 2>/dev/null
          ncu --import "$OUT/ncu_${who}_$name.ncu-rep" --page raw --csv > "$OUT/ncu_${who}_${name}_raw.csv" 2>/dev/null
        done
        python3 "$REPO/scripts/ncu_table.py" "${columns[@]}" | tee -a "$summary"
      done ;;
    schedule)
      # Issue 13: the release's sm90 tiles with the static and the dynamic tile schedule,
      # causal, interleaved in one process (bench --rounds), from the ci build above.
      bin="$FRESH/build/bin/flash_attention"
      for pair in "BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg" \
                  "FP16, 64, 192, 64, 16): sm90+stages_3+overlap+pingpong+persistent+qreg" \
                  "BF16, 256, 128, 80, 12): sm90+stages_2+overlap+persistent"; do
        timeout 60 "$bin" bench --config "($pair" --config "($pair+dynamic" --causal --seq 1024,2048,4096,8192,16384 \
          --runs 20 --rounds 3 --warmup-ms 200 --format csv >> "$OUT/schedule.csv" 2>> "$OUT/schedule.err"
        echo "bench $pair: exit $?" >> "$OUT/schedule.log"
      done
      timeout 60 "$bin" bench --config "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg" \
        --config "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic" --causal \
        --seq 32768 --batch 1 --heads 32 --heads-kv 8 --runs 10 --rounds 3 --warmup-ms 200 --format csv \
        >> "$OUT/schedule.csv" 2>> "$OUT/schedule.err"
      echo "bench 32k GQA: exit $?" >> "$OUT/schedule.log"
      cat "$OUT/schedule.log" >> "$summary"
      python3 "$REPO/scripts/schedule_table.py" "$OUT/schedule.csv" | tee "$OUT/schedule.txt" | tee -a "$summary" ;;
    explore)
      # Issue 13: candidate configs of bench/explore/$EXPLORE built with the release set, then
      # timed interleaved group by group: a "## NAME" line starts a group ("causal" in the
      # name: with causal masking); a file without groups is timed per d_head, without
      # causal masking for the static-schedule configs and with it for the dynamic ones.
      fresh_clone
      list="$REPO/bench/explore/${EXPLORE:-2026-11-24-key-blocks.txt}"
      (cd "$FRESH" && cmake -S . -B /tmp/explore -G Ninja -DFLASH_KERNELS="release,@$list" \
        -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS="-Xptxas -v" > /dev/null &&
        cmake --build /tmp/explore) > "$OUT/build_explore.log" 2>&1
      note "explore build: exit $? ($(( $(date +%s) - start )) s); kernels that spill: $(grep -cE '[1-9][0-9]* bytes spill stores' "$OUT/build_explore.log")"
      bin=/tmp/explore/bin/flash_attention
      groups=/tmp/explore_groups
      rm -rf "$groups" && mkdir -p "$groups"
      if grep -q '^## ' "$list"; then
        awk -v dir="$groups" '/^## /{name=$2; for (i = 3; i <= NF; ++i) name = name "_" $i; next}
          /^\(/ && name != "" {print > (dir "/" name)}' "$list"
      else
        for d in $(grep -oE '^\((BF16|FP16), [0-9]+' "$list" | awk '{print $2}' | sort -un); do
          grep -E "^\((BF16|FP16), $d," "$list" | grep -v -- '+dynamic' > "$groups/d$d"
          grep -E "^\((BF16|FP16), $d," "$list" | grep -- '+dynamic' > "$groups/d${d}_causal"
        done
      fi
      # Each candidate checked against the reference first, on odd lengths, causal both ways.
      grep '^(' "$list" | while IFS= read -r cfg; do
        # The last shape has more queries than keys: causal rows that see no key at all.
        for shape in "--seq 1000 --seq-k 1111" "--seq 1000 --seq-k 1111 --causal" "--seq 1111 --seq-k 1000 --causal"; do
          timeout 60 "$bin" run --config "$cfg" --check --batch 2 --heads 3 $shape \
            > /tmp/explore_check.txt 2>&1 || { note "explore check FAILED: $cfg $shape"; cat /tmp/explore_check.txt >> "$OUT/explore_checks.txt"; }
        done
      done
      note "explore checks: $(grep -c '^(' "$list") configs run --check (failures listed above)"
      for group in $(ls "$groups"); do
        args=()
        while IFS= read -r cfg; do args+=(--config "$cfg"); done < "$groups/$group"
        [ ${#args[@]} -eq 0 ] && continue
        causal=$(echo "$group" | grep -q causal && echo "$group" | grep -vq non-causal && echo --causal)
        timeout 150 "$bin" bench "${args[@]}" $causal --runs 10 --rounds 3 --warmup-ms 200 > "$OUT/explore_$group.txt" 2>&1
        note "explore $group $causal: exit $?"
        cat "$OUT/explore_$group.txt" >> "$summary"
      done ;;
    ab)
      # Issue 13: the same configs built from .dev/before (carried) and from this tree side
      # by side, then `bench` of each alternated for three rounds: a change's effect on given
      # kernels without the whole grid. AB_CONFIGS names files in bench/explore/ (spaces
      # between), each a group of config lines timed together; a line "#! ARGS" in a file
      # adds bench arguments to its group (e.g. --causal, --seq 1024,4096), otherwise bf16
      # non-causal 512..16384 as the configs say.
      fresh_clone
      if ! group_files AB_CONFIGS "${AB_CONFIGS:-}"; then
        :  # group_files noted why
      elif [ ! -d "$REPO/.dev/before" ]; then
        note "ab: .dev/before is missing (carry .dev)"
      else
        cat "${files[@]}" | grep '^(' | sort -u > "$OUT/ab_configs.txt"
        build_before_after ab "$OUT/ab_configs.txt"
        for round in 1 2 3; do
          for f in "${files[@]}"; do
            group=$(basename "$f" .txt)
            group_args "$f"
            seqs=(--seq 512,1024,2048,4096,8192,16384)
            [[ " ${extra[*]} " == *" --seq "* ]] && seqs=()
            # Alternating which tree runs first: a drift within a round (clocks, heat) then
            # favours neither.
            order="before after"
            [ $round = 2 ] && order="after before"
            for tree in $order; do
              log="$OUT/ab_${group}_${tree}_$round.txt"
              timeout 100 "/tmp/ab_$tree/bin/flash_attention" bench "${args[@]}" "${seqs[@]}" \
                --runs 10 --rounds 3 --warmup-ms 200 "${extra[@]}" \
                > "$log" 2>&1
              note "ab $group round $round $tree (exit $?), TFLOP/s per config and length: $(grep -E '^\(' "$log" | awk '{print $NF}' | paste -sd' ')"
            done
          done
        done
      fi ;;
    tune)
      # Issue 13 (part 5): `tune` over given configs, against the release's automatic choice.
      # TUNE_CONFIGS names files in bench/explore/ (spaces between), each a group of config
      # lines tuned together with the tune arguments of its "#! ARGS" line (--d-head,
      # --seq, --causal); all of them are built together (90-real). Prints, per shape, the
      # fastest config's TFLOP/s against the release choice's (scripts/tune_summary.py).
      fresh_clone
      if group_files TUNE_CONFIGS "${TUNE_CONFIGS:-}"; then
        cat "${files[@]}" | grep '^(' | sort -u > "$OUT/tune_configs.txt"
        (cmake -S "$FRESH" -B /tmp/tune_build -G Ninja -DFLASH_KERNELS="@$OUT/tune_configs.txt" \
          -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF > /dev/null &&
          cmake --build /tmp/tune_build) > "$OUT/build_tune.log" 2>&1
        note "tune build: exit $? ($(wc -l < "$OUT/tune_configs.txt") configs, $(( $(date +%s) - start )) s)"
        bin=/tmp/tune_build/bin/flash_attention
        : > "$OUT/tune_release.csv"
        csvs=()
        for f in "${files[@]}"; do
          group=$(basename "$f" .txt)
          group_args "$f"
          timeout 240 "$bin" tune "${args[@]}" "${extra[@]}" --warmup-ms 30 --runs 10 --rounds 2 \
            --format csv --cache /tmp/tune_cache.json > "$OUT/tune_$group.csv" 2>&1
          note "tune $group: exit $? ($(( $(date +%s) - start )) s)"
          csvs+=("$OUT/tune_$group.csv")
        done
        # The release's choice for every measured shape (the built-in table: no cache).
        python3 - "${csvs[@]}" <<'PY' | sort -u > "$OUT/tune_shapes.txt"
import csv, io, sys
for path in sys.argv[1:]:
    text = "".join(l for l in open(path) if l.startswith(("config,", '"(')))
    for r in csv.DictReader(io.StringIO(text)):
        print(r["dtype"], r["d_head"], r["seq_q"], r["causal"])
PY
        while read -r dtype d seq causal; do
          choice=$(FLASH_ATTENTION_TUNING=/tmp/no_tuning_cache.json "$bin" choose --device h100 \
            --dtype "${dtype,,}" --d-head "$d" --seq "$seq" $([ "$causal" = 1 ] && echo --causal) | head -1)
          echo "$dtype,$d,$seq,$causal,$choice" >> "$OUT/tune_release.csv"
        done < "$OUT/tune_shapes.txt"
        python3 "$REPO/scripts/tune_summary.py" --release "$OUT/tune_release.csv" "${csvs[@]}" |
          tee "$OUT/tune_summary.txt" | tee -a "$summary"
      fi ;;
    cibuild)
      # The ci kernel set (the release's kernels among them) into the fresh copy's build/, for
      # the stages that only need its command line (gqa, decode_stalls).
      fresh_clone
      (cd "$FRESH" && cmake -S . -B build -G Ninja -DFLASH_KERNELS=ci -DFLASH_BUILD_TESTS=OFF > /dev/null &&
        cmake --build build) > "$OUT/build_ci.log" 2>&1
      note "ci build: exit $?" ;;
    decode_stalls)
      # Issue 14: why the split-KV decode kernel reads K/V at 86% of DRAM bandwidth and cuDNN's
      # at 90%: ncu's warp stall reasons and memory sections of both, decode b16 x 8192.
      FA="$FRESH/build/bin/flash_attention"
      SECTIONS=(--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats)
      timeout 120 ncu "${SECTIONS[@]}" --kernel-name regex:split_kv --launch-count 1 \
        "$FA" run --kvcache --seq 1 --seq-k 8192 --batch 16 --heads 32 --heads-kv 8 > "$OUT/stalls_ours.txt" 2>&1
      note "ncu ours: exit $?"
      timeout 150 ncu "${SECTIONS[@]}" --kernel-name regex:cudnn --launch-skip 3 --launch-count 1 \
        python3 "$FRESH/scripts/cudnn_decode.py" 16 8192 > "$OUT/stalls_cudnn.txt" 2>&1
      note "ncu cuDNN: exit $?"
      for f in ours cudnn; do
        note "-- $f"
        grep -E "Duration|DRAM Throughput|Stall|stalled|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per|L2 Hit|Mem Busy|Max Bandwidth|Mem Pipes" \
          "$OUT/stalls_$f.txt" | cut -c1-240 | tee -a "$summary"
      done ;;
    abbin)
      # Prebuilt binaries (a device build of two trees costs minutes of device time; these are
      # built on the CPU machine from the trees the PERF.md entry names).
      # Several case files, comma-separated, run as one.
      mkdir -p /tmp/abbin
      cases=/tmp/abbin/cases.txt
      : > "$cases"
      for f in ${ABBIN_CASES//,/ }; do cat "$REPO/bench/explore/$f" >> "$cases" || { : > "$cases"; break; }; done
      if [ ! -s "$cases" ] || ! ls "$REPO"/.dev/carry/ab/*.xz > /dev/null 2>&1; then
        note "abbin: needs bench/explore/\$ABBIN_CASES (got '${ABBIN_CASES:-}') and .dev/carry/ab/*.xz"
      else
        names=()
        for x in "$REPO"/.dev/carry/ab/*.xz; do
          n=$(basename "$x" .xz); names+=("$n")
          xz -dc "$x" > "/tmp/abbin/$n" && chmod +x "/tmp/abbin/$n"
        done
        # A case runs on the binaries that hold its --config (several experiments, each
        # with its own binaries, share one call).
        has_config() {  # binary, then the case's arguments
          local b=$1 prev=
          shift
          for arg in "$@"; do
            [ "$prev" = --config ] && { grep -qF -- "$arg" "/tmp/abbin/$b.list"; return; }
            prev=$arg
          done
        }
        for n in "${names[@]}"; do
          "/tmp/abbin/$n" list > "/tmp/abbin/$n.list" 2>&1
          i=0
          while IFS= read -r line; do
            i=$((i + 1))
            eval "a=(${line#check:})"
            has_config "$n" "${a[@]}" || continue
            timeout 60 "/tmp/abbin/$n" run --check "${a[@]}" > "$OUT/abbin_check_${n}_$i.txt" 2>&1
            note "abbin check $n $i: exit $? $(grep -E '^check' "$OUT/abbin_check_${n}_$i.txt" | sed 's/(naive same-dtype) //')"
          done < <(grep '^check:' "$cases")
        done
        for round in $(seq "${ABBIN_ROUNDS:-3}"); do
          order=("${names[@]}")
          [ $((round % 2)) = 0 ] && order=($(printf '%s\n' "${names[@]}" | tac))
          c=0
          while IFS= read -r line; do
            c=$((c + 1))
            eval "a=($line)"
            for n in "${order[@]}"; do
              has_config "$n" "${a[@]}" || continue
              timeout 100 "/tmp/abbin/$n" bench "${a[@]}" --runs 10 --rounds 2 --warmup-ms 300 --format json \
                > "$OUT/abbin_${n}_case${c}_$round.json" 2>> "$OUT/abbin.err"
            done
          done < <(grep -v '^check:' "$cases" | grep -v '^#' | grep .)
        done
        python3 - "$OUT" "$cases" "${names[@]}" <<'PY' | tee -a "$summary"
import glob, json, os, statistics, sys
out, cases, names = sys.argv[1], sys.argv[2], sys.argv[3:]
lines = [l.strip() for l in open(cases) if l.strip() and not l.startswith(("check:", "#"))]
for c, line in enumerate(lines, 1):
    row = []
    for n in names:
        t = []
        for f in glob.glob(os.path.join(out, f"abbin_{n}_case{c}_*.json")):
            try:
                t += [m["median_ms"] for m in json.load(open(f))["measurements"]]
            except (ValueError, KeyError):
                pass
        row.append(f"{n} {statistics.median(t):.3f}" if t else f"{n} -")
    print(f"abbin case {c} [{line}] ms: " + ", ".join(row))
PY
      fi ;;
    gqa)
      # Issue 13's no-cliff row: causal, seq 32768, batch 1, 32 query heads on 8 K/V heads,
      # the automatic choice (after readme, refactor or explore: their build).
      bin="$FRESH/build/bin/flash_attention"
      [ -x "$bin" ] || bin=/tmp/explore/bin/flash_attention
      if [ ! -x "$bin" ]; then  # else the release CLI carried in .dev/carry
        mkdir -p /tmp/carry && tar xJf "$REPO/.dev/carry/bin.tar.xz" -C /tmp/carry 2> /dev/null
        bin=/tmp/carry/flash_attention
      fi
      # 16k and 32k of the same head layout, interleaved: the cliff rule compares 2S with S.
      # One (dtype, d_head) pair a run: interleaving all six pairs put the 16k launches of
      # d_head 256 at cooler moments under the power cap than its 32k ones (docs/PERF.md,
      # 2026-11-25: 0.93-0.95 there, 1.02 timed alone).
      : > "$OUT/gqa32k.txt"
      for dtype in bf16 fp16; do
        for d in 64 128 256; do
          timeout 60 "$bin" bench --best --causal --seq 16384,32768 --batch 1 --heads 32 --heads-kv 8 \
            --dtype $dtype --d-head $d --runs 20 --rounds 5 --warmup-ms 200 >> "$OUT/gqa32k.txt" 2>&1
          note "gqa 32k $dtype d$d: exit $?"
        done
      done
      cat "$OUT/gqa32k.txt" >> "$summary" ;;
    serving)
      fresh_clone
      mkdir -p /tmp/fresh_pip && (cd "$FRESH" && tar cf - .) | (cd /tmp/fresh_pip && tar xf -)
      ( (cd /tmp/fresh_pip && CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps \
        --target /tmp/site_after .) > "$OUT/pip_after.log" 2>&1; echo $? > "$OUT/pip_after.rc" ) &
      B="$FRESH/build"
      (cd "$FRESH" && cmake -S . -B build -G Ninja -DFLASH_KERNELS=ci > /dev/null && cmake --build build) \
        > "$OUT/build_ci.log" 2>&1
      note "ci build: exit $? ($(( $(date +%s) - start )) s)"
      grep -E "error|warning" "$OUT/build_ci.log" | head -5 | tee -a "$summary"
      timeout 240 "$B/tests/test_gpu" --gtest_filter="${SERVING_FILTER:-*}" > "$OUT/test_gpu.log" 2>&1
      note "test_gpu (${SERVING_FILTER:-*}): exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu.log" | tr '\n' ' ')"
      note "  last started: $(grep -E '^\[ RUN' "$OUT/test_gpu.log" | tail -1)"
      grep -E '^\[  FAILED|Failure|expected|sequence' "$OUT/test_gpu.log" | head -12 | tee -a "$summary"
      # gtest filters know only * and ?, and a '-' starts the negative patterns: until
      # 2026-11-26 this filter's "2[4-7]" made everything after it negative, and only the
      # Varlen cases before it ran here.
      timeout 240 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$B/tests/test_gpu" \
        --gtest_filter="$SERVING_MEMCHECK_FILTER" \
        > "$OUT/serving_memcheck.log" 2>&1
      note "serving memcheck: exit $? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/serving_memcheck.log" | tr '\n' ' ')"
      timeout 90 compute-sanitizer --tool racecheck --error-exitcode 1 "$B/tests/test_gpu" \
        --gtest_filter='Serving/Varlen.*/3:Serving/Varlen.*/10:Serving/Varlen.*/13:Serving/Varlen.*/16:Serving/Varlen.*/21:Serving/KVCache.*/2:Serving/KVCache.*/13:Serving/KVCache.*/18:Serving/KVCache.*/20' \
        > "$OUT/serving_racecheck.log" 2>&1
      note "serving racecheck: exit $? $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$OUT/serving_racecheck.log" | tr '\n' ' ')"
      # The command line's serving shapes (issue 14, part 7): run --check on each entry point,
      # bench of decoding (the automatic choice and split counts) and of varlen.
      FA="$B/bin/flash_attention"
      DEC=(--seq 1 --seq-k 8192 --batch 16 --heads 32 --heads-kv 8)
      for args in "--kvcache ${DEC[*]}" "--page-size 16 ${DEC[*]}" "--page-size 64 --seq 512 --seq-k 8192 --batch 2 --heads 32 --heads-kv 8 --causal" \
                  "--varlen --seq 8192 --batch 8 --heads 16 --causal"; do
        # shellcheck disable=SC2086
        timeout 120 "$FA" run --check --check-rows 32 $args > "$OUT/cli_run.log" 2>&1
        note "cli run --check $args: exit $? $(grep -E '^(kernel|rate|check)' "$OUT/cli_run.log" | tr '\n' ' ' | cut -c1-260)"
      done
      timeout 200 "$FA" bench --kvcache "${DEC[@]}" --best --splits 8,16,32 --runs 30 > "$OUT/cli_bench_decode.txt" 2>&1
      note "cli bench --kvcache (decode b16 x 8192): exit $?"; grep -vE "^#|^$" "$OUT/cli_bench_decode.txt" | head -8 | tee -a "$summary"
      wait
      note "pip: exit $(cat "$OUT/pip_after.rc")"
      # PYTEST_TARGET: the package's tests to run (default the serving ones; python/tests: all).
      (cd /tmp && PYTHONPATH=/tmp/site_after timeout 240 python3 -m pytest -q -x "$FRESH/${PYTEST_TARGET:-python/tests/test_serving.py}") \
        > "$OUT/pytest_serving.log" 2>&1
      note "pytest ${PYTEST_TARGET:-python/tests/test_serving.py}: exit $? $(tail -1 "$OUT/pytest_serving.log")"
      grep -E "^FAILED|Error|assert" "$OUT/pytest_serving.log" | head -8 | tee -a "$summary"
      (cd /tmp && PYTHONPATH=/tmp/site_after timeout 200 python3 "$FRESH/bench/serving.py" --out "$OUT/serving.md") \
        > "$OUT/serving_bench.log" 2>&1
      note "bench/serving.py: exit $?"
      tail -4 "$OUT/serving_bench.log" | grep -v "^|" | tee -a "$summary"
      grep -E "^\|" "$OUT/serving.md" >> "$summary" ;;
    serving_ab)
      # Issue 14: the serving kernels of .dev/before (carried; a tree with the command line's
      # --kvcache) against this tree's, `bench --kvcache` alternated for three rounds on the
      # decoding shapes of bench/serving.py (contiguous and paged) and speculative decoding
      # at batch 16, 1 and 6 (6: CTAs of several ranges, the first folded; 16: all folded), and
      # on 16-row pages.
      fresh_clone
      if [ ! -d "$REPO/.dev/before" ]; then
        note "serving_ab: .dev/before is missing (carry .dev)"
      else
        echo "(BF16, 128, 128, 128, 12): sm90+stages_2+overlap+persistent+qreg+dynamic" > "$OUT/sab_configs.txt"
        build_before_after sab "$OUT/sab_configs.txt"
        H=(--heads 32 --heads-kv 8)
        shapes=("--kvcache --seq 1 --seq-k 8192 --batch 16" "--kvcache --seq 1 --seq-k 131072 --batch 1"
                "--page-size 16 --seq 1 --seq-k 131072 --batch 1" "--kvcache --seq 16 --seq-k 4096 --batch 16 --causal"
                "--kvcache --seq 16 --seq-k 4096 --batch 1 --causal" "--kvcache --seq 16 --seq-k 4096 --batch 6 --causal"
                "--page-size 16 --seq 16 --seq-k 4096 --batch 16 --causal")
        for round in 1 2 3; do
          order="before after"
          [ $round = 2 ] && order="after before"
          for tree in $order; do
            for shape in "${shapes[@]}"; do
              # shellcheck disable=SC2086
              timeout 60 "/tmp/sab_$tree/bin/flash_attention" bench $shape "${H[@]}" --runs 20 --rounds 4 \
                --warmup-ms 300 > "$OUT/sab.txt" 2>&1
              note "sab round $round $tree [$shape]: $(grep -E '^kvcache|^paged' "$OUT/sab.txt" | awk '{print $(NF-3)*1000 " us, " $(NF-1) " TB/s, " $NF " TFLOP/s"}' | paste -sd' ')"
            done
          done
        done
      fi ;;
    serving_splits)
      # Issue 14: where the split-KV kernel's time goes: split counts of the decoding shapes
      # and speculative decoding timed by `bench --kvcache --splits`, and ncu of the split and
      # combine kernels of speculative decoding (one config built: the serving kernels are
      # always in the build).
      build_one_config ss
      FA=/tmp/ss/bin/flash_attention
      H=(--heads 32 --heads-kv 8 --runs 20 --rounds 4 --warmup-ms 300)
      for spec in "--seq 16 --seq-k 4096 --batch 16 --causal --splits 1,2,4,8,16" \
                  "--seq 1 --seq-k 8192 --batch 16 --splits 4,8,16" "--seq 1 --seq-k 131072 --batch 1 --splits 16,32,64"; do
        # shellcheck disable=SC2086
        timeout 90 "$FA" bench --kvcache --best $spec "${H[@]}" > "$OUT/ss.txt" 2>&1
        note "[$spec]"; grep -E '^kvcache' "$OUT/ss.txt" | tee -a "$summary"
      done
      timeout 120 ncu --section SpeedOfLight --section Occupancy --section LaunchStats --launch-count 2 \
        "$FA" run --kvcache --seq 16 --seq-k 4096 --batch 16 --heads 32 --heads-kv 8 --causal > "$OUT/ncu_spec.txt" 2>&1
      note "ncu spec decode: exit $?"
      grep -E "split_kv_kernel|combine_kernel|Duration|DRAM Throughput|Registers Per|Achieved Occ|Block Limit (Sh|Reg)|Grid Size" "$OUT/ncu_spec.txt" | tee -a "$summary"
      timeout 120 ncu --section SpeedOfLight --section Occupancy --section LaunchStats --launch-count 2 \
        "$FA" run --kvcache --seq 1 --seq-k 8192 --batch 16 --heads 32 --heads-kv 8 > "$OUT/ncu_decode.txt" 2>&1
      note "ncu decode b16 x 8192: exit $?"
      grep -E "split_kv_kernel|combine_kernel|Duration|DRAM Throughput|Grid Size" "$OUT/ncu_decode.txt" | tee -a "$summary"
      # The peer's kernels on the same shape (the last launches of the script's loop).
      timeout 150 ncu --section SpeedOfLight --section Occupancy --section LaunchStats --launch-skip 5 \
        --launch-count 4 python3 "$FRESH/scripts/cudnn_decode.py" 16 8192 > "$OUT/ncu_cudnn.txt" 2>&1
      note "ncu cuDNN decode b16 x 8192: exit $?"
      grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Registers Per|Achieved Occ|Block Limit (Sh|Reg)|Grid Size|Block Size|Shared Memory Config|Dynamic Shared" "$OUT/ncu_cudnn.txt" | cut -c1-150 | tee -a "$summary" ;;
    paged_probe)
      # Issue 14: why a 16-row page costs more than a 64-row one (b1 x 131072 decode +21% / +7%,
      # chunked prefill +83% / +7%): page sizes and split counts timed against the contiguous
      # cache, and ncu of the chunked prefill's sm90 kernel contiguous and paged 16.
      build_one_config pp
      FA=/tmp/pp/bin/flash_attention
      H=(--heads 32 --heads-kv 8 --runs 20 --rounds 3 --warmup-ms 200)
      for cache in "--kvcache" "--page-size 16" "--page-size 32" "--page-size 64" "--page-size 256"; do
        for spec in "--seq 1 --seq-k 131072 --batch 1 --splits 32,64,128" "--seq 512 --seq-k 8192 --batch 8 --causal"; do
          # shellcheck disable=SC2086
          timeout 90 "$FA" bench $cache $spec "${H[@]}" > "$OUT/pp.txt" 2>&1
          note "[$cache $spec]"; grep -E '^(kvcache|paged)' "$OUT/pp.txt" | tee -a "$summary"
        done
      done
      SECTIONS=(--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats)
      for cache in "--kvcache" "--page-size 16"; do
        # shellcheck disable=SC2086
        timeout 120 ncu "${SECTIONS[@]}" --kernel-name regex:forward_kernel --launch-count 1 \
          "$FA" run $cache --seq 512 --seq-k 8192 --batch 8 --heads 32 --heads-kv 8 --causal > "$OUT/pp_ncu.txt" 2>&1
        note "-- ncu chunked prefill $cache: exit $?"
        grep -E "Duration|DRAM Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|L2 Hit|L1/TEX Hit|Mem Busy" \
          "$OUT/pp_ncu.txt" | cut -c1-200 | tee -a "$summary"
      done ;;
    variants)
      fresh_clone
      # Prebuilt here (the release set, stripped, tar.xz: a minute or more of device time saved).
      mkdir -p /tmp/carry && tar xJf "$REPO/.dev/carry/bin.tar.xz" -C /tmp/carry 2> /dev/null
      T=/tmp/carry/test_gpu
      FA=/tmp/carry/flash_attention
      if ! "$T" --gtest_list_tests > /dev/null 2>&1 || ! "$FA" list > /dev/null 2>&1; then
        # The two binaries only; packed for the next call's carry (bin.tar.xz).
        (cd "$FRESH" && cmake -S . -B build -G Ninja > /dev/null &&
          cmake --build build --target test_gpu flash_attention_cli) > "$OUT/build.log" 2>&1
        note "release build: exit $? ($(( $(date +%s) - start )) s)"
        grep -E "error|spill" "$OUT/build.log" | head -8 | tee -a "$summary"
        T="$FRESH/build/tests/test_gpu"
        FA="$FRESH/build/bin/flash_attention"
        mkdir -p /tmp/pack && cp "$T" "$FA" /tmp/pack/ && strip /tmp/pack/* &&
          (cd /tmp/pack && tar cf - test_gpu flash_attention | xz -T0 -6 > "$RESULTS/bin.tar.xz") &
      fi
      note "binaries: $T ($(( $(date +%s) - start )) s)"
      note "$(cat "$OUT/gpu.txt" | head -1)"
      timeout 150 "$T" --gtest_filter="${VARIANTS_FILTER:-*Variants*:*OddShapes*:Serving/Varlen.*:ForwardDecode*}" \
        > "$OUT/test_gpu_variants.log" 2>&1
      note "test_gpu variants: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu_variants.log" | tr '\n' ' ')"
      note "  last started: $(grep -E '^\[ RUN' "$OUT/test_gpu_variants.log" | tail -1)"
      grep -E '^\[  FAILED|Failure|FAILED:|sequence' "$OUT/test_gpu_variants.log" | head -12 | tee -a "$summary"
      if [ "${VARIANTS_MEMCHECK:-1}" = 1 ]; then
        timeout 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$T" \
          --gtest_filter='Built/EveryConfigVariants.*sm90_config1?_shape7:Built/EveryConfigVariants.*sm80_config*_shape2' \
          > "$OUT/variants_memcheck.log" 2>&1
        note "variants memcheck: exit $? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/variants_memcheck.log" | tr '\n' ' ')"
        timeout 60 compute-sanitizer --tool racecheck --error-exitcode 1 "$T" \
          --gtest_filter='Built/EveryConfigVariants.*sm90_config1?_shape7:Built/EveryConfigVariants.*sm90_config1?_shape10' \
          > "$OUT/variants_racecheck.log" 2>&1
        note "variants racecheck: exit $? $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$OUT/variants_racecheck.log" | tr '\n' ' ')"
      fi
      # The bars, interleaved: bf16 d_head 128, 32/8 heads.
      H=(--heads 32 --heads-kv 8 --d-head 128 --dtype bf16 --runs 10 --rounds 2 --warmup-ms 300 --format json)
      for i in 1 2; do
        for v in causal window; do
          extra=(--causal); [ $v = window ] && extra+=(--window 4096,0)
          timeout 60 "$FA" bench --seq 32768 --batch 1 "${H[@]}" "${extra[@]}" > "$OUT/bars_32k_${v}_$i.json" 2>> "$OUT/bars.err"
        done
        # noop: the variant kernel with a window past every key (its cost without a softcap).
        # softcap60: past the fixed reference's range in bf16 (row maxima, KernelArgs::softcap_fixed).
        for v in plain noop softcap sinks softcap60; do
          extra=(); [ $v = softcap ] && extra=(--softcap 50); [ $v = sinks ] && extra=(--sinks)
          [ $v = softcap60 ] && extra=(--softcap 60)
          [ $v = noop ] && extra=(--window 1073741823,-1)
          timeout 60 "$FA" bench --seq 16384 --batch 1 "${H[@]}" "${extra[@]}" > "$OUT/bars_16k_${v}_$i.json" 2>> "$OUT/bars.err"
        done
      done
      python3 - "$OUT" <<'PY' | tee -a "$summary"
import glob, json, os, statistics, sys
out = sys.argv[1]
def ms(name):
    t = []
    for f in sorted(glob.glob(os.path.join(out, f"bars_{name}_*.json"))):
        try:
            t += [m["median_ms"] for m in json.load(open(f))["measurements"]]
        except (ValueError, KeyError):
            pass
    return statistics.median(t) if t else float("nan")
c, w = ms("32k_causal"), ms("32k_window")
p, n, s, k, s60 = ms("16k_plain"), ms("16k_noop"), ms("16k_softcap"), ms("16k_sinks"), ms("16k_softcap60")
print(f"32k causal {c:.3f} ms, window (4096, 0) {w:.3f} ms: {c / w:.2f}x faster (bar 6x)")
print(f"16k plain {p:.3f} ms, softcap 50 {s:.3f} ms (+{100 * (s / p - 1):.1f}%, bar 10%), "
      f"sinks {k:.3f} ms (+{100 * (k / p - 1):.1f}%, bar 3%), variant kernel without a softcap "
      f"{n:.3f} ms (+{100 * (n / p - 1):.1f}%), softcap 60 (row maxima) {s60:.3f} ms (+{100 * (s60 / p - 1):.1f}%)")
PY
      timeout 60 "$FA" run --check --seq 4095 --batch 1 --heads 32 --heads-kv 8 --causal --window 1000,0 --softcap 30 --sinks \
        > "$OUT/cli_run_variants.log" 2>&1
      note "cli run --check --window 1000,0 --softcap 30 --sinks: exit $? $(grep -E '^(kernel|check)' "$OUT/cli_run_variants.log" | tr '\n' ' ' | cut -c1-240)"
      wait ;;
    tunevariants)
      # Issue 15: every built bf16 d_head 128 config of the release set (the carried CLI) on the
      # bars' 16k problem, plain, with softcap 50 and causal with softcap 50: does another
      # config than the automatic choice's suit the softcap?
      mkdir -p /tmp/carry && tar xJf "$REPO/.dev/carry/bin.tar.xz" -C /tmp/carry 2> /dev/null
      for v in plain softcap causal_softcap; do
        extra=(); [ $v = softcap ] && extra=(--softcap 50); [ $v = causal_softcap ] && extra=(--softcap 50 --causal)
        timeout 150 /tmp/carry/flash_attention tune --set release --d-head 128 --dtype bf16 --seq 16384 --batch 1 \
          --heads 32 --heads-kv 8 --runs 10 --rounds 2 --warmup-ms 300 --cache /tmp/tune_$v.json "${extra[@]}" \
          > "$OUT/tune_variants_$v.txt" 2>&1
        note "tune $v: exit $?"; grep -E "^\(|^config|TFLOP" "$OUT/tune_variants_$v.txt" | head -14 | tee -a "$summary"
      done ;;
    models|grid)
      # models: the Hugging Face model tests with the default package. grid: bench/compare.py
      # (the whole grid against cuDNN and FA2 with the default package; GRID_ARGS, e.g. --causal)
      # and the carried CLI's 32k causal GQA row.
      fresh_clone
      default_package
      if [ "$stage" = models ]; then
        (cd /tmp && PYTHONPATH=/tmp/site_after timeout 200 python3 -m pytest -q -rs -s \
          "$FRESH/python/tests/test_models.py") > "$OUT/pytest_models.log" 2>&1
        note "pytest models: exit $? $(tail -1 "$OUT/pytest_models.log")"
        grep -E "^FAILED|Error|assert|top-1" "$OUT/pytest_models.log" | head -10 | cut -c1-300 | tee -a "$summary"
      else
        tag=grid${GRID_ARGS:+_causal}
        # shellcheck disable=SC2086
        (cd /tmp && PYTHONPATH=/tmp/site_after timeout 400 python3 "$FRESH/bench/compare.py" ${GRID_ARGS:-} \
          --out "$OUT/$tag") > "$OUT/$tag.log" 2>&1
        note "compare.py ${GRID_ARGS:-}: exit $?"
        grep -E "^\|" "$OUT/$tag.md" | head -60 >> "$summary"
        cp "$OUT/$tag.md" "$OUT/$tag.png" "$RESULTS/" 2> /dev/null
      fi ;;
    pyvariants)
      # The default package (pip install .), imported in fresh interpreters in both orders with
      # torch, its variant, model and forward tests, and bench/serving.py (issue 14's numbers).
      fresh_clone
      default_package
      for order in "import flash_attention_scratch, torch" "import torch, flash_attention_scratch"; do
        (cd /tmp && PYTHONPATH=/tmp/site_after timeout 60 python3 -c "$order; print('ok')") > "$OUT/import.log" 2>&1
        note "python -c '$order': exit $? $(tail -1 "$OUT/import.log")"
      done
      (cd /tmp && PYTHONPATH=/tmp/site_after timeout 200 python3 -m pytest -q -rs -s \
        "$FRESH/python/tests/test_variants.py" "$FRESH/python/tests/test_models.py" \
        "$FRESH/python/tests/test_forward.py") > "$OUT/pytest_variants.log" 2>&1
      note "pytest variants, models, forward: exit $? $(tail -1 "$OUT/pytest_variants.log")"
      grep -E "^FAILED|Error|assert|top-1" "$OUT/pytest_variants.log" | head -10 | cut -c1-300 | tee -a "$summary"
      (cd /tmp && PYTHONPATH=/tmp/site_after timeout 150 python3 "$FRESH/bench/serving.py" --out "$OUT/serving.md") \
        > "$OUT/serving_bench.log" 2>&1
      note "bench/serving.py: exit $?"
      tail -4 "$OUT/serving_bench.log" | grep -v "^|" | tee -a "$summary"
      grep -E "^\|" "$OUT/serving.md" >> "$summary" ;;
    *) note "unknown stage $stage" ;;
  esac
  note "[$stage: $(( $(date +%s) - start )) s]"
  (cd "$OUT" && tar czf "$RESULTS/logs.tgz.part" . && mv "$RESULTS/logs.tgz.part" "$RESULTS/logs.tgz")
done
echo; echo "==== summary"; cat "$summary"
