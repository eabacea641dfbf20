"""This library against cuDNN, FlashAttention-4 and FlashAttention-2, in one process, on the same inputs.

The grid of targets-h200.md: bf16 and fp16, d_head 64/128/256, causal and not, seq 512 to 16384 at 16k
tokens (batch = 16384/seq) and hidden 2048 (heads = 2048/d_head); then model-shaped rows (GQA prefill,
32k causal, chunked prefill, decode, speculative decode, short keys). Peers: cuDNN and FlashAttention-2
through PyTorch SDPA (each backend forced), FlashAttention-4 (`flash_attn.cute`, its sm90 path) when it
imports. Ours is flash_attention_scratch.forward, the automatic choice of the installed package.

Timing: every (shape, implementation) is warmed up, then timed in rounds; each round takes the
implementations in a new random order and times a batch of calls queued back to back, each between its
own pair of CUDA events; inputs rotate among copies that together exceed L2; the result is the median.
The GPU runs at its power cap under this load, so only ratios measured in one run hold.

    python3 bench/compare.py --out /tmp/grid            # writes /tmp/grid.md and /tmp/grid.png
    python3 bench/compare.py --replot /tmp/grid.md --out docs/grid   # the plot again, no GPU needed
    python3 bench/compare.py --variants --out /tmp/variants   # backward of the attention variants (VARIANT_ROWS)

--variants times the backward (as --backward does) of ours and FlashAttention-4 with and without a variant, base
and variant interleaved in the same rounds: a sliding window's speed-up over full causal attention and the softcap's
relative cost, each against FA4's; it skips the grid and the model rows.
"""

import argparse
import itertools
import datetime
import math
import random
import statistics
import sys
from pathlib import Path

L2_BYTES = 60 * 2**20  # the H200's L2 (H100: 50 MiB); a bound, so the larger
SEQS = [512, 1024, 2048, 4096, 8192, 16384]
PEERS = ["cuDNN", "FA4", "FA2"]
BAR = 1.02  # ours / max(cuDNN, FA4), targets-h200.md

# name, batch, heads_q, heads_kv, d_head, seq_q, seq_k, causal, and optionally the rows of a page: then K and V are
# a paged cache of that page size, each sequence's pages in a shuffled order (ours: forward_kvcache with a
# block_table; FA4: flash_attn_varlen_func with a page_table; SDPA takes no pages). d_head a (Q/K, V) pair where
# V's head dim differs (DeepSeek's MLA: 192 and 128, 128 heads).
MODEL_ROWS = [
    ("llama3-8b prefill 8k", 1, 32, 8, 128, 8192, 8192, True),
    ("llama-70b prefill 2k x4", 4, 64, 8, 128, 2048, 2048, True),
    ("long 32k causal", 1, 32, 8, 128, 32768, 32768, True),
    ("chunked prefill 512/8k", 8, 32, 8, 128, 512, 8192, True),
    ("decode q=1 k=8k", 16, 32, 8, 128, 1, 8192, True),
    ("spec-decode q=16 k=4k", 16, 32, 8, 128, 16, 4096, True),
    ("spec-decode q=16 k=4k, 16-row pages", 16, 32, 8, 128, 16, 4096, True, 16),
    ("odd 4000", 2, 16, 16, 128, 4000, 4000, False),
    ("vit/dit d64 H24", 1, 24, 24, 64, 4096, 4096, False),
    ("cross-attn k=77", 2, 16, 16, 64, 4096, 77, False),
    ("MLA prefill 192/128 4k", 1, 128, 128, (192, 128), 4096, 4096, True),
    ("d192 prefill 8k", 1, 16, 16, 192, 8192, 8192, True),
]

# The backward's model-shaped rows (targets-h200.md): GQA prefill, 32 query heads on 8 K/V heads.
BACKWARD_MODEL_ROWS = [
    ("GQA 32/8 causal 8k", 1, 32, 8, 128, 8192, 8192, True),
    ("GQA 32/8 causal 8k, fp16", 1, 32, 8, 128, 8192, 8192, True),
    ("MLA 192/128 causal 4k", 1, 128, 128, (192, 128), 4096, 4096, True),
]


