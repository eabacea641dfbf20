#!/usr/bin/env bash
# The checks that need a GPU, in stages, from the repository's root. The results a stage
# makes (the grid's table and plot) and the full logs, packed as logs.tgz, go under $OUT; a
# short summary is printed last. Stages run in the order given:
#
#   scripts/gpu_check.sh build sanitize package grid
#
#   build    the README's build (default options: the release set) with warnings as errors, the
#            README's main job (`run --check`), the host and GPU tests (the GPU tests and the
#            sanitizers run as GPU_SHARDS=4 gtest shards at once: scripts/gtest_shards.sh)
#   prebuilt D  instead of build, binaries built elsewhere (scripts/pack_build.sh BUILD D, D carried):
#            unpacked into $BUILD, then build's checks (the host tests if D holds them); the device's
#            minutes go to the GPU alone
#            (GPU_FILTER=PATTERN: build's GPU tests restricted to a gtest filter)
#   sanitize compute-sanitizer on build's tests: memcheck on odd shapes of every built config,
#            racecheck on the sm90 ones (SANITIZE_D=96: that head dim's configs alone; build and
#            sanitize together take about 10 minutes on an
#            H200 host of 16 cores: the device tool's limit for one command)
#   package  the default Python package (pip install .), its import in fresh interpreters
#            before and after torch and a call with inputs that require grad (check_imports),
#            and the pytest suite
#   pyext    instead of package, for a quicker grid: the Python extension built in the build
#            stage's tree (the same kernels; alone, the extension's targets without the build
#            stage's tests) and staged with the package's sources into $SITE, then check_imports
#   pytest   the pytest suite against the package that package or pyext staged (package runs it
#            itself); after pyext, the Python GPU tests without pip's two-minute build
#            (PYTEST_FILES="test_variants.py test_serving.py": those files of python/tests alone)
#   grid     bench/compare.py: the forward grid and the model-shaped rows, then the backward grid
#            (seq 1k-16k), against cuDNN, FlashAttention-4 and FlashAttention-2 in one process
#            and the backward of the variants against FA4 (bench/compare.py --variants)
#            (needs package or pyext; GRID=backward, forward, variants, kernels (bench/backward_kernels.py:
#            the backward's time kernel by kernel, ours beside FA4 and cuDNN) or models (the model-shaped
#            rows alone; GRID_GRAPHS=1 times them as CUDA graph replays; KERNELS_NCU=1 adds the kernels' own
#            durations under Nsight Compute, one at a time: bench/backward_kernels.py --ncu-region) runs one, GRID_ARGS="..." adds
#            compare.py arguments to the forward grid (e.g. "--seqs 2048 8192 --d-heads 96 --no-models"), BWD_SEQS="2048 8192"
#            other lengths, BWD_D_HEADS="96" other head dims, BWD_ROUNDS=N fewer rounds). FlashAttention-4 comes from $PEERS (default .peers/fa4: a copy of
#            ../shared/peers/fa4-wheels, carried)
#   backward the default build (unless built), its backward GPU tests (unless build's or
#            prebuilt's checks ran them), memcheck and racecheck on odd shapes, and `flash_attention
#            bench --backward` of the release set's backward configs over the bf16 grid (seq
#            1k-16k); BWD_CANDIDATES=FILE adds FILE's short forms to the build and the bench,
#            BWD_BENCH=0 skips the bench
#   flash_attn_suite  flash_attn's own tests/test_flash_attn.py (pinned commit, unmodified) against the package
#            (needs package or pyext; .upstream/test_flash_attn.py carried, or a download; a seeded sample
#            of FLASH_ATTN_SUITE_SAMPLE=5000 cases over every test function: about 3000 run, flash_attn's
#            kvcache test skips the rest itself)
#   bench F  a build of the release set plus the short forms of file F (BENCH_RELEASE=0: F's alone;
#            with BWD_CANDIDATES=F the backward stage's build, so `bench F backward` builds once; after
#            prebuilt, its binaries), then `flash_attention bench` of F's configs, once per "#! ARGS"
#            line of F (its arguments added)
#   fp8 F    the FP8 forward's checks and timings, built with file F's short forms alone and the Python
#            extension (cold on 16 cores: about 90 s for four FP8 configs): the `Fp8*` GPU tests, memcheck and
#            racecheck of each config of F that transposes V in the kernel (vtrans) on an odd shape
#            (`run --check`), the Python FP8 tests, then bench/fp8.py of F's FP8 configs beside cuDNN's
#            FP8 (cudnn-frontend, installed from $CUDNN_FE, default .peers/cudnn-frontend: a copy of its
#            wheel, carried), once per "#fp8! ARGS" line of F (e.g. bench/fp8-vtrans.txt); its tables
#            go under $OUT as fp8_N.md
#   ncu F    Nsight Compute, side by side: file F's short forms built alone (the command line), then for
#            each "#ncu! ARGS" line of F (`flash_attention run` arguments, e.g. --seq 16384 --batch 1
#            --heads 16) each forward config's first forward kernel (a --backward line: each backward config's
#            main kernel, its forward on the file's forward configs) profiled at the card's
#            clocks (--clock-control none; SpeedOfLight, memory, scheduler, warp-state and source
#            counters): its details page and per-instruction stall samples (ncu_L_I.csv,
#            ncu_L_I_sass.csv.xz) go into logs.tgz, the table of scripts/ncu_table.py across the configs
#            to $OUT as ncu_L.md (e.g. bench/ncu-fp8-vtrans.txt)
#   ab D F   an A/B of this tree against the tree in folder D (another commit's: `git archive REV |
#            tar -x -C D`, carried): both built with file F's short forms alone (D may instead hold
#            another build's packed binaries, and after prebuilt this tree's are used), then, in AB_ROUNDS
#            rounds (default 3) that alternate which binary goes first, `flash_attention bench
#            --config C` for each config C of F, in a bench of its own (a --backward line's the
#            backward configs, another line's the forward ones), once per "#! ARGS" line of F
#            (e.g. bench/ab-backward-bf16.txt); last
#            bench/ab_summary.py's table of medians, tree against base
#
# A stage's failure is reported and the next stage still runs; the exit code is 1 if any
# stage failed. DEADLINE=S (seconds from the start) stops each check at that time and skips
# those after it, so that the summary and logs.tgz still come back within a call's time limit
# (the device tool's is 600 s: a cold `build sanitize backward` ran past it, 2026-12-04).
# On the device machine: `run` with carry [".peers"] for the grid.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu_check}
LOGS=${LOGS:-/tmp/gpu_check_logs}
PEERS=${PEERS:-$REPO/.peers/fa4}
BUILD=${BUILD:-$REPO/build}
SITE=${SITE:-/tmp/gpu_check_site}
mkdir -p "$OUT" "$LOGS"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
jobs=$(nproc)
# The GPU tests and sanitizers run as this many gtest shards at once (scripts/gtest_shards.sh).
shards=${GPU_SHARDS:-4}
summary=()
failed=0
note() { summary+=("$*"); echo "$*"; }
# check NAME COMMAND...: runs the command with its output in $LOGS/NAME.log, notes the exit code.
check() {
  local name=$1
  shift
  local t0=$SECONDS
  if [ -n "${DEADLINE:-}" ]; then
    if [ $((DEADLINE - SECONDS)) -le 0 ]; then
      failed=1
      note "$(printf '%-10s skipped: past DEADLINE=%ss' "$name" "$DEADLINE")"
      return 1
    fi
    set -- timeout $((DEADLINE - SECONDS)) "$@"
  fi
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || failed=1
  note "$(printf '%-10s exit %-3s %4ss  %s' "$name" $rc $((SECONDS - t0)) "$(summary_of "$name")")"
  return $rc
}
# The line of a log that says how it went.
summary_of() {
  local log=$LOGS/$1.log
  grep -hE '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY|^(rate|check) |passed|failed|Ahead of' "$log" |
    tail -3 | tr '\n' ' ' | cut -c1-200
}

