"""PyTorch scaled_dot_product_attention with one backend forced at a time, timed like
`flash_attention bench`: CUDA events, warm-up, median of timed runs, inputs rotated
among copies so L2 cannot hold them. Prints one line per (dtype, d_head, backend).

    python3 bench/torch_sdpa.py --batch 4 --heads 16 --seq 4096 --d-head 128 64

With --profile BACKEND it times nothing: after a warm-up it runs one call of that backend
between cudaProfilerStart and cudaProfilerStop, for a profiler that starts there:

    ncu --profile-from-start off --set full -o cudnn python3 bench/torch_sdpa.py \
        --profile cudnn --batch 1 --heads 16 --seq 16384 --dtype bfloat16
"""

import argparse
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash(FA2)": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def time_sdpa(q, k, v, backend, warmup, runs, causal=False):
    """Median and spread in ms of SDPA over rotated (q, k, v) copies."""
    slots = len(q)
    with sdpa_kernel(backend):
        for i in range(warmup):
            torch.nn.functional.scaled_dot_product_attention(
                q[i % slots], k[i % slots], v[i % slots], is_causal=causal)
        torch.cuda.synchronize()
        times = []
        for i in range(runs):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.nn.functional.scaled_dot_product_attention(
                q[i % slots], k[i % slots], v[i % slots], is_causal=causal)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    times.sort()
    return statistics.median(times), times[0], times[-1]


def profile(args):
    """One SDPA call of args.profile per (dtype, d_head), inside the profiler's range."""
    causal = args.causal
    for dtype_name in args.dtype:
        for d in args.d_head:
            shape = (args.batch, args.heads, args.seq, d)
            q, k, v = (torch.randn(shape, dtype=getattr(torch, dtype_name), device="cuda") for _ in range(3))
            with sdpa_kernel(BACKENDS[args.profile]):
                for _ in range(args.warmup):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--d-head", type=int, nargs="+", default=[128])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--profile", choices=BACKENDS, help="one call of this backend, for a profiler")
    parser.add_argument("--causal", action="store_true", help="is_causal (top-left; seq_q == seq_k here)")
    args = parser.parse_args()
    if args.profile:
        profile(args)
        return

    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}")
    l2_bytes = 50 * 2**20
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for d in args.d_head:
            shape = (args.batch, args.heads, args.seq, d)
            slot_bytes = 4 * args.batch * args.heads * args.seq * d * 2
            slots = max(2, 4 * l2_bytes // slot_bytes + 1)
            q = [torch.randn(shape, dtype=dtype, device="cuda") for _ in range(slots)]
            k = [torch.randn(shape, dtype=dtype, device="cuda") for _ in range(slots)]
            v = [torch.randn(shape, dtype=dtype, device="cuda") for _ in range(slots)]
            flop = 4 * args.batch * args.heads * args.seq * args.seq * d
            if args.causal:
                flop = flop * (args.seq + 1) // (2 * args.seq)  # the visible pairs
            for name, backend in BACKENDS.items():
                try:
                    median, low, high = time_sdpa(q, k, v, backend, args.warmup, args.runs, args.causal)
                except RuntimeError as error:
                    print(f"{dtype_name} d={d} {name}: unavailable ({str(error).splitlines()[0]})")
                    continue
                print(f"{dtype_name} d={d} seq={args.seq} batch={args.batch} heads={args.heads}"
                      f"{' causal' if args.causal else ''} {name}: "
                      f"{median:.4f} ms (min {low:.4f}, max {high:.4f}) "
                      f"{flop / (median * 1e-3) / 1e12:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