# The backward's attention variants (--variants): name, (dtype, batch, heads_q, heads_kv, d_head, seq),
# (base kwargs, variant kwargs) for both ours and FA4, and what is compared: "speed-up" (base time / variant
# time, the bar: ours' >= FA4's) or "cost" (variant time / base time - 1, the bar: ours' <= FA4's).
VARIANT_ROWS = [
    ("causal, window (4095, 0) vs full", ("bfloat16", 1, 32, 8, 128, 32768),
     ({"causal": True}, {"causal": True, "window_size": (4095, 0)}), "speed-up"),
    ("causal, softcap 50 vs none", ("bfloat16", 1, 16, 16, 128, 16384),
     ({"causal": True}, {"causal": True, "softcap": 50.0}), "cost"),
    ("non-causal, softcap 50 vs none", ("bfloat16", 1, 16, 16, 128, 16384),
     ({"causal": False}, {"causal": False, "softcap": 50.0}), "cost"),
]


def implementations(torch, fa, causal, fa4_func):
    """name -> fn(q, k, v) for (batch, seq, heads, d_head) tensors. Causal masks align at the
    bottom right (flash_attn's convention) for every implementation; SDPA's is_causal aligns at
    the top left, so SDPA runs only where the two agree (seq_q == seq_k) or there is no mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                    enable_gqa=q.shape[2] != k.shape[2])
        return run

    impls = {"ours": lambda q, k, v: fa.forward(q, k, v, causal=causal),
             "cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
             "FA2": sdpa(SDPBackend.FLASH_ATTENTION)}
    if fa4_func is not None:
        impls["FA4"] = lambda q, k, v: fa4_func(q, k, v, causal=causal)
    return impls


def paged_implementations(torch, fa, causal, page, batch, seq_k):
    """name -> fn(q, k, v) that reads k and v (batch, seq_k, heads_kv, d) as a paged cache of `page` rows a page,
    sequence b's pages in a shuffled order (seed 0): ours and FA4 (SDPA takes no pages)."""
    pages = seq_k // page
    table = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(0)).view(batch, pages)
    table = table.to(device="cuda", dtype=torch.int32)
    seqused = torch.full((batch,), seq_k, dtype=torch.int32, device="cuda")

    def paged(t):
        return t.view(batch * pages, page, *t.shape[2:])

    impls = {"ours": lambda q, k, v: fa.forward_kvcache(q, paged(k), paged(v), cache_seqlens=seqused,
                                                        block_table=table, causal=causal)}
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError:
        return impls

    def fa4_paged(q, k, v):
        out = flash_attn_varlen_func(q, paged(k), paged(v), seqused_k=seqused, page_table=table, causal=causal)
        return out[0] if isinstance(out, tuple) else out
    impls["FA4"] = fa4_paged
    return impls