stage_build() {
  check deps scripts/install_deps_debian.sh || return
  check configure cmake -S . -B "$BUILD" -G Ninja -DFLASH_WERROR=ON || return
  check compile cmake --build "$BUILD" -j "$jobs" || return
  build_checks
}

stage_prebuilt() {
  local dir=$1 name
  for name in bin/flash_attention tests/test_host tests/test_gpu; do
    # The host tests are optional (pack_build.sh leaves them to the machine that built them).
    [ "$name" != tests/test_host ] || [ -f "$dir/test_host.xz" ] || continue
    if [ ! -f "$dir/$(basename "$name").xz" ]; then
      note "prebuilt: expected $dir/$(basename "$name").xz (scripts/pack_build.sh), got none"
      failed=1
      return
    fi
    mkdir -p "$BUILD/$(dirname "$name")"
    if ! xz -dc "$dir/$(basename "$name").xz" > "$BUILD/$name"; then
      note "prebuilt: $dir/$(basename "$name").xz did not unpack"
      failed=1
      return
    fi
    chmod +x "$BUILD/$name"
  done
  prebuilt=$dir
  build_checks
}

build_checks() {
  # A pack of a few configs (prebuilt) may lack the default problem's kernel: there, its first
  # 16-bit forward config's problem.
  local readme=()
  if [ -n "${prebuilt:-}" ]; then
    local first
    first=$("$BUILD/bin/flash_attention" list | grep -E '^\((BF16|FP16),' | grep -v 'bwd' | head -1 | sed 's/  smem=.*//')
    [ -z "$first" ] || readme=(--config "$first")
  fi
  check readme "$BUILD/bin/flash_attention" run --check "${readme[@]}"
  [ ! -x "$BUILD/tests/test_host" ] || check test_host "$BUILD/tests/test_host" --gtest_brief=1
  check test_gpu timeout 420 env SHARD_LOGS="$LOGS" scripts/gtest_shards.sh "$shards" "$BUILD/tests/test_gpu" --gtest_filter="${GPU_FILTER:-*}"
  checked_filter=${GPU_FILTER:-*}
}

