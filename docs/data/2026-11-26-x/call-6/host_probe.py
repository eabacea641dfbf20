# Is bench/serving.py's decode through forward_kvcache host-bound? Host time per call (no sync),
# GPU time per call over a long queued loop, and the per-call event method, for forward_kvcache,
# forward() and cuDNN through SDPA. bf16, d 128, batch 16, 32/8 heads, 8192 keys.
import time, statistics, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import flash_attention_scratch as fas
torch.manual_seed(0)
b, hq, hkv, d, s = 16, 32, 8, 128, 8192
n = 4
qs = [torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device="cuda") for _ in range(n)]
ks = [torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(n)]
vs = [torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(n)]
lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
tq = [q.transpose(1, 2) for q in qs]; tk = [k.transpose(1, 2) for k in ks]; tv = [v.transpose(1, 2) for v in vs]
def cudnn(i):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(tq[i % n], tk[i % n], tv[i % n], enable_gqa=True)
fns = {"forward_kvcache": lambda i: fas.forward_kvcache(qs[i % n], ks[i % n], vs[i % n], cache_seqlens=lens),
       "forward": lambda i: fas.forward(qs[i % n], ks[i % n], vs[i % n]),
       "cudnn": cudnn}
for name, fn in fns.items():
    for i in range(20): fn(i)
    torch.cuda.synchronize()
    # host: a short burst the launch queue absorbs
    host = []
    for r in range(5):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for i in range(50): fn(i)
        host.append((time.perf_counter() - t0) / 50 * 1e6)
        torch.cuda.synchronize()
    # GPU throughput: 200 calls between two events
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for r in range(5):
        e0.record()
        for i in range(200): fn(i)
        e1.record(); e1.synchronize(); gpu.append(e0.elapsed_time(e1) / 200 * 1e3)
    print(f"{name:16s} host {statistics.median(host):7.1f} us/call  queued {statistics.median(gpu):7.1f} us/call")