def backward_implementations(torch, fa, causal, fa4_func, **variant):
    """name -> fn(q, k, v) that times one backward pass: each builds its forward graph once
    (on the first call with these tensors) and then runs the backward alone, as the peers'
    harness does (out.backward(dout), graph retained). variant: window_size= and softcap= for
    ours and FA4; SDPA takes neither, so with a variant cuDNN and FA2 are left out."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    graphs = {}

    def autograd(name, forward):
        def run(q, k, v):
            key = (name, q.data_ptr())
            if key not in graphs:
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                out = forward(qq, kk, vv)
                graphs[key] = (out, (qq, kk, vv), torch.randn_like(out))
            out, inputs, dout = graphs[key]
            return torch.autograd.grad(out, inputs, dout, retain_graph=True)
        return run

    def sdpa(backend):
        def forward(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                    enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)
        return forward

    impls = {"ours": autograd("ours", lambda q, k, v: fa.forward(q, k, v, causal=causal, **variant)),
             # Deterministic mode (bitwise-identical gradients): timed beside, not in the ratio.
             "ours-det": autograd("ours-det", lambda q, k, v: fa.forward(q, k, v, causal=causal,
                                                                          deterministic=True, **variant))}
    if not variant:
        impls.update({"cuDNN": autograd("cuDNN", sdpa(SDPBackend.CUDNN_ATTENTION)),
                      "FA2": autograd("FA2", sdpa(SDPBackend.FLASH_ATTENTION))})
    if fa4_func is not None:
        impls["FA4"] = autograd("FA4", lambda q, k, v: fa4_func(q, k, v, causal=causal, **variant))
    return impls


def graphed(torch, fn, inputs, calls):
    """A CUDA graph of `calls` calls of fn over the rotated inputs (captured after a call on a side stream, as
    PyTorch's capture asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*inputs[0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    return graph


def time_shape(torch, impls, make_inputs, flop, args):
    """TFLOP/s (median) per implementation, None where it raised on this shape."""
    inputs = make_inputs()
    dead = set()
    for name, fn in impls.items():
        try:
            # Every input copy at least once: the backward's implementations build a copy's forward
            # graph on its first call, which must not fall in a timed one.
            for i in range(max(args.warmup, len(inputs))):
                fn(*inputs[i % len(inputs)])
            torch.cuda.synchronize()
        except (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError):
            dead.add(name)
            torch.cuda.synchronize()
    graphs = {}
    if args.graphs:
        for name in [n for n in impls if n not in dead]:
            try:
                graphs[name] = graphed(torch, impls[name], inputs, args.calls)
            except Exception as error:  # noqa: BLE001 (a peer's own exception types: does not capture)
                print(f"{name}: not captured in a CUDA graph: {type(error).__name__}: "
                      f"{(str(error).splitlines() or [''])[0]}", file=sys.stderr)
                dead.add(name)
                torch.cuda.synchronize()
    times = {name: [] for name in impls if name not in dead}
    shuffle = random.Random(0).shuffle
    slot = 0
    for _ in range(args.rounds):
        names = list(times)
        shuffle(names)
        for name in names:
            if args.graphs:
                # One replay of `calls` calls between two events: device time alone, a call's share.
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graphs[name].replay()
                stop.record()
                stop.synchronize()
                times[name].append(start.elapsed_time(stop) / args.calls)
                continue
            fn = impls[name]
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(args.calls)]
            for start, stop in events:
                q, k, v = inputs[slot % len(inputs)]
                slot += 1
                start.record()
                fn(q, k, v)
                stop.record()
            events[-1][1].synchronize()
            times[name] += [start.elapsed_time(stop) for start, stop in events]
    return {name: (flop / (statistics.median(times[name]) * 1e-3) / 1e12 if name in times else None)
            for name in impls}


def head_dims(d):
    """(Q/K head dim, V head dim) of a row's d_head: an int, or a pair where V's differs."""
    return d if isinstance(d, tuple) else (d, d)


def inputs_for(torch, dtype, batch, heads, heads_kv, d, seq_q, seq_k):
    d, d_v = head_dims(d)

    def make():
        per_copy = 2 * (d + d_v) * (batch * seq_q * heads + batch * seq_k * heads_kv)
        copies = max(3, math.ceil(2 * L2_BYTES / per_copy))
        return [(torch.randn(batch, seq_q, heads, d, dtype=dtype, device="cuda"),
                 torch.randn(batch, seq_k, heads_kv, d, dtype=dtype, device="cuda"),
                 torch.randn(batch, seq_k, heads_kv, d_v, dtype=dtype, device="cuda")) for _ in range(copies)]
    return make


def attention_flop(batch, heads, d, seq_q, seq_k, causal):
    """2·B·H·Sq·Sk·(d + d_v) (4·B·H·Sq·Sk·d where V's head dim is Q's), and for causal the (query,
    key) pairs a bottom-right mask keeps."""
    d, d_v = head_dims(d)
    if not causal:
        return 2 * batch * heads * seq_q * seq_k * (d + d_v)
    pairs = sum(min(seq_k, max(0, seq_k - seq_q + i + 1)) for i in range(seq_q)) if seq_q != seq_k \
        else seq_q * seq_k / 2
    return 2 * batch * heads * pairs * (d + d_v)


def ratio(rates):
    best = max((rates.get(p) or 0) for p in ("cuDNN", "FA4"))
    return rates["ours"] / best if rates.get("ours") and best else None


def fmt(x, digits=0):
    return "–" if x is None else f"{x:.{digits}f}"


