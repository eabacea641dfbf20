set -u
scripts/install_deps_debian.sh > $OUT/deps.log 2>&1
s=$(date +%s)
cmake -S . -B /tmp/sk -G Ninja -DFLASH_KERNELS=@bench/explore/2026-12-28-streamk-tests.txt -DCMAKE_CUDA_ARCHITECTURES=90-real > $OUT/cfg.log 2>&1 && cmake --build /tmp/sk > $OUT/build.log 2>&1
echo "build: exit $? $(( $(date +%s) - s )) s"
T=/tmp/sk/tests/test_gpu
timeout 200 $T --gtest_filter='Forward.*:Built/EveryConfigOddShapes.*:*Determinis*:*Persistent*' > $OUT/test.log 2>&1
echo "tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' $OUT/test.log | tr '\n' ' ')"; grep -E '^\[  FAILED' $OUT/test.log | head
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 $T --gtest_filter='Forward.StreamK*:Built/EveryConfigOddShapes.*q129_k257*' > $OUT/memcheck.log 2>&1
echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/memcheck.log | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 $T --gtest_filter='Forward.StreamK*' > $OUT/racecheck.log 2>&1
echo "racecheck: exit $? $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)' $OUT/racecheck.log | tr '\n' ' ')"
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 1 $T --gtest_filter='Forward.StreamK*' > $OUT/synccheck.log 2>&1
echo "synccheck: exit $? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $OUT/synccheck.log | tr '\n' ' ')"