# The backward stage's kernels: the release set, BWD_CANDIDATES's short forms and EXTRA_KERNELS
# (more FLASH_KERNELS items, e.g. @bench/fp8-d64.txt, so that one build serves other tests too).
backward_set() {
  echo "release${BWD_CANDIDATES:+,@$(realpath "$BWD_CANDIDATES")}${EXTRA_KERNELS:+,$EXTRA_KERNELS}"
}

# build_set SET: $BUILD with the tests, of the kernel set SET (FLASH_KERNELS).
build_set() {
  check configure cmake -S . -B "$BUILD" -G Ninja -DFLASH_WERROR=ON -DFLASH_KERNELS="$1" || return
  check compile cmake --build "$BUILD" -j "$jobs"
}

stage_backward() {
  local set
  set=$(backward_set)
  [ -x "$BUILD/tests/test_gpu" ] || build_set "$set" || return
  # Unless build's checks ran them already (every GPU test, or a filter with the backward's).
  if [ -z "${checked_filter:-}" ]; then
    check test_host "$BUILD/tests/test_host" --gtest_brief=1
  fi
  if [[ ${checked_filter:-} != "*" && ${checked_filter:-} != *"*Backward*"* ]]; then
    check test_bwd timeout 300 scripts/gtest_shards.sh "$shards" "$BUILD/tests/test_gpu" --gtest_filter='*Backward*'
  fi
  # Odd shapes causal and not (q513_k513: several query blocks a walk without a mask, which
  # d_head 256 walks rotated), every sm90 backward config racechecked, d_head 256's included; and
  # stream-K's split (the odd shapes have too few key blocks to split).
  check memcheck_bwd timeout 300 scripts/gtest_shards.sh "$shards" compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$BUILD/tests/test_gpu" --gtest_brief=1 \
    --gtest_filter='Built/EveryBackwardConfig.*q100_k257*:Built/EveryBackwardConfig.*q257_k100*:Built/EveryBackwardConfig.*q513_k513*:Backward.Sinks*:Backward.Softcap*:Backward.Window*:Backward.Varlen*:Backward.StreamKSplitsTheLastRound'
  check racecheck_bwd timeout 300 scripts/gtest_shards.sh "$shards" compute-sanitizer --tool racecheck --error-exitcode 1 \
    "$BUILD/tests/test_gpu" --gtest_brief=1 \
    --gtest_filter='Built/EveryBackwardConfig.*sm90_bwd_*q100_k257*:Built/EveryBackwardConfig.*sm90_bwd_*q17_k600*:Built/EveryBackwardConfig.*sm90_bwd_*q513_k513*:Backward.StreamKSplitsTheLastRound'
  [ "${BWD_BENCH:-1}" = 1 ] || return 0
  local causal
  for causal in "" --causal; do
    check "bench_bwd$causal" "$BUILD/bin/flash_attention" bench --backward --set "$set" --dtype bf16 \
      --seq 1024,2048,4096,8192,16384 --warmup-ms 200 --runs 10 $causal
    cat "$LOGS/bench_bwd$causal.log"
  done
}