def grid_table(rows):
    det = any("ours-det" in r[4] for r in rows)  # the backward's deterministic mode
    names = ["ours", *(["ours-det"] if det else []), *PEERS]
    lines = ["| dtype | d | causal | seq | " + " | ".join(names) + " | ours / max(cuDNN, FA4) |",
             "|---|---|---|---|" + "---|" * len(names) + "---|"]
    for dtype, d, causal, seq, rates in rows:
        r = ratio(rates)
        mark = "**" if r is not None and r < BAR else ""
        lines.append(f"| {dtype} | {d} | {'yes' if causal else 'no'} | {seq} | " +
                     " | ".join(fmt(rates.get(n)) for n in names) + f" | {mark}{fmt(r, 3)}{mark} |")
    return lines


def ratio_table(rows):
    """The grid in one table: ours / max(cuDNN, FA4) per sequence length, and our TFLOP/s at the
    longest (the README's table)."""
    seqs = sorted({r[3] for r in rows})
    lines = ["| dtype | d_head | causal | " + " | ".join(f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs) +
             f" | ours at {seqs[-1] // 1024}k, TFLOP/s |", "|---|---|---|" + "---|" * (len(seqs) + 1)]
    for key in sorted({r[:3] for r in rows}, key=lambda k: (k[0], k[1], k[2])):
        cells = {r[3]: r[4] for r in rows if r[:3] == key}
        text = []
        for s in seqs:
            r = ratio(cells[s]) if s in cells else None
            text.append(f"**{fmt(r, 3)}**" if r is not None and r < BAR else fmt(r, 3))
        longest = cells.get(seqs[-1], {}).get("ours")
        lines.append(f"| {key[0]} | {key[1]} | {'yes' if key[2] else 'no'} | " + " | ".join(text) +
                     f" | {fmt(longest)} |")
    return lines


def model_table(rows):
    det = any("ours-det" in r[1] for r in rows)
    names = ["ours", *(["ours-det"] if det else []), *PEERS]
    lines = ["| shape | " + " | ".join(names) + " | ours / best peer |", "|---|" + "---|" * (len(names) + 1)]
    for name, rates in rows:
        best = max((rates.get(p) or 0) for p in PEERS)
        r = rates["ours"] / best if rates.get("ours") and best else None
        lines.append(f"| {name} | " + " | ".join(fmt(rates.get(n), 1) for n in names) + f" | {fmt(r, 3)} |")
    return lines


