# cuDNN SDPA (bf16, non-causal) in a loop over rotated inputs, for power sampling.
import sys, time, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
seq, d, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
b, h = 16384 // seq, 2048 // d
xs = [tuple(torch.randn(b, h, seq, d, dtype=torch.bfloat16, device="cuda") for _ in range(3)) for _ in range(8)]
f = torch.nn.functional.scaled_dot_product_attention
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for i in range(50): f(*xs[i % 8])
    torch.cuda.synchronize()
    t0 = time.time(); n = 0
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(20):
            f(*xs[n % 8]); n += 1
        torch.cuda.synchronize()
    stop.record(); torch.cuda.synchronize()
    t1 = time.time()
ms = start.elapsed_time(stop) / n
print(f"cudnn seq {seq} d {d}: {n} calls, {ms*1e3:.1f} us each, {4*b*h*seq*seq*d/ms/1e9:.1f} TFLOP/s; window {t0:.3f} {t1:.3f}")
