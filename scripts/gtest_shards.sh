#!/usr/bin/env bash
# gtest_shards.sh N COMMAND...: runs a gtest binary's COMMAND as N shards at once (GTEST_TOTAL_SHARDS,
# GTEST_SHARD_INDEX), one GPU shared by all, then prints each shard's output in order. The tests'
# kernels are small, so shards overlap on the GPU (a compute-sanitizer run is host-bound: N shards
# use N cores). Exits with the first failing shard's code, or 0.
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
  cat "$dir/$i.log"
  [ $rc -ne 0 ] || rc=$r
done
exit $rc
