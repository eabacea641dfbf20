"""Where a backward pass's time goes, kernel by kernel: this library beside FlashAttention-4 and cuDNN.

For each shape of the grid (bf16, batch = 16384/seq, heads = 2048/d_head), each implementation's
backward (torch.autograd.grad of a kept graph, as bench/compare.py times it) runs under torch.profiler
(CUPTI's kernel records: device time, launches as the library makes them, programmatic dependent launches
included). The table gives each kernel's mean device time a call and its share of their sum, then the
call's wall time between CUDA events outside the profiler. The side kernels (preprocess, dQ conversion)
are memory-bound and cost the same at every length of a fixed token count, so their share is largest at
short lengths.

    python3 bench/backward_kernels.py --seqs 1024 2048 8192 --d-heads 64 128 --out /tmp/bwd_kernels

Under the profiler a kernel's span includes its wait for the previous one where it is a programmatic dependent launch
(ours: the main kernel after the preprocess, the dQ conversion after the main kernel). Nsight Compute runs kernels one
at a time, so its durations are each kernel's own: --ncu-region runs one backward per shape and implementation inside
a profiler region, each after an int16 fill that marks it, and --ncu-table turns ncu's CSV of that run into the table
(`GRID=kernels KERNELS_NCU=1 scripts/gpu_check.sh grid`):

    ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        python3 bench/backward_kernels.py --ncu-region /tmp/labels.txt > /tmp/bwd.csv
    python3 bench/backward_kernels.py --ncu-table /tmp/bwd.csv /tmp/labels.txt --out /tmp/bwd_ncu
"""

import argparse
import csv
import statistics
import sys
from pathlib import Path


def implementations(torch):
    """name -> forward(q, k, v, causal) for every implementation that imports."""
    import flash_attention_scratch as fa

    impls = {"ours": lambda q, k, v, causal: fa.flash_attn_func(q, k, v, causal=causal)}
    try:
        from flash_attn.cute import flash_attn_func as fa4

        impls["FA4"] = lambda q, k, v, causal: fa4(q, k, v, causal=causal)[0]
    except ImportError as error:
        print(f"FlashAttention-4 not importable ({error}): left out", file=sys.stderr)

    def cudnn(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)

    impls["cuDNN"] = cudnn
    return impls


def short_name(name):
    """A kernel's name without its template arguments and parameters."""
    name = name.split("(")[0]
    depth, out = 0, []
    for c in name:
        depth += c == "<"
        if depth == 0:
            out.append(c)
        depth -= c == ">"
    return "".join(out).replace("void ", "").strip()[:80]


