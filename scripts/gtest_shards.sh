#!/usr/bin/env bash
# gtest_shards.sh N COMMAND...: runs a gtest binary's COMMAND as N shards at once (GTEST_TOTAL_SHARDS,
# GTEST_SHARD_INDEX), one GPU shared by all, then prints each shard's output in order, without
# gtest's per-test RUN and OK lines (as --gtest_brief=1 would) but with, for a shard cut short
# (a timeout), the test it was running, and last the slowest tests that passed. The shards'
# whole logs (each test's time) stay in SHARD_LOGS if set. The tests' kernels are small, so shards
# overlap on the GPU (a compute-sanitizer run is host-bound: N shards use N cores). Exits with the
# first failing shard's code, or 0.
set -uo pipefail
n=${1:?gtest_shards.sh N COMMAND...}
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
# timeout's TERM reaches this script alone: pass it on, then print what the shards wrote.
trap 'kill "${pids[@]}" 2>/dev/null' TERM INT
for ((i = 0; i < n; ++i)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$@" > "$dir/$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for ((i = 0; i < n; ++i)); do
  wait "${pids[$i]}"
  r=$?
  # a trapped signal ends the wait early: wait again for the shard's own exit
  while kill -0 "${pids[$i]}" 2>/dev/null; do
    wait "${pids[$i]}"
    r=$?
  done
  echo "== shard $i of $n: exit $r"
  grep -vE '^(\[ +(RUN|OK) +\]|\[-+\]|$)' "$dir/$i.log"
  if ! grep -qE '^\[=+\] [0-9]+ tests? from .* ran' "$dir/$i.log"; then
    last=$(grep -E '^\[ RUN +\]' "$dir/$i.log" | tail -1 | sed 's/^\[ RUN *\] //')
    echo "cut short${last:+ in: $last}"
  fi
  [ -z "${SHARD_LOGS:-}" ] || cp "$dir/$i.log" "$SHARD_LOGS/shard_$i.log"
  [ $rc -ne 0 ] || rc=$r
done
slowest=$(cat "$dir"/*.log | sed -nE 's/^\[ +OK +\] (.*) \(([0-9]+) ms\)$/\2 \1/p' | sort -rn | head -5 |
  awk '{printf "%s %.0fs; ", $2, $1 / 1000}')
[ -z "$slowest" ] || echo "slowest: $slowest"
exit $rc
