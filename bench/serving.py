"""Serving shapes (issue 14) on one GPU, in one process: decoding against a contiguous and a
paged KV cache, speculative decoding, chunked prefill and a varlen batch, with cuDNN (PyTorch
SDPA) where it runs the same problem. Times are medians of CUDA-event-timed calls queued
back to back after warm-up, or with --graphs of CUDA graph replays (device time alone: an eager
call whose host path outlasts its kernel times the host); inputs rotate over copies that
together exceed L2 when one copy would fit in it.

    python3 bench/serving.py [--repeat 50] [--graphs] [--out FILE.md]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attention_scratch as fas
from compare import graphed

L2_BYTES = 50 * 2**20
# --graphs: time CUDA graph replays of each batch of calls instead of the eager calls.
GRAPHS = False


def median_ms(fn, repeat, warmup=5, inner=8):
    """Median over `repeat` batches of `inner` calls queued back to back, each call timed
    between its own two CUDA events (as the command line's bench times them), the first
    call of a batch left out: it starts on an idle GPU, so its time would include the host's
    work before the launch, which in a serving loop hides behind the previous step. Returns
    (ms, (max - min) / median) over the per-call times; with GRAPHS, over the replays of a graph
    of `inner` calls, each replay's time over `inner`."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    if GRAPHS:
        try:
            graph = graphed(torch, fn, [(i,) for i in range(inner)], inner)
        except RuntimeError as error:  # a call that cannot be captured: reported, not timed
            print(f"not captured in a CUDA graph: {type(error).__name__}: {str(error).splitlines()[0]}")
            return float("nan"), 0.0
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / inner)
        return statistics.median(times), (max(times) - min(times)) / statistics.median(times)
    for r in range(repeat):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(inner + 1)]
        events[0].record()
        for i in range(inner):
            fn(r * inner + i)
            events[i + 1].record()
        events[-1].synchronize()
        times += [events[i].elapsed_time(events[i + 1]) for i in range(1, inner)]
    return statistics.median(times), (max(times) - min(times)) / statistics.median(times)