stage_sanitize() {
  [ -x "$BUILD/tests/test_gpu" ] || stage_build
  # API errors are not memory errors: one test makes cudaMalloc fail on purpose. SANITIZE_D=96
  # keeps the odd shapes to that head dim's configs.
  local d=${SANITIZE_D:+_d${SANITIZE_D}_}
  check memcheck timeout 300 scripts/gtest_shards.sh "$shards" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
    "$BUILD/tests/test_gpu" --gtest_brief=1 \
    --gtest_filter="Built/EveryConfigOddShapes.*${d}*q129_k257*:Built/EveryConfigOddShapes.*${d}*q1000_k7_*:Forward.*"
  check racecheck timeout 300 scripts/gtest_shards.sh "$shards" compute-sanitizer --tool racecheck --error-exitcode 1 \
    "$BUILD/tests/test_gpu" --gtest_brief=1 \
    --gtest_filter="Built/EveryConfigOddShapes.*sm90*${d}*q129_k257*:Built/EveryConfigOddShapes.*sm90*${d}*q1000_k7_*"
}

stage_package() {
  rm -rf "$SITE"
  check pip env CMAKE_BUILD_PARALLEL_LEVEL="$jobs" python3 -m pip install --no-build-isolation --no-deps \
    --target "$SITE" . || return
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  check_imports
  stage_pytest
}

