# cuDNN SDPA (bf16) in a loop over rotated inputs for `seconds`, for clock and power sampling beside it.
# Usage: cudnn_loop.py SEQ D_HEAD SECONDS [causal]
import sys, time, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
seq, d, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
causal = len(sys.argv) > 4 and sys.argv[4] == "causal"
b, h = 16384 // seq, 2048 // d
xs = [tuple(torch.randn(b, h, seq, d, dtype=torch.bfloat16, device="cuda") for _ in range(3)) for _ in range(8)]
f = torch.nn.functional.scaled_dot_product_attention
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for i in range(50):
        f(*xs[i % 8], is_causal=causal)
    torch.cuda.synchronize()
    t0 = time.time(); n = 0
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(20):
            f(*xs[n % 8], is_causal=causal); n += 1
        torch.cuda.synchronize()
    stop.record(); torch.cuda.synchronize()
    t1 = time.time()
ms = start.elapsed_time(stop) / n
flops = 4 * b * h * seq * seq * d / (2 if causal else 1)
print(f"cudnn seq {seq} d {d} causal {causal}: {n} calls, {ms*1e3:.1f} us each, {flops/ms/1e9:.1f} TFLOP/s; window {t0:.3f} {t1:.3f}")
