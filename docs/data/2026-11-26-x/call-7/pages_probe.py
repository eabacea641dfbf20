# Chunked prefill on 16-row pages: is the cost the copies (as many for any page order) or where
# the pages lie (a random order against the identity)? b8 q512 k8192 causal, bf16 d128, 32/8.
import statistics, torch, torch.nn.functional as F
import flash_attention_scratch as fas
torch.manual_seed(0)
b, sq, s, hq, hkv, d = 8, 512, 8192, 32, 8, 128
n = 3
qs = [torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda") for _ in range(n)]
ks = [torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(n)]
vs = [torch.randn(b, s, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(n)]
lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
def paged(k, v, page, order):
    pps = s // page
    table = order.view(b, pps).to(torch.int32)
    kp = torch.empty((b * pps, page, hkv, d), dtype=k.dtype, device="cuda"); vp = torch.empty_like(kp)
    kp[order.long()] = k.reshape(b * pps, page, hkv, d); vp[order.long()] = v.reshape(b * pps, page, hkv, d)
    return kp, vp, table
cases = {"contiguous": [(ks[i], vs[i], None) for i in range(n)]}
for page in (16, 64):
    m = b * s // page
    cases[f"paged {page} random"] = [paged(ks[i], vs[i], page, torch.randperm(m, device="cuda")) for i in range(n)]
    cases[f"paged {page} in order"] = [paged(ks[i], vs[i], page, torch.arange(m, device="cuda")) for i in range(n)]
    # pages of a sequence in order, sequences' blocks interleaved (another engine's allocator)
    cases[f"paged {page} interleaved"] = [paged(ks[i], vs[i], page, torch.arange(m, device="cuda").view(s // page, b).t().reshape(-1).contiguous()) for i in range(n)]
def run(c, i):
    k, v, t = cases[c][i % n]
    if t is None:
        return fas.forward_kvcache(qs[i % n], k, v, cache_seqlens=lens, causal=True)
    return fas.forward_kvcache(qs[i % n], k, v, cache_seqlens=lens, block_table=t, causal=True)
ref = run("contiguous", 0)
for c in cases:
    assert (run(c, 0) - ref).abs().max().item() < 1e-2, c
res = {c: [] for c in cases}
for rnd in range(5):
    for c in (list(cases) if rnd % 2 == 0 else list(reversed(cases))):
        for i in range(5): run(c, i)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(30): run(c, i)
        e1.record(); e1.synchronize()
        res[c].append(e0.elapsed_time(e1) / 30 * 1000)
base = statistics.median(res["contiguous"])
for c, t in res.items():
    m = statistics.median(t)
    print(f"{c:28s} {m:8.1f} us  [{min(t):.1f}-{max(t):.1f}]  {100 * (m / base - 1):+.1f}%")
