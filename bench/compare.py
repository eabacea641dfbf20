"""This project against PyTorch's attention backends, in one process, on the same inputs.

For every (dtype, d_head, seq) of the grid (16k tokens, hidden 2048, as in the
FlashAttention benchmarks) times flash_attention_scratch.forward (the automatic choice, which
reads the tuning cache) and torch's scaled_dot_product_attention with one backend forced
at a time: FlashAttention-2, cuDNN, memory-efficient. CUDA events, warm-up, median of
the timed runs (queued back to back, each between its own pair of events), interleaved
across implementations in rounds so clock drift falls on all alike, inputs rotated among
copies so L2 cannot hold them.

Writes a markdown table (TFLOP/s and our ratio to each peer) and a PNG plot, and the
host overhead of a call (C++ API, direct binding, torch custom op) on a tiny shape.

    python3 bench/compare.py --out docs/compare
"""

import argparse
import random
import sys
import datetime
import statistics
import time
from pathlib import Path

try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flash_attention_scratch as fa
    from flash_attention_scratch import _C

    PEERS = {
        "FA2": SDPBackend.FLASH_ATTENTION,
        "cuDNN": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
except ImportError:  # --replot needs neither PyTorch nor a GPU
    PEERS = {"FA2": None, "cuDNN": None, "efficient": None}
L2_BYTES = 50 * 2**20


def sdpa(backend, causal=False):
    def run(q, k, v):
        with sdpa_kernel(backend):
            # SDPA wants (batch, heads, seq, d): transposed views of the same storage.
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return run


def time_interleaved(impls, inputs, warmup, runs, rounds, order="fixed"):
    """Median, min and max ms per implementation; None where it raised. order "shuffled":
    each round takes the implementations in a new random order (as the peers' harness does),
    so none always follows the same neighbour's power state."""
    times = {name: [] for name in impls}
    shuffle = random.Random(0).shuffle
    dead = {}
    slot = 0
    for name, fn in impls.items():
        try:
            for i in range(warmup):
                fn(*inputs[i % len(inputs)])
            torch.cuda.synchronize()
        except (RuntimeError, ValueError, TypeError) as error:  # shape not supported
            dead[name] = str(error).splitlines()[0]
    for r in range(rounds):
        names = list(impls)
        if order == "shuffled":
            shuffle(names)
        for name in names:
            fn = impls[name]
            if name in dead:
                continue
            # Queued back to back between event pairs, synchronised once per batch: the
            # host's per-call overhead (tens of µs for PyTorch's dispatcher) overlaps the
            # previous kernel instead of being timed as GPU idle.
            n = runs // rounds
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for start, stop in events:
                q, k, v = inputs[slot % len(inputs)]
                slot += 1
                start.record()
                fn(q, k, v)
                stop.record()
            events[-1][1].synchronize()
            times[name] += [start.elapsed_time(stop) for start, stop in events]
    return {name: (None if name in dead else (statistics.median(t), min(t), max(t))) for name, t in times.items()}, dead


def overhead(dtype):
    """Host microseconds per call on a tiny problem. Batches of 200 calls, synchronised in
    between, so the launch queue never fills (a full queue would time the GPU instead)."""
    c = next(c for c in fa.configs() if c.dtype == dtype)
    shape = (1, max(c.B_r, c.B_c), 1, c.d_head)
    t = {fa.DType.FP16: torch.float16, fa.DType.BF16: torch.bfloat16}[dtype]
    q, k, v, out = (torch.randn(shape, dtype=t, device="cuda") for _ in range(4))
    stream = torch.cuda.current_stream().cuda_stream
    batch = 200

    def per_call(fn):
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(20):
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            best = min(best, (time.perf_counter() - start) / batch)
            torch.cuda.synchronize()
        return 1e6 * best

    # The C++ API's own cost: build/bin/flash_attention_overhead (bench/overhead.cpp).
    results = {
        "direct binding, _C.forward (automatic choice)": per_call(lambda: _C.forward(q, k, v, out, None, None, stream)),
        "flash_attention_scratch.forward(q, k, v, out=out)": per_call(lambda: fa.forward(q, k, v, out=out)),
        "flash_attention_scratch.forward(q, k, v)": per_call(lambda: fa.forward(q, k, v)),
        "torch.ops.flash_attention_scratch.forward (custom op)": per_call(
            lambda: torch.ops.flash_attention_scratch.forward(q, k, v, None, False, None)),
        "torch SDPA, FLASH_ATTENTION backend (for scale)": per_call(lambda: sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v)),
    }
    return shape, results


COLORS = {"ours": "#1f77b4", "FA2": "#ff7f0e", "cuDNN": "#2ca02c", "efficient": "#d62728"}