def plot(rows, title, path):
    """TFLOP/s against sequence length, one panel per (d_head, causal) for each dtype."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dtypes = sorted({r[0] for r in rows})
    panels = sorted({(r[1], r[2]) for r in rows})
    fig, axes = plt.subplots(len(dtypes), len(panels), figsize=(3.2 * len(panels), 3.0 * len(dtypes)),
                             squeeze=False)
    top = 1.08 * max(v for r in rows for v in r[4].values() if v)
    seqs = sorted({r[3] for r in rows})
    colors = {"ours": "#1f77b4", "cuDNN": "#2ca02c", "FA4": "#d62728", "FA2": "#ff7f0e"}
    for i, dtype in enumerate(dtypes):
        for j, (d, causal) in enumerate(panels):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r[0] == dtype and r[1] == d and r[2] == causal), key=lambda r: r[3])
            for name in ["ours", *PEERS]:
                pts = [(r[3], r[4][name]) for r in sel if r[4].get(name)]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=name, color=colors[name],
                            lw=2 if name == "ours" else 1)
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqs, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs], fontsize=7)
            ax.set_ylim(0, top)
            ax.set_title(f"{dtype} d{d} {'causal' if causal else 'non-causal'}", fontsize=9)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == len(dtypes) - 1:
                ax.set_xlabel("sequence length")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def rows_from_markdown(path):
    rows, title, names = [], "", ["ours", *PEERS]
    for line in Path(path).read_text().splitlines():
        if line.startswith("Measured "):
            title = line.split(". Command")[0]
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if cells[:4] == ["dtype", "d", "causal", "seq"]:  # the grid table's header names its columns
            names = cells[4:-1]
        elif len(cells) == len(names) + 5 and cells[1].isdigit():
            rate = lambda c: None if c == "–" else float(c)
            rows.append((cells[0], int(cells[1]), cells[2] == "yes", int(cells[3]),
                         dict(zip(names, map(rate, cells[4:-1])))))
    return rows, title


def fa4():
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError as error:
        print(f"FlashAttention-4 not importable ({error}): its column stays empty", file=sys.stderr)
        return None

    def run(q, k, v, causal, window_size=(-1, -1), softcap=0.0):
        # flash_attn.cute marks an unbounded window side None where flash_attn (and ours) take -1
        window_size = tuple(None if side is None or side < 0 else side for side in window_size)
        return flash_attn_func(q, k, v, causal=causal, window_size=window_size, softcap=softcap)[0]
    return run


def reporting(name, fn):
    """fn, with whatever it raises (FA4's compiler has its own exception types) re-raised as a
    RuntimeError, which time_shape takes as 'does not run this shape', and its first line printed."""
    def run(q, k, v):
        try:
            return fn(q, k, v)
        except Exception as error:
            print(f"{name}: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}", file=sys.stderr)
            raise RuntimeError(f"{name}: {error}") from error
    return run


def variant_measure(kind, base, variant):
    """The speed-up base / variant, or the relative cost variant / base - 1 (times in ms)."""
    if not base or not variant:
        return None
    return base / variant if kind == "speed-up" else variant / base - 1


def variant_rows(torch, fa, fa4_func, args):
    """Per VARIANT_ROWS entry: (name, shape, kind, {implementation: (base ms, variant ms)}), None where
    it raised. Base and variant of ours and FA4 are four implementations of one time_shape call, so
    they share its inputs and its shuffled rounds."""
    rows = []
    for name, (dtype_name, batch, heads, heads_kv, d, seq), (base, variant), kind in VARIANT_ROWS:
        impls = {}
        for suffix, kwargs in (("", base), (" variant", variant)):
            made = backward_implementations(torch, fa, fa4_func=fa4_func, **kwargs)
            impls.update({n + suffix: reporting(n + suffix, made[n]) for n in ("ours", "FA4") if n in made})
        # time_shape gives flop / median time in TFLOP/s: with 1e9 FLOP that is 1 / (median ms)
        rates = time_shape(torch, impls, inputs_for(torch, getattr(torch, dtype_name), batch, heads, heads_kv, d,
                                                    seq, seq), 1e9, args)
        ms = {n: 1 / r if r else None for n, r in rates.items()}
        times = {n: (ms.get(n), ms.get(n + " variant")) for n in ("ours", "FA4")}
        shape = (f"{dtype_name.replace('bfloat', 'bf').replace('float', 'fp')}, batch {batch}, heads {heads}/"
                 f"{heads_kv}, d {d}, seq {seq}")
        rows.append((name, shape, kind, times))
        print(name, {n: (fmt(a, 2), fmt(b, 2)) for n, (a, b) in times.items()}, kind,
              {n: fmt(variant_measure(kind, *t), 3) for n, t in times.items()}, flush=True)
    return rows


def varlen_row(torch, fa, args, sequences=64, longest=8192, heads=16, d=128):
    """Ours' backward on a packed batch of `sequences` causal sequences of random lengths 1 to
    `longest` (seed 0) against a uniform batch of as many sequences of their mean length, in the
    same shuffled rounds: (lengths' total, mean, {name: TFLOP/s}), each at its own FLOPs (the
    backward's 2.5x the forward's causal pairs)."""
    lengths = random.Random(0).choices(range(1, longest + 1), k=sequences)
    mean = round(sum(lengths) / sequences)
    total = max(sum(lengths), sequences * mean)
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device="cuda")
    graphs = {}

    def backward(name, forward):
        def run(q, k, v):
            key = (name, q.data_ptr())
            if key not in graphs:
                qq, kk, vv = (t.detach().requires_grad_() for t in forward.views(q, k, v))
                out = forward(qq, kk, vv)
                graphs[key] = (out, (qq, kk, vv), torch.randn_like(out))
            out, inputs, dout = graphs[key]
            return torch.autograd.grad(out, inputs, dout, retain_graph=True)
        return run

    class Packed:
        @staticmethod
        def views(q, k, v):
            return (t[0, :sum(lengths)] for t in (q, k, v))

        def __call__(self, q, k, v):
            return fa.forward_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)

    class Uniform:
        @staticmethod
        def views(q, k, v):
            return (t[0, :sequences * mean].view(sequences, mean, *t.shape[2:]) for t in (q, k, v))

        def __call__(self, q, k, v):
            return fa.forward(q, k, v, causal=True)

    impls = {"packed": backward("packed", Packed()), "uniform": backward("uniform", Uniform())}
    rates = time_shape(torch, impls, inputs_for(torch, torch.bfloat16, 1, heads, heads, d, total, total), 1e9, args)
    flop = {"packed": sum(2.5 * attention_flop(1, heads, d, n, n, True) for n in lengths),
            "uniform": 2.5 * attention_flop(sequences, heads, d, mean, mean, True)}
    # time_shape's rate at 1e9 FLOP is 1 / (median ms): each side's TFLOP/s at its own FLOPs
    tflops = {n: (flop[n] * r / 1e9 if r else None) for n, r in rates.items()}
    print("varlen", {n: fmt(x, 1) for n, x in tflops.items()}, flush=True)
    return sum(lengths), mean, tflops


def variant_table(rows):
    lines = ["| variant | shape | ours base, ms | ours variant, ms | FA4 base, ms | FA4 variant, ms | ours | FA4 | "
             "against FA4 |",
             "|---|---|" + "---|" * 7]
    for name, shape, kind, times in rows:
        ours, peer = (variant_measure(kind, *times[n]) for n in ("ours", "FA4"))
        if kind == "speed-up":
            show = lambda x: "–" if x is None else f"{x:.2f}× faster"
            against = None if ours is None or peer is None else ours / peer
            missed = against is not None and against < 1
            against = "–" if against is None else f"ours / FA4 {against:.3f}"
        else:
            show = lambda x: "–" if x is None else f"{100 * x:+.1f}%"
            against = None if ours is None or peer is None else ours - peer
            missed = against is not None and against > 0
            against = "–" if against is None else f"ours − FA4 {100 * against:+.1f} pp"
        mark = "**" if missed else ""
        lines.append(f"| {name} | {shape} | " + " | ".join(fmt(t, 2) for n in ("ours", "FA4") for t in times[n]) +
                     f" | {show(ours)} | {show(peer)} | {mark}{against}{mark} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=SEQS)
    parser.add_argument("--d-heads", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--models", action=argparse.BooleanOptionalAction, default=True,
                        help="the model-shaped rows after the grid")
    parser.add_argument("--backward", action="store_true",
                        help="time the backward pass (dQ, dK, dV) instead; FLOPs 2.5x the forward's")
    parser.add_argument("--variants", action="store_true",
                        help="time the backward of the attention variants (VARIANT_ROWS: sliding window, softcap) "
                             "for ours and FA4 instead of the grid and the model rows")
    parser.add_argument("--warmup", type=int, default=10, help="calls per implementation before timing")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=5, help="calls timed per implementation and round")
    parser.add_argument("--graphs", action="store_true",
                        help="time each implementation's calls of a round as one CUDA graph replay (device time, no "
                             "host cost: for rows whose kernels run in tens of µs, where eager calls measure the host)")
    parser.add_argument("--out", help="writes OUT.md and OUT.png (default grid, or variants with --variants)")
    parser.add_argument("--replot", metavar="MD", help="draw OUT.png again from a table this script wrote")
    args = parser.parse_args()
    if args.graphs and (args.backward or args.variants):
        # autograd launches the backward on the forward's stream, which a capture does not take
        parser.error("--graphs: expected the forward pass alone, got --backward or --variants")
    args.out = args.out or ("variants" if args.variants else "grid")
    if args.replot:
        rows, title = rows_from_markdown(args.replot)
        plot(rows, title, Path(args.out + ".png"))
        return

    import torch
    import flash_attention_scratch as fa
    fa4_func = fa4()
    device = torch.cuda.get_device_name()
    title = (f"Measured {datetime.date.today()} on {device}, torch {torch.__version__}, "
             f"flash_attention_scratch {fa.__version__}")
    if args.variants:
        lines = ["# Backward of the attention variants: this library against FlashAttention-4", "",
                 f"{title}. Command: `python3 bench/compare.py {' '.join(sys.argv[1:])}`. Times in ms of the "
                 f"backward pass alone (dQ, dK, dV; forward graph built once, as --backward), median of "
                 f"{args.rounds} shuffled rounds of {args.calls} calls, base and variant interleaved; inputs "
                 "rotated past L2. Speed-up: base / variant time (bar: ours' >= FA4's); cost: variant / base "
                 "time - 1 (bar: ours' <= FA4's); bars missed in bold; –: the implementation does not run it.", ""]
        lines += variant_table(variant_rows(torch, fa, fa4_func, args))
        total, mean, tflops = varlen_row(torch, fa, args)
        packed, uniform = tflops.get("packed"), tflops.get("uniform")
        lines += ["", "Packed sequences (forward_varlen's backward; bar: 0.9 of a uniform batch's TFLOP/s): 64 causal "
                  f"sequences of random lengths 1-8192 ({total} tokens), bf16, 16 heads, d 128, against 64 of "
                  f"{mean}.", "", "| packed, TFLOP/s | uniform, TFLOP/s | packed / uniform |", "|---|---|---|",
                  f"| {fmt(packed)} | {fmt(uniform)} | "
                  f"{fmt(packed / uniform if packed and uniform else None, 3)} |"]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines[4:]))
        return
    dtypes = {"bfloat16": "bf16", "float16": "fp16"}
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for d in args.d_heads:
            for causal in causals:
                make = backward_implementations if args.backward else implementations
                impls = make(torch, fa, causal, fa4_func)
                for seq in args.seqs:
                    batch, heads = max(1, 16384 // seq), 2048 // d
                    flop = attention_flop(batch, heads, d, seq, seq, causal) * (2.5 if args.backward else 1)
                    rates = time_shape(torch, impls, inputs_for(torch, dtype, batch, heads, heads, d, seq, seq),
                                       flop, args)
                    rows.append((dtypes[dtype_name], d, causal, seq, rates))
                    print(*rows[-1][:4], {k: fmt(v) for k, v in rates.items()}, fmt(ratio(rates), 3), flush=True)
    model_rows = []
    if args.models:
        for name, batch, heads, heads_kv, d, seq_q, seq_k, causal, *page in (
                BACKWARD_MODEL_ROWS if args.backward else MODEL_ROWS):
            if page:
                impls = {n: reporting(n, f) for n, f in
                         paged_implementations(torch, fa, causal, page[0], batch, seq_k).items()}
            else:
                impls = (backward_implementations if args.backward else implementations)(torch, fa, causal,
                                                                                           fa4_func)
            dtype = torch.float16 if name.endswith("fp16") else torch.bfloat16
            if causal and seq_q != seq_k:  # SDPA's is_causal aligns at the top left
                impls = {n: f for n, f in impls.items() if n not in ("cuDNN", "FA2")}
            rates = time_shape(torch, impls, inputs_for(torch, dtype, batch, heads, heads_kv, d, seq_q, seq_k),
                               attention_flop(batch, heads, d, seq_q, seq_k, causal) * (2.5 if args.backward else 1),
                               args)
            model_rows.append((name, rates))
            print(name, {k: fmt(v, 1) for k, v in rates.items()}, flush=True)

    met = [r for r in (ratio(x[4]) for x in rows) if r is not None]
    lines = [f"# {'Backward' if args.backward else 'Forward'}: this library against cuDNN, FlashAttention-4 and "
             "FlashAttention-2", "",
             f"{title}. Command: `python3 bench/compare.py {' '.join(sys.argv[1:])}`. TFLOP/s = "
             f"{'2.5 × ' if args.backward else ''}4·batch·heads·seq_q·seq_k·d_head / median time, causal "
             f"counting the pairs the mask keeps; "
             f"{args.rounds} shuffled rounds of {args.calls} calls"
             f"{' (each round one CUDA graph replay: device time)' if args.graphs else ''}; inputs rotated past L2. "
             f"Cells below {BAR} in bold; –: the implementation does not run the shape.", "",
             f"Ahead of both peers in {sum(r > 1 for r in met)} of {len(met)} cells, at {BAR} or more in "
             f"{sum(r >= BAR for r in met)}.", ""]
    lines += ratio_table(rows) + [""] if rows else []
    lines += grid_table(rows)
    if model_rows:
        lines += ["", "Model-shaped rows (bf16 unless named; causal with seq_q != seq_k aligns at the bottom right, which "
                  "SDPA's is_causal does not do, so cuDNN and FA2 sit those out):", ""]
        lines += model_table(model_rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    if rows:
        plot(rows, title, Path(args.out + ".png"))
    print("\n".join(lines[4:5]))


if __name__ == "__main__":
    main()