stage_pytest() {
  [ -d "$SITE/flash_attention_scratch" ] || stage_package
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  # PYTEST_FILES="test_variants.py ...": those files of python/tests alone.
  local files=() f
  for f in ${PYTEST_FILES:-}; do files+=("$REPO/python/tests/$f"); done
  [ ${#files[@]} -gt 0 ] || files=("$REPO/python/tests")
  check pytest env FLASH_EXPECT_RELEASE_SET=1 bash -c "cd /tmp && timeout 600 python3 -m pytest -q -rs ${files[*]}"
}

# The package imported in fresh interpreters alone, before torch and after it, then a causal call
# with inputs that require grad, its gradients compared with SDPA's on fp32 copies of the inputs.
check_imports() {
  check imports bash -c 'cd /tmp && python3 -c "import flash_attention_scratch" &&
    python3 -c "import flash_attention_scratch, torch" && python3 -c "import torch, flash_attention_scratch" &&
    python3 -c "
import torch, flash_attention_scratch as fa
q, k, v = (torch.randn(2, 300, 4, 128, device=\"cuda\", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
fa.flash_attn_func(q, k, v, causal=True).float().square().sum().backward()
ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
o = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in ref), is_causal=True)
o.transpose(1, 2).square().sum().backward()
for name, ours, theirs in zip(\"qkv\", (q, k, v), ref):
    error = (ours.grad.float() - theirs.grad).abs().max().item()
    assert error < 0.05 * theirs.grad.abs().max().item(), (name, error)
print(\"requires_grad call: gradients match SDPA fp32\")
"'
}

stage_pyext() {
  # Alone (no build stage before it): the extension's targets only, no tests, the quickest way to a grid (the
  # extension's kernels built on 16 cores in about 140 s, H100 host, 2026-12-07, against the build stage's
  # compile and tests in about 420 s).
  if [ ! -f "$BUILD/build.ninja" ]; then
    check deps scripts/install_deps_debian.sh || return
    check configure cmake -S . -B "$BUILD" -G Ninja -DFLASH_WERROR=ON || return
  fi
  rm -rf "$SITE"
  check pyext bash -c "cmake -S . -B '$BUILD' -DFLASH_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3) &&
    cmake --build '$BUILD' -j $jobs --target _C _C_stub && mkdir -p '$SITE/flash_attention_scratch' &&
    cp -r python/flash_attention_scratch/* '$BUILD'/python/_C*.so '$BUILD/python/_C.pyi' '$SITE/flash_attention_scratch/'" || return
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  check_imports
}

peers() {
  [ -d "$PEERS" ] || { note "grid: no FlashAttention-4 wheels at $PEERS: its column stays empty"; return; }
  local dir=/tmp/gpu_check_peers
  if [ ! -d "$dir/flash_attn" ]; then
    mkdir -p "$dir" && python3 -m pip install -q --no-index --no-deps --no-compile --target "$dir" "$PEERS"/*.whl &&
      tar -C "$dir" -xJf "$PEERS/cu13.tar.xz" || note "grid: FlashAttention-4 did not install"
  fi
  export PYTHONPATH=$PYTHONPATH:$dir:$dir/nvidia_cutlass_dsl/dsl_packages
}

stage_grid() {
  [ -d "$SITE/flash_attention_scratch" ] || stage_package
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  peers
  local passes=${GRID:-forward backward variants}
  if [[ $passes == *forward* ]]; then
    # shellcheck disable=SC2086 # GRID_ARGS is a list of arguments
    check grid python3 bench/compare.py ${GRID_ARGS:-} --out "$OUT/grid"
    cat "$OUT/grid.md"
  fi
  if [[ $passes == *models* ]]; then
    # The model-shaped rows (speculative decoding, decode, short keys, ...) and one grid cell.
    check grid_models python3 bench/compare.py --seqs 512 --d-heads 128 --dtypes bfloat16 --causal yes \
      ${GRID_GRAPHS:+--graphs --calls 20} --out "$OUT/models"
    cat "$OUT/models.md"
  fi
  if [[ $passes == *kernels* ]]; then
    # shellcheck disable=SC2086 # BWD_SEQS is a list of lengths
    check bwd_kernels python3 bench/backward_kernels.py --seqs ${BWD_SEQS:-1024 2048 8192} \
      --d-heads ${BWD_D_HEADS:-64 128} --out "$OUT/bwd_kernels"
    cat "$OUT/bwd_kernels.md"
    if [ "${KERNELS_NCU:-0}" = 1 ]; then
      check bwd_ncu bash -c "ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        python3 bench/backward_kernels.py --seqs ${BWD_SEQS:-1024 2048 8192} --d-heads ${BWD_D_HEADS:-64 128} \
        --ncu-region '$LOGS/bwd_ncu_labels.txt' > '$LOGS/bwd_ncu.csv' &&
        python3 bench/backward_kernels.py --ncu-table '$LOGS/bwd_ncu.csv' '$LOGS/bwd_ncu_labels.txt' --out '$OUT/bwd_ncu'"
      cat "$OUT/bwd_ncu.md"
    fi
  fi
  if [[ $passes == *backward* ]]; then
    # shellcheck disable=SC2086 # BWD_SEQS is a list of lengths
    check grid_backward python3 bench/compare.py --backward --seqs ${BWD_SEQS:-1024 2048 4096 8192 16384} \
      --d-heads ${BWD_D_HEADS:-64 128 256} ${BWD_ROUNDS:+--rounds $BWD_ROUNDS --warmup $BWD_ROUNDS} \
      --out "$OUT/grid_backward"
    cat "$OUT/grid_backward.md"
  fi
  if [[ $passes == *variants* ]]; then
    check grid_variants python3 bench/compare.py --variants ${BWD_ROUNDS:+--rounds $BWD_ROUNDS --warmup $BWD_ROUNDS} \
      --out "$OUT/variants"
    cat "$OUT/variants.md"
  fi
}

# flash_attn's tests/test_flash_attn.py at a pinned commit, unmodified, from $FLASH_ATTN_TESTS (default
# .upstream/test_flash_attn.py, carried: the device machine has no internet) or downloaded, run against the
# package through python/tests/flash_attn_suite (flash_attn's names, and a plugin that skips dropout, head dims
# not built and flash_attn's internals, each with its reason; FLASH_ATTN_SUITE_SAMPLE=N keeps a seeded sample).
FLASH_ATTN_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced
stage_flash_attn_suite() {
  [ -d "$SITE/flash_attention_scratch" ] || stage_package
  # The shim that answers to `import flash_attn` for this stage's command alone: exported, it
  # stood in for flash_attn in later stages too (the Python suite's signature tests compared
  # the package with its own re-exports).
  local path=$SITE:$REPO/python/tests/flash_attn_suite${PYTHONPATH:+:$PYTHONPATH}
  local tests=${FLASH_ATTN_TESTS:-$REPO/.upstream/test_flash_attn.py}
  if [ ! -f "$tests" ]; then
    mkdir -p "$(dirname "$tests")"
    curl -fsSL "https://raw.githubusercontent.com/Dao-AILab/flash-attention/$FLASH_ATTN_COMMIT/tests/test_flash_attn.py" \
      -o "$tests" || { note "flash_attn_suite: no $tests and no download (flash-attention $FLASH_ATTN_COMMIT)"; failed=1; return; }
  fi
  check flash_attn_suite env PYTHONPATH="$path" FLASH_ATTN_SUITE_SAMPLE="${FLASH_ATTN_SUITE_SAMPLE:-5000}" bash -c \
    "cd /tmp && timeout 1800 python3 -m pytest -q -p flash_attn_suite_plugin -p no:cacheprovider '$tests'"
  tail -40 "$LOGS/flash_attn_suite.log"
}

stage_bench() {
  local file=$1
  [ -f "$file" ] || { note "bench: no file $file"; failed=1; return; }
  local name kernels bin=$BUILD-bench/bin/flash_attention
  kernels="release,@$(realpath "$file")"
  name=bench_$(basename "$file" .txt)
  [ "${BENCH_RELEASE:-1}" = 1 ] || kernels="@$(realpath "$file")"
  # After prebuilt, its binaries (built elsewhere with F's configs); with BWD_CANDIDATES=F, the
  # backward stage's build of the same set, tests and all: built here for it (`bench F backward`:
  # the timings before the tests) or by it.
  if [ -n "${prebuilt:-}" ]; then
    bin=$BUILD/bin/flash_attention
  elif [ "${BWD_CANDIDATES:+$(realpath "$BWD_CANDIDATES")}" = "$(realpath "$file")" ] &&
    [ "${BENCH_RELEASE:-1}" = 1 ]; then
    kernels=$(backward_set)
    grep -qxF "FLASH_KERNELS:STRING=$kernels" "$BUILD/CMakeCache.txt" 2>/dev/null &&
      [ -x "$BUILD/tests/test_gpu" ] || build_set "$kernels" || return
    bin=$BUILD/bin/flash_attention
  else
    check "${name}_build" bash -c "cmake -S . -B '$BUILD-bench' -G Ninja -DFLASH_KERNELS='$kernels' \
      -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF && cmake --build '$BUILD-bench' -j $jobs" || return
  fi
  local args=() lines=() i
  while IFS= read -r c; do args+=(--config "$c"); done < <(grep '^(' "$file")
  mapfile -t lines < <(sed -n 's/^#! //p' "$file")
  [ ${#lines[@]} -gt 0 ] || lines=("")
  for i in "${!lines[@]}"; do
    local extra=()
    read -r -a extra <<< "${lines[$i]}"
    check "${name}_$i" "$bin" bench "${args[@]}" "${extra[@]}"
    cat "$LOGS/${name}_$i.log"
  done
}

stage_fp8() {
  local file=$1
  [ -f "$file" ] || { note "fp8: no file $file"; failed=1; return; }
  local build=$BUILD-fp8 site=$SITE-fp8 configs=() lines=() c i
  mapfile -t configs < <(grep '^(E4M3' "$file")
  mapfile -t lines < <(sed -n 's/^#fp8! //p' "$file")
  check deps scripts/install_deps_debian.sh || return
  check fp8_build bash -c "cmake -S . -B '$build' -G Ninja -DFLASH_WERROR=ON -DFLASH_KERNELS='@$(realpath "$file")' \
    -DFLASH_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3) && cmake --build '$build' -j $jobs" || return
  check fp8_tests timeout 300 "$build/tests/test_gpu" --gtest_brief=1 --gtest_filter='Fp8*'
  for i in "${!configs[@]}"; do
    c=${configs[$i]}
    [[ $c == *vtrans* ]] || continue
    check "fp8_memcheck_$i" timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$build/bin/flash_attention" run --config "$c" --batch 1 --heads 2 --seq 513 --check
    check "fp8_racecheck_$i" timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 \
      "$build/bin/flash_attention" run --config "$c" --batch 1 --heads 2 --seq 513 --check
  done
  rm -rf "$site" && mkdir -p "$site/flash_attention_scratch" &&
    cp -r python/flash_attention_scratch/* "$build"/python/_C*.so "$build/python/_C.pyi" "$site/flash_attention_scratch/"
  if [ -d "${CUDNN_FE:-$REPO/.peers/cudnn-frontend}" ]; then
    check cudnn_fe python3 -m pip install -q --no-deps "${CUDNN_FE:-$REPO/.peers/cudnn-frontend}"/*.whl
  else
    note "fp8: no cudnn-frontend wheel at ${CUDNN_FE:-$REPO/.peers/cudnn-frontend}: bench/fp8.py falls back to the FA3-scaled bar"
  fi
  check fp8_pytest env PYTHONPATH="$site" bash -c "cd /tmp && timeout 300 python3 -m pytest -q '$REPO/python/tests/test_fp8.py'"
  for i in "${!lines[@]}"; do
    local extra=()
    read -r -a extra <<< "${lines[$i]}"
    check "fp8_bench_$i" env PYTHONPATH="$site" python3 bench/fp8.py "${extra[@]}" --out "$OUT/fp8_$i" \
      --fp8-configs "${configs[@]}"
    cat "$OUT/fp8_$i.md"
  done
}

stage_ncu() {
  local file=$1
  [ -f "$file" ] || { note "ncu: no file $file"; failed=1; return; }
  local build=$BUILD-ncu reports=/tmp/gpu_check_ncu configs=() lines=() l i
  mapfile -t configs < <(grep '^(' "$file")
  mapfile -t lines < <(sed -n 's/^#ncu! //p' "$file")
  mkdir -p "$reports"
  check ncu_build bash -c "cmake -S . -B '$build' -G Ninja -DFLASH_KERNELS='@$(realpath "$file")' \
    -DFLASH_BUILD_TESTS=OFF && cmake --build '$build' -j $jobs --target flash_attention_cli" || return
  for l in "${!lines[@]}"; do
    local extra=() columns=() kernel=forward_kernel
    read -r -a extra <<< "${lines[$l]}"
    # A backward run's forward comes first (the automatic choice): skip to the backward's kernel.
    [[ " ${extra[*]} " == *" --backward "* ]] && kernel=backward_kernel
    for i in "${!configs[@]}"; do
      # a --backward line profiles the backward configs, the others the forward ones (a backward
      # line's forward runs on the file's forward configs, as the automatic choice takes them)
      if [ $kernel = backward_kernel ]; then
        [[ ${configs[$i]} == *bwd* ]] || continue
      else
        [[ ${configs[$i]} != *bwd* ]] || continue
      fi
      check "ncu_${l}_$i" timeout 300 ncu --clock-control none -k "regex:$kernel" -c 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats \
        --section WarpStateStats --section SourceCounters --import-source no -f -o "$reports/${l}_$i" \
        "$build/bin/flash_attention" run --config "${configs[$i]}" "${extra[@]}" || continue
      ncu -i "$reports/${l}_$i.ncu-rep" --page details --csv > "$LOGS/ncu_${l}_$i.csv"
      ncu -i "$reports/${l}_$i.ncu-rep" --page source --csv --print-source sass | xz -9 > "$LOGS/ncu_${l}_${i}_sass.csv.xz"
      columns+=("#$i=$LOGS/ncu_${l}_$i.csv")
    done
    echo "ncu ${lines[$l]} (#i: config i of $file)" > "$OUT/ncu_$l.md"
    python3 scripts/ncu_table.py "${columns[@]}" >> "$OUT/ncu_$l.md" && cat "$OUT/ncu_$l.md"
  done
}

stage_ab() {
  local base=$1 file=$2
  if [ ! -d "$base" ] || [ ! -f "$file" ]; then
    note "ab: expected a base tree folder and a file of short forms, got '$base' and '$file'"
    failed=1
    return
  fi
  file=$(realpath "$file")
  local side dir
  for side in tree base; do
    dir=.
    [ $side = base ] && dir=$base
    if [ $side = base ] && [ -f "$base/flash_attention.xz" ]; then
      mkdir -p "$BUILD-ab-base/bin" && xz -dc "$base/flash_attention.xz" > "$BUILD-ab-base/bin/flash_attention" &&
        chmod +x "$BUILD-ab-base/bin/flash_attention" || { note "ab: $base/flash_attention.xz did not unpack"; failed=1; return; }
      continue
    fi
    if [ $side = tree ] && [ -n "${prebuilt:-}" ]; then
      mkdir -p "$BUILD-ab-tree" && ln -sfn "$BUILD/bin" "$BUILD-ab-tree/bin"
      continue
    fi
    check "ab_build_$side" bash -c "cmake -S '$dir' -B '$BUILD-ab-$side' -G Ninja -DFLASH_KERNELS='@$file' \
      -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF && cmake --build '$BUILD-ab-$side' -j $jobs" || return
  done
  local lines=() configs=()
  mapfile -t lines < <(sed -n 's/^#! //p' "$file")
  [ ${#lines[@]} -gt 0 ] || lines=("")
  mapfile -t configs < <(grep -v '^#' "$file" | grep -v '^[[:space:]]*$')
  # Each config in a bench of its own: in one `--set` bench, identical kernels read 3-6% apart
  # between the sides when the configs benched before them differed (H200, 2026-12-05).
  local r i j args=()
  for r in $(seq 1 "${AB_ROUNDS:-3}"); do
    for side in $( ((r % 2)) && echo "tree base" || echo "base tree"); do
      for i in "${!lines[@]}"; do
        read -r -a args <<< "${lines[$i]}"
        for j in "${!configs[@]}"; do
          # a --backward line benches the backward configs, the others the forward ones
          if [[ " ${args[*]} " == *" --backward "* ]]; then
            [[ ${configs[$j]} == *bwd* ]] || continue
          else
            [[ ${configs[$j]} != *bwd* ]] || continue
          fi
          local at="$LOGS/ab_${side}_${r}_${i}_$j"
          "$BUILD-ab-$side/bin/flash_attention" bench --config "${configs[$j]}" "${args[@]}" --format csv \
            > "$at.csv" 2> "$at.err" ||
            { note "ab: bench ($side, round $r, line $i, config $j) failed: $(tail -1 "$at.err")"; failed=1; }
        done
      done
    done
  done
  check ab python3 bench/ab_summary.py "$LOGS"
  cat "$LOGS/ab.log"
}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader > "$LOGS/gpu.txt" 2>&1
note "$(date -u +%F) $(head -1 "$LOGS/gpu.txt")"
while [ $# -gt 0 ]; do
  case $1 in
    build | sanitize | package | pyext | pytest | grid | backward | flash_attn_suite) "stage_$1" ;;
    prebuilt) stage_prebuilt "${2:?prebuilt needs a folder of packed binaries}"; shift ;;
    bench) stage_bench "${2:?bench needs a file of short forms}"; shift ;;
    fp8) stage_fp8 "${2:?fp8 needs a file of short forms}"; shift ;;
    ncu) stage_ncu "${2:?ncu needs a file of short forms}"; shift ;;
    ab) stage_ab "${2:?ab needs a base tree folder}" "${3:?ab needs a file of short forms}"; shift 2 ;;
    *) echo "gpu_check.sh: unknown stage '$1' (build, sanitize, package, pyext, pytest, grid, backward, flash_attn_suite," \
      "bench FILE, fp8 FILE, ncu FILE, ab DIR FILE, prebuilt DIR)" >&2; exit 2 ;;
  esac
  shift
done
tar czf "$OUT/logs.tgz" -C "$LOGS" .
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $failed
