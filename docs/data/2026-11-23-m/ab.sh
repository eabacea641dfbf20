# A/B of the CLI's automatic choice: the tree before issue 12 (.dev/before) against this one,
# both built 90-real, benches alternated B A B A A B (bf16 d64/128/256, seq 1024..16384).
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
for t in before after; do
  src=$([ $t = before ] && echo .dev/before || echo .)
  mkdir -p /tmp/ab_$t && (cd $src && tar cf - --exclude='./build*' --exclude='./.dev' --exclude='./.git' . ) | (cd /tmp/ab_$t && tar xf -)
  (cd /tmp/ab_$t && cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90-real -DFLASH_BUILD_TESTS=OFF > /dev/null && cmake --build build > /dev/null 2>&1) &
done
wait
for t in before after; do /tmp/ab_$t/build/bin/flash_attention list --verbose 2>/dev/null | grep sm90 > $OUT/list_$t.txt; done
i=0
for t in before after before after after before; do
  i=$((i+1))
  /tmp/ab_$t/build/bin/flash_attention bench --best --dtype bf16 --d-head 64,128,256 --seq 1024,4096,16384 --runs 40 --format json > $OUT/ab_${i}_$t.json 2>/dev/null
done
python3 scripts/compare_builds.py $OUT/ab_*_after.json -- $OUT/ab_*_before.json | sed 's/default/after/; s/tune/before/'
cat $OUT/list_before.txt $OUT/list_after.txt | awk '{print $NF, $(NF-1), $0}' | cut -c1-160 | sort -k3 | head -20
