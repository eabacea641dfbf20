# Host cost per call of fa::forward with and without the per-call pointer/stream checks
# (check_on_device), both trees built 90-real, alternated.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
for t in with without; do
  mkdir -p /tmp/oh_$t && tar cf - --exclude='./build*' --exclude='./.dev' --exclude='./.git' . | (cd /tmp/oh_$t && tar xf -)
done
sed -i '/    check_on_device(params, device, stream);/d' /tmp/oh_without/src/api/forward.cpp
grep -c check_on_device /tmp/oh_with/src/api/forward.cpp /tmp/oh_without/src/api/forward.cpp
for t in with without; do
  (cd /tmp/oh_$t && cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90-real > /dev/null &&
   cmake --build build --target flash_attention_overhead > /dev/null 2>&1) &
done
wait
for i in 1 2 3; do for t in with without; do echo "== $t $i"; /tmp/oh_$t/build/bin/flash_attention_overhead; done; done