def copies_for(bytes_per_copy):
    return 1 if bytes_per_copy > 4 * L2_BYTES else max(2, -(-4 * L2_BYTES // bytes_per_copy))


def paged(k, v, page):
    """(batch, seq, h, d) caches as pages in a random order and their block table."""
    b, s, h, d = k.shape
    pages_per_seq = -(-s // page)
    order = torch.randperm(b * pages_per_seq, device=k.device, dtype=torch.int32)
    table = order.view(b, pages_per_seq)
    kp = torch.empty((b * pages_per_seq, page, h, d), dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    pad = pages_per_seq * page - s
    kf = F.pad(k, (0, 0, 0, 0, 0, pad)).view(b * pages_per_seq, page, h, d)
    vf = F.pad(v, (0, 0, 0, 0, 0, pad)).view(b * pages_per_seq, page, h, d)
    kp[order.long()] = kf
    vp[order.long()] = vf
    return kp, vp, table


def decode_rows(args, rows):
    dtype = torch.bfloat16
    for name, batch, seq_q, seq_k, causal in (("decode", 16, 1, 8192, False),
                                              ("decode", 1, 1, 131072, False),
                                              ("spec decode", 16, 16, 4096, True),
                                              ("chunked prefill", 8, 512, 8192, True)):
        if not name.startswith(args.only):
            continue
        hq, hkv, d = 32, 8, args.d_head
        kv_bytes = 2 * batch * seq_k * hkv * d * 2
        n = copies_for(kv_bytes)
        qs = [torch.randn(batch, seq_q, hq, d, dtype=dtype, device="cuda") for _ in range(n)]
        ks = [torch.randn(batch, seq_k, hkv, d, dtype=dtype, device="cuda") for _ in range(n)]
        vs = [torch.randn(batch, seq_k, hkv, d, dtype=dtype, device="cuda") for _ in range(n)]
        lens = torch.full((batch,), seq_k, dtype=torch.int32, device="cuda")
        flops = 4 * batch * hq * seq_q * seq_k * d / (2 if causal and seq_q == seq_k else 1)
        if causal and seq_q != seq_k:  # bottom-right: row i sees seq_k - seq_q + i + 1 keys
            flops = 4 * batch * hq * d * sum(seq_k - seq_q + i + 1 for i in range(seq_q))

        def report(impl, ms, spread, bytes_read=kv_bytes):
            rows.append((name, f"b{batch} q{seq_q} k{seq_k}{' causal' if causal else ''}", impl,
                         f"{ms * 1e3:.1f}", f"{bytes_read / ms / 1e9:.2f}", f"{flops / ms / 1e9:.1f}",
                         f"{spread:.0%}"))

        ref = fas.forward(qs[0], ks[0], vs[0], causal=causal).float()
        out = fas.forward_kvcache(qs[0], ks[0], vs[0], cache_seqlens=lens, causal=causal)
        err = (out.float() - ref).abs().max().item()
        report("ours, contiguous", *median_ms(
            lambda i: fas.forward_kvcache(qs[i % n], ks[i % n], vs[i % n], cache_seqlens=lens, causal=causal),
            args.repeat))
        rows[-1] = rows[-1][:2] + (rows[-1][2] + f" (max diff vs forward {err:.1e})",) + rows[-1][3:]
        for splits in args.splits:
            report(f"ours, contiguous, {splits} splits", *median_ms(
                lambda i: fas.forward_kvcache(qs[i % n], ks[i % n], vs[i % n], cache_seqlens=lens, causal=causal,
                                              num_splits=splits), args.repeat))
        if args.fp8:
            # The same values as an FP8 (e4m3) cache and queries, descales 1: half the bytes.
            q8, k8, v8 = ([t.to(torch.float8_e4m3fn) for t in ts] for ts in (qs, ks, vs))
            ones = torch.ones(batch, hkv, device="cuda")
            fp8 = dict(q_descale=ones, k_descale=ones, v_descale=ones)
            report("ours, FP8 cache, contiguous", *median_ms(
                lambda i: fas.forward_kvcache(q8[i % n], k8[i % n], v8[i % n], cache_seqlens=lens, causal=causal,
                                              **fp8), args.repeat), bytes_read=kv_bytes / 2)
            pk = [paged(k8[j].view(torch.uint8), v8[j].view(torch.uint8), 16) for j in range(n)]
            report("ours, FP8 cache, paged 16", *median_ms(
                lambda i: fas.forward_kvcache(q8[i % n], pk[i % n][0].view(torch.float8_e4m3fn),
                                              pk[i % n][1].view(torch.float8_e4m3fn), cache_seqlens=lens,
                                              block_table=pk[i % n][2], causal=causal, **fp8),
                args.repeat), bytes_read=kv_bytes / 2)
            q8 = k8 = v8 = pk = None
        for page in (16, 64):
            pk = [paged(ks[j], vs[j], page) for j in range(n)]
            report(f"ours, paged {page}", *median_ms(
                lambda i: fas.forward_kvcache(qs[i % n], pk[i % n][0], pk[i % n][1], cache_seqlens=lens,
                                              block_table=pk[i % n][2], causal=causal), args.repeat))
            pk = None  # frees the pages (a del leaves the lambdas above an undefined name to pyflakes)
        if seq_q == 1:
            report("ours, forward (dense API)", *median_ms(
                lambda i: fas.forward(qs[i % n], ks[i % n], vs[i % n], causal=causal), args.repeat))
            tq = [q.transpose(1, 2) for q in qs]
            tk = [k.transpose(1, 2) for k in ks]
            tv = [v.transpose(1, 2) for v in vs]
            for backend, label in ((SDPBackend.CUDNN_ATTENTION, "cuDNN"), (SDPBackend.FLASH_ATTENTION, "FA2")):
                try:
                    with sdpa_kernel(backend):
                        report(label, *median_ms(lambda i: F.scaled_dot_product_attention(
                            tq[i % n], tk[i % n], tv[i % n], enable_gqa=True), args.repeat))
                except RuntimeError as e:
                    rows.append((name, "", label, "n/a", "", "", str(e).splitlines()[0][:60]))
        else:
            report("ours, forward (dense API)", *median_ms(
                lambda i: fas.forward(qs[i % n], ks[i % n], vs[i % n], causal=causal), args.repeat))
        qs = ks = vs = None  # frees the inputs before the next shape
        torch.cuda.empty_cache()


def varlen_rows(args, rows):
    """64 sequences of random lengths 1-8192, causal, d_head 128, 16 heads, against a uniform
    batch of the same total tokens through forward() and through forward_varlen()."""
    torch.manual_seed(0)
    dtype, h, d = torch.bfloat16, 16, 128
    lens = torch.randint(1, 8193, (64,)).tolist()
    total = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(total, h, d, dtype=dtype, device="cuda")
    k, v = torch.randn_like(q), torch.randn_like(q)
    flops = sum(4 * h * d * n * (n + 1) / 2 for n in lens)
    ms, spread = median_ms(lambda i: fas.forward_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True),
                           args.repeat)
    rows.append(("varlen", f"64 seqs 1-8192 ({total} tokens) causal", "ours, forward_varlen",
                 f"{ms * 1e3:.1f}", "", f"{flops / ms / 1e9:.1f}", f"{spread:.0%}"))
    seq = 4096
    batch = max(1, total // seq)
    qu = torch.randn(batch, seq, h, d, dtype=dtype, device="cuda")
    ku, vu = torch.randn_like(qu), torch.randn_like(qu)
    uflops = 4 * batch * h * d * seq * seq / 2
    ms, spread = median_ms(lambda i: fas.forward(qu, ku, vu, causal=True), args.repeat)
    rows.append(("varlen", f"uniform b{batch} x {seq} causal", "ours, forward (dense)",
                 f"{ms * 1e3:.1f}", "", f"{uflops / ms / 1e9:.1f}", f"{spread:.0%}"))
    cu_u = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device="cuda")
    qp, kp, vp = (t.reshape(batch * seq, h, d) for t in (qu, ku, vu))
    ms, spread = median_ms(lambda i: fas.forward_varlen(qp, kp, vp, cu_u, cu_u, seq, seq, causal=True),
                           args.repeat)
    rows.append(("varlen", f"uniform b{batch} x {seq} causal", "ours, forward_varlen",
                 f"{ms * 1e3:.1f}", "", f"{uflops / ms / 1e9:.1f}", f"{spread:.0%}"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default=None)
    parser.add_argument("--splits", default="", help="also time these split counts (comma-separated)")
    parser.add_argument("--only", default="", help="run only the shapes whose name starts with this")
    parser.add_argument("--fp8", action="store_true", help="also an FP8 (e4m3) cache of the same values")
    parser.add_argument("--d-head", type=int, default=128, choices=[64, 128, 256],
                        help="the decoding shapes' head dim (the varlen rows keep 128)")
    parser.add_argument("--graphs", action="store_true",
                        help="time CUDA graph replays (device time alone) instead of eager calls")
    args = parser.parse_args()
    global GRAPHS
    GRAPHS = args.graphs
    args.splits = [int(x) for x in args.splits.split(",") if x]
    rows = []
    decode_rows(args, rows)
    if not args.only:
        varlen_rows(args, rows)
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, heads 32/8 (varlen 16/16), "
             f"d_head {args.d_head} (varlen 128); "
             f"median of {args.repeat}{' CUDA graph replays' if args.graphs else ''}",
             "",
             "| shape | problem | implementation | µs | K/V TB/s | TFLOP/s | spread |",
             "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