def plot(rows, device, path, causal=False):
    """TFLOP/s against sequence length, one panel per (dtype, d_head), one colour per
    implementation in every panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kinds = sorted({(r[0], r[1]) for r in rows}, key=lambda k: (k[0], k[1]))
    columns = 3
    lines = (len(kinds) + columns - 1) // columns
    fig, axes = plt.subplots(lines, columns, figsize=(4.6 * columns, 3.6 * lines), squeeze=False)
    for ax, (dtype_name, d) in zip(axes.flat, kinds):
        sel = [r for r in rows if r[0] == dtype_name and r[1] == d]
        for name in ["ours", *PEERS]:
            pts = [(r[2], r[5][name]) for r in sel if r[5][name] is not None]
            label = name if pts else f"{name} (n/a)"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, color=COLORS[name])
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{dtype_name}, d_head {d}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in list(axes.flat)[len(kinds):]:
        ax.axis("off")
    fig.suptitle(f"flash_attention vs PyTorch SDPA ({'causal' if causal else 'non-causal'}, 16k tokens, "
                 f"hidden 2048), {device}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def rows_from_markdown(path):
    """The rows of a table this script wrote, to re-plot it without a GPU."""
    rows, device = [], ""
    for line in Path(path).read_text().splitlines():
        if ", torch " in line and not device:
            device = line.split(",")[1].strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[1].isdigit():
            rate = lambda c: None if c == "n/a" else float(c)
            rates = dict(zip(["ours", "FA2", "cuDNN", "efficient"], map(rate, cells[3:7])))
            rows.append((cells[0], int(cells[1]), int(cells[2]), None, None, rates, {}, {}))
    return rows, device


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--d-heads", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--order", choices=["fixed", "shuffled"], default="fixed",
                        help="the implementations' order within a round: always the same, or new each round")
    parser.add_argument("--causal", action="store_true",
                        help="causal masking (square: the same for bottom-right and top-left); FLOPs halved")
    parser.add_argument("--out", default="docs/compare", help="writes OUT.md and OUT.png")
    parser.add_argument("--overhead-only", action="store_true", help="only the host-overhead table")
    parser.add_argument("--replot", metavar="MD", help="re-draw OUT.png from a table this script wrote")
    args = parser.parse_args()
    if args.replot:
        rows, device = rows_from_markdown(args.replot)
        plot(rows, device, Path(args.out + ".png"))
        return
    if args.overhead_only:
        shape, costs = overhead(fa.configs()[0].dtype)
        for name, us in costs.items():
            print(f"{us:8.2f} us  {name}")
        return

    device = torch.cuda.get_device_name()
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for d in args.d_heads:
            for seq in args.seqs:
                batch, heads = max(1, 16384 // seq), 2048 // d
                slot_bytes = 4 * batch * seq * heads * d * 2
                copies = max(4, 4 * L2_BYTES // slot_bytes + 1)
                inputs = [tuple(torch.randn(batch, seq, heads, d, dtype=dtype, device="cuda") for _ in range(3))
                          for _ in range(copies)]
                impls = {"ours": lambda q, k, v: fa.forward(q, k, v, causal=args.causal)}
                impls.update({name: sdpa(backend, args.causal) for name, backend in PEERS.items()})
                timing, dead = time_interleaved(impls, inputs, args.warmup, args.runs, args.rounds, args.order)
                flop = 4 * batch * heads * seq * seq * d // (2 if args.causal else 1)
                rates = {name: (None if t is None else flop / (t[0] * 1e-3) / 1e12) for name, t in timing.items()}
                spreads = {name: (None if t is None else (t[2] - t[1]) / t[0]) for name, t in timing.items()}
                rows.append((dtype_name, d, seq, batch, heads, rates, spreads, dead))
                print(dtype_name, d, seq, {k: (None if r is None else round(r, 1)) for k, r in rates.items()},
                      flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# flash_attention vs PyTorch SDPA backends\n",
             f"{datetime.date.today()}, {device}, torch {torch.__version__}. Command: "
             f"`python3 bench/compare.py {' '.join(sys.argv[1:])}` (the automatic "
             f"choice: the tuning cache where `flash_attention tune` wrote one, else the "
             f"built-in table). TFLOP/s = "
             f"4·batch·heads·seq²·d_head{' / 2' if args.causal else ''} / median time; "
             f"16k tokens (batch = 16384/seq), hidden 2048 (heads = 2048/d_head), "
             f"{'causal' if args.causal else 'non-causal'}. "
             f"n/a: the implementation does not support the shape.\n",
             "| dtype | d_head | seq | ours | FA2 | cuDNN | efficient | ours/FA2 | ours/cuDNN | ours/efficient | max spread |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda r: "n/a" if r is None else f"{r:.1f}"
    ratio = lambda a, b: "" if a is None or b is None else f"{a / b:.2f}"
    for dtype_name, d, seq, batch, heads, rates, spreads, dead in rows:
        spread = max((s for s in spreads.values() if s is not None), default=0)
        lines.append(f"| {dtype_name} | {d} | {seq} | {fmt(rates['ours'])} | {fmt(rates['FA2'])} | "
                     f"{fmt(rates['cuDNN'])} | {fmt(rates['efficient'])} | {ratio(rates['ours'], rates['FA2'])} | "
                     f"{ratio(rates['ours'], rates['cuDNN'])} | {ratio(rates['ours'], rates['efficient'])} | "
                     f"{100 * spread:.1f}% |")

    dtype0 = fa.configs()[0].dtype
    shape, costs = overhead(dtype0)
    lines += ["", f"## Host overhead per call (shape {shape}, {dtype0}; best of 20 batches of 200 calls)", "",
              "| path | µs per call |", "|---|---|"]
    lines += [f"| {name} | {us:.2f} |" for name, us in costs.items()]
    binding = costs["direct binding, _C.forward (automatic choice)"]
    custom = costs["torch.ops.flash_attention_scratch.forward (custom op)"]
    lines.append(f"\nThe custom-op path adds {custom - binding:.2f} µs over the direct binding "
                 "(the C++ API's own cost: build/bin/flash_attention_overhead).")
    (out.parent / (out.name + ".md")).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-8:]))

    plot(rows, device, out.parent / (out.name + ".png"), args.causal)


if __name__ == "__main__":
    main()