def measure(torch, fn, q, k, v, causal, calls):
    """(per-kernel mean device µs a call, wall µs a call) of the backward of fn's output."""
    tensors = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*tensors, causal)
    d_o = torch.randn_like(out)

    def backward():
        torch.autograd.grad(out, tensors, d_o, retain_graph=True)

    for _ in range(3):
        backward()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    walls = []
    for _ in range(calls):
        start.record()
        backward()
        end.record()
        end.synchronize()
        walls.append(start.elapsed_time(end) * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            backward()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.events():
        # Kernels, memsets and copies: kineto's device records, each one launch's span.
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = short_name(event.name)
            kernels[name] = kernels.get(name, 0.0) + event.time_range.elapsed_us() / calls
    return kernels, statistics.median(walls)


MARKER = "FillFunctor<short>"  # the int16 fill that starts each labelled backward in an --ncu-region run


def ncu_region(torch, impls, shapes, labels_path):
    """One backward per (shape, implementation) inside a CUDA profiler region, each after a marker kernel; the labels,
    in launch order, to labels_path (one a line)."""
    marker = torch.zeros(1, dtype=torch.int16, device="cuda")
    calls = []
    for label, fn, q, k, v, causal in ((f"{name} | {d} | {'yes' if causal else 'no'} | {seq}", fn, q, k, v, causal)
                                       for d, causal, seq, q, k, v in shapes for name, fn in impls.items()):
        tensors = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        try:
            out = fn(*tensors, causal)
            d_o = torch.randn_like(out)
            for _ in range(2):  # compiled, and its workspace pools warm, before the region
                torch.autograd.grad(out, tensors, d_o, retain_graph=True)
        except Exception as error:  # a peer that does not run the shape
            print(f"{label}: {type(error).__name__}: {error}", file=sys.stderr)
            continue
        calls.append((label, out, tensors, d_o))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for i, (_, out, tensors, d_o) in enumerate(calls):
        marker.fill_(i)
        torch.autograd.grad(out, tensors, d_o, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    labels_path.write_text("".join(label + "\n" for label, *_ in calls))


def ncu_table(csv_path, labels_path):
    """The table of ncu's raw CSV of an --ncu-region run: each labelled backward's kernels, their own durations."""
    labels = labels_path.read_text().splitlines()
    rows = list(csv.reader(line for line in csv_path.read_text().splitlines() if line.startswith('"')))
    if len(rows) < 2:
        raise SystemExit(f"--ncu-table: expected ncu's raw CSV (a header, units, a row a kernel) in {csv_path}, "
                         f"got {len(rows)} CSV rows (did ncu profile anything?)")
    header = rows[0]
    name, time = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    dram = header.index("dram__throughput.avg.pct_of_peak_sustained_elapsed") \
        if "dram__throughput.avg.pct_of_peak_sustained_elapsed" in header else None
    units = rows[1]
    scales = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}  # ncu's units, to µs
    if units[time] not in scales:
        raise SystemExit(f"--ncu-table: expected gpu__time_duration.sum in one of {', '.join(scales)} "
                         f"(ncu --print-units base), got {units[time]!r}")
    scale = scales[units[time]]
    calls, current = [], None
    for row in rows[2:]:
        if MARKER in row[name]:
            current = []
            calls.append(current)
        elif current is not None:
            us = float(row[time].replace(",", "")) * scale
            current.append((short_name(row[name]), us, row[dram] if dram is not None else ""))
    if len(calls) != len(labels):
        raise SystemExit(f"--ncu-table: expected {len(labels)} marked backward calls (the labels), "
                         f"got {len(calls)} in {csv_path}")
    lines = ["| impl | d | causal | seq | sum µs | kernel: µs (DRAM % of peak) |", "|---|---|---|---|---|---|"]
    for label, kernels in zip(labels, calls):
        parts = ", ".join(f"{n}: {us:.1f}" + (f" ({pct}%)" if pct else "") for n, us, pct in kernels)
        lines.append(f"| {label} | {sum(us for _, us, _ in kernels):.1f} | {parts} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 8192])
    parser.add_argument("--d-heads", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=Path, help="also write the table to OUT.md")
    parser.add_argument("--ncu-region", type=Path, metavar="LABELS",
                        help="instead of timing: one backward a shape and implementation in a profiler region for "
                             "ncu, the labels to LABELS")
    parser.add_argument("--ncu-table", type=Path, nargs=2, metavar=("CSV", "LABELS"),
                        help="instead of running: the table of ncu's raw CSV of an --ncu-region run")
    args = parser.parse_args()
    if args.ncu_table:
        lines = ncu_table(*args.ncu_table)
        print("\n".join(lines))
        if args.out:
            args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        return
    import torch

    impls = implementations(torch)
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]

    def shapes():
        for d in args.d_heads:
            for causal in causals:
                for seq in args.seqs:
                    batch, heads = 16384 // seq, 2048 // d
                    yield (d, causal, seq, *(torch.randn(batch, seq, heads, d, device="cuda", dtype=torch.bfloat16)
                                             for _ in range(3)))

    if args.ncu_region:
        ncu_region(torch, impls, list(shapes()), args.ncu_region)
        return
    lines = ["| d | causal | seq | impl | wall µs | kernel: µs (share) |", "|---|---|---|---|---|---|"]
    for d, causal, seq, q, k, v in shapes():
        for name, fn in impls.items():
            try:
                kernels, wall = measure(torch, fn, q, k, v, causal, args.calls)
            except Exception as error:  # a peer that does not run the shape
                print(f"{name} d{d} seq {seq}: {type(error).__name__}: {error}", file=sys.stderr)
                continue
            total = sum(kernels.values())
            parts = ", ".join(f"{n}: {t:.1f} ({t / total:.1%})"
                              for n, t in sorted(kernels.items(), key=lambda kv: -kv[1]))
            lines.append(f"| {d} | {'yes' if causal else 'no'} | {seq} | {name} | {wall:.1f} | {parts} |")
            print(lines[-1], flush=True)
    if args.out:
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
