"""FP8 (e4m3) forward: this library against cuDNN's FP8 attention, in one process, on the same inputs.

The grid of targets-h200.md at d_head 128 and 256 (16k tokens: batch = 16384/seq; heads = 2048/d_head),
causal and not. Each shape times, in the same shuffled rounds (compare.time_shape): ours in FP8 (forward()
with torch.float8_e4m3fn q, k, v and (batch, K/V head) descales; bf16 output), cuDNN's FP8 attention
(cudnn-frontend's sdpa_fp8 graph, per-tensor descales; on Hopper its output is e4m3, which PyTorch's
SDPA does not take), and ours, cuDNN (SDPA's backend) and ours in fp16 on the same values in 16 bits.
Where cudnn-frontend does not import, issue 59's other bar applies: FlashAttention-3's published FP8
figures (paper, Fig. 9: fp8 at 16k, non-causal) scaled by this run's ratio of ours in fp16 to FA3's
published fp16 (same paper, Fig. 5), both at 16k.

Accuracy (--accuracy): on random inputs and inputs with outlier channels, each FP8 output's largest
error against float64 attention of the dequantised inputs, beside a naive FP8 computation's (FA3's:
S in fp32, P x 2^8 rounded to e4m3, P·V summed in fp32), which the FP8 rule bounds ours by.

    python3 bench/fp8.py --out /tmp/fp8            # writes /tmp/fp8.md
"""

import argparse
import datetime
import math
import sys
from pathlib import Path

from compare import L2_BYTES, attention_flop, fmt, time_shape

BAR = 1.02
E4M3_MAX = 448.0
# FlashAttention-3 paper, H100 SXM at 1830 MHz, 16k tokens, non-causal: fp16 (Fig. 5) and fp8 (Fig. 9).
FA3_FP16 = {64: 497, 128: 648, 256: 756}
FA3_FP8 = {64: 613, 128: 1008, 256: 1171}
# One descale for every input: randn's largest values (about 6 in 2^25 samples) land near 336, inside
# e4m3's 448, without clamping.
DESCALE = 8.0 / E4M3_MAX


def to_e4m3(torch, x, descale):
    """x / descale in e4m3 (clamped to its range: torch's cast does not saturate)."""
    return (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


class CudnnFp8:
    """cuDNN's FP8 attention of (batch, seq, heads, d) e4m3 tensors through cudnn-frontend's graph API:
    per-tensor descales, P scaled by 2^8 (scale_s), the output in e4m3 scaled by scale_o."""

    def __init__(self, torch, cudnn, shape, causal, scale, scale_o):
        self.torch, self.cudnn = torch, cudnn
        batch, seq, heads, d = shape
        dims, strides = (batch, heads, seq, d), (seq * heads * d, d, heads * d, 1)
        e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                              handle=self.handle)
        self.q, self.k, self.v = (graph.tensor(name=n, dim=dims, stride=strides, data_type=e4m3) for n in "qkv")
        names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
        self.scalars = {n: graph.tensor(name=n, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
                        for n in names}
        o, _, amax_s, amax_o = graph.sdpa_fp8(q=self.q, k=self.k, v=self.v, **self.scalars, generate_stats=False,
                                              attn_scale=scale, use_causal_mask=causal)
        o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        self.graph, self.o, self.amax = graph, o, (amax_s, amax_o)
        device = "cuda"
        values = {"descale_q": DESCALE, "descale_k": DESCALE, "descale_v": DESCALE, "descale_s": 1 / 256,
                  "scale_s": 256.0, "scale_o": scale_o}
        self.scalar_values = {n: torch.full((1, 1, 1, 1), values[n], device=device) for n in names}
        self.amax_values = [torch.empty((1, 1, 1, 1), device=device) for _ in range(2)]
        self.out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        self.workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=device)

    def __call__(self, q, k, v):
        pack = {self.q: q, self.k: k, self.v: v, self.o: self.out,
                self.amax[0]: self.amax_values[0], self.amax[1]: self.amax_values[1]}
        pack.update({self.scalars[n]: t for n, t in self.scalar_values.items()})
        self.graph.execute(pack, self.workspace, handle=self.handle)
        return self.out


def cudnn_module():
    try:
        import cudnn
        return cudnn
    except (ImportError, OSError) as error:
        print(f"cudnn-frontend not importable ({error}): the FA3-scaled bar instead", file=sys.stderr)
        return None


def cudnn_fp8(torch, cudnn, shape, causal, scale_o):
    """CudnnFp8 for this shape, or None (printing why) where cuDNN does not build it."""
    if cudnn is None:
        return None
    try:
        return CudnnFp8(torch, cudnn, shape, causal, 1 / math.sqrt(shape[-1]), scale_o)
    except Exception as error:  # noqa: BLE001 (cudnn's own exception types)
        print(f"cuDNN FP8 {shape} causal={causal}: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}",
              file=sys.stderr)
        return None


def implementations(torch, fa, cudnn, shape, causal, fp8_configs=()):
    """name -> fn(q, k, v) where q, k and v are dicts of the same values as 'bf16', 'fp16' and 'fp8';
    'ours FP8' is the automatic choice, 'FP8 #i' the i-th of fp8_configs (short forms) on the same inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    batch, _, heads, _ = shape
    descale = torch.full((batch, heads), DESCALE, device="cuda")

    def cudnn_bf16(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q["bf16"].transpose(1, 2), k["bf16"].transpose(1, 2), v["bf16"].transpose(1, 2), is_causal=causal)

    impls = {
        "ours FP8": lambda q, k, v: fa.forward(q["fp8"], k["fp8"], v["fp8"], causal=causal, q_descale=descale,
                                               k_descale=descale, v_descale=descale),
        "ours bf16": lambda q, k, v: fa.forward(q["bf16"], k["bf16"], v["bf16"], causal=causal),
        "ours fp16": lambda q, k, v: fa.forward(q["fp16"], k["fp16"], v["fp16"], causal=causal),
        "cuDNN bf16": cudnn_bf16,
    }
    for i, config in enumerate(fp8_configs):
        if fa.KernelConfig.parse(config).d_head == shape[-1]:
            impls[f"FP8 #{i}"] = (lambda c: lambda q, k, v: fa.forward(
                q["fp8"], k["fp8"], v["fp8"], causal=causal, q_descale=descale, k_descale=descale,
                v_descale=descale, config=c))(config)
    # The output's scale: |O| <= max|V| (a convex combination of V's rows), about 6 for randn.
    peer = cudnn_fp8(torch, cudnn, shape, causal, E4M3_MAX / 8.0)
    if peer is not None:
        impls["cuDNN FP8"] = lambda q, k, v: peer(q["fp8"], k["fp8"], v["fp8"])
    return impls


def inputs_for(torch, shape):
    def make():
        per_copy = 3 * (2 + 2 + 1) * math.prod(shape)
        copies = max(3, math.ceil(2 * L2_BYTES / per_copy))
        out = []
        for _ in range(copies):
            tensors = []
            for _ in range(3):
                x = to_e4m3(torch, torch.randn(shape, device="cuda"), DESCALE)
                exact = x.float() * DESCALE  # the FP8 values, exact in 16 bits too
                tensors.append({"fp8": x, "bf16": exact.to(torch.bfloat16), "fp16": exact.to(torch.float16)})
            out.append(tuple(tensors))
        return out
    return make


def naive_fp8(torch, q, k, v, causal, scale):
    """FlashAttention-3's FP8 computation of dequantised float32 (batch, seq, heads, d) inputs: S in fp32,
    P = exp(S - max) x 2^8 rounded to e4m3, P·V summed in fp32, divided by the unrounded row sum."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        seq_q, seq_k = q.shape[1], k.shape[1]
        keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    p8 = (p * 256).to(torch.float8_e4m3fn).float() / 256
    return torch.einsum("bhqk,bkhd->bqhd", p8, v) / p.sum(dim=-1).transpose(1, 2)[..., None]


def reference(torch, q, k, v, causal, scale):
    q, k, v = q.double(), k.double(), v.double()
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        seq_q, seq_k = q.shape[1], k.shape[1]
        keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


def accuracy_rows(torch, fa, cudnn, d_heads):
    """(inputs, d, causal, errors by name, bound) on (1, 2048, 8, d): max |O - float64 reference|."""
    rows = []
    shape_of = lambda d: (1, 2048, 8, d)
    for kind in ("random", "outlier channels"):
        for d in d_heads:
            for causal in (False, True):
                gen = torch.Generator(device="cuda").manual_seed(d + causal)
                raw = [torch.randn(shape_of(d), device="cuda", generator=gen) for _ in range(3)]
                if kind == "outlier channels":  # two channels of Q and K 20x larger, as LLM activations have
                    for x in raw[:2]:
                        x[..., :2] *= 20
                descales = [x.abs().amax().item() / E4M3_MAX for x in raw]
                fp8 = [to_e4m3(torch, x, s) for x, s in zip(raw, descales)]
                deq = [x.float() * s for x, s in zip(fp8, descales)]
                scale = 1 / math.sqrt(d)
                ref = reference(torch, *deq, causal, scale)
                errors = {}
                ds = [torch.full((1, 8), s, device="cuda") for s in descales]
                out = fa.forward(*fp8, causal=causal, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
                errors["ours FP8"] = (out.double() - ref).abs().max().item()
                errors["naive FP8"] = (naive_fp8(torch, *deq, causal, scale).double() - ref).abs().max().item()
                try:  # a build of FP8 kernels alone has no bf16 one at this d_head
                    errors["ours bf16"] = (fa.forward(*(x.to(torch.bfloat16) for x in deq), causal=causal).double()
                                           - ref).abs().max().item()
                except ValueError:
                    pass
                peer = None
                if cudnn is not None:
                    scale_o = E4M3_MAX / max(ref.abs().max().item(), 1e-6)
                    peer = cudnn_fp8(torch, cudnn, shape_of(d), causal, scale_o)
                if peer is not None:
                    peer.scalar_values["descale_q"].fill_(descales[0])
                    peer.scalar_values["descale_k"].fill_(descales[1])
                    peer.scalar_values["descale_v"].fill_(descales[2])
                    o8 = peer(*fp8).double() / scale_o
                    errors["cuDNN FP8"] = (o8 - ref).abs().max().item()
                    # the e4m3 output's own rounding, which a bf16 output does not have
                    errors["ref in e4m3"] = ((ref * scale_o).to(torch.float8_e4m3fn).double() / scale_o
                                             - ref).abs().max().item()
                bound = 2 * errors["naive FP8"] + 2**-7 * ref.abs().max().item()
                rows.append((kind, d, causal, errors, bound))
                print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--d-heads", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--accuracy", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--graphs", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fp8-configs", nargs="*", default=[],
                        help="FP8 configs (short forms) timed beside the automatic choice, as FP8 #i")
    parser.add_argument("--out", default="fp8", help="writes OUT.md")
    args = parser.parse_args()

    import torch
    import flash_attention_scratch as fa
    cudnn = cudnn_module()
    device = torch.cuda.get_device_name()
    version = f", cudnn-frontend {cudnn.__version__}, cuDNN {cudnn.backend_version()}" if cudnn else ""
    title = (f"Measured {datetime.date.today()} on {device}, torch {torch.__version__}{version}, "
             f"flash_attention_scratch {fa.__version__}")
    names = ["ours FP8", "cuDNN FP8", "ours bf16", "cuDNN bf16", "ours fp16",
             *(f"FP8 #{i}" for i in range(len(args.fp8_configs)))]
    rows = []
    for d in args.d_heads:
        for causal in {"no": [False], "yes": [True], "both": [False, True]}[args.causal]:
            for seq in args.seqs:
                shape = (max(1, 16384 // seq), seq, 2048 // d, d)
                flop = attention_flop(shape[0], shape[2], d, seq, seq, causal)
                rates = time_shape(torch, implementations(torch, fa, cudnn, shape, causal, args.fp8_configs),
                                   inputs_for(torch, shape), flop, args)
                rows.append((d, causal, seq, rates))
                print(d, causal, seq, {k: fmt(v) for k, v in rates.items()}, flush=True)
    lines = ["# FP8 forward: this library against cuDNN's FP8", "",
             f"{title}. Command: `python3 bench/fp8.py {' '.join(sys.argv[1:])}`. TFLOP/s = 4·batch·heads·seq²·d_head "
             f"/ median time, halved for causal; {args.rounds} shuffled rounds of {args.calls} calls; inputs rotated "
             "past L2. cuDNN FP8 writes e4m3 (Hopper's only output), ours bf16. FA3 bar: 1.02 x FA3's published FP8 "
             "x (ours fp16 / FA3's published fp16), at 16k non-causal." +
             "".join(f" FP8 #{i}: `{c}`." for i, c in enumerate(args.fp8_configs)), "",
             "| d | causal | seq | " + " | ".join(names) + " | ours FP8 / cuDNN FP8 | FA3 bar |",
             "|---|---|---|" + "---|" * len(names) + "---|---|"]
    for d, causal, seq, rates in rows:
        ours, peer = rates.get("ours FP8"), rates.get("cuDNN FP8")
        r = ours / peer if ours and peer else None
        fa3 = None
        if seq == 16384 and not causal and rates.get("ours fp16") and d in FA3_FP8:
            fa3 = BAR * FA3_FP8[d] * rates["ours fp16"] / FA3_FP16[d]
        mark = "**" if r is not None and r < BAR else ""
        lines.append(f"| {d} | {'yes' if causal else 'no'} | {seq} | " + " | ".join(fmt(rates.get(n)) for n in names)
                     + f" | {mark}{fmt(r, 3)}{mark} | {fmt(fa3)} |")
    if args.accuracy:
        acc = accuracy_rows(torch, fa, cudnn, args.d_heads)
        cols = ["ours FP8", "cuDNN FP8", "naive FP8", "ours bf16", "ref in e4m3"]
        lines += ["", "Accuracy on (1, 2048, 8, d): max |O - float64 attention of the dequantised inputs| (per-tensor "
                  "descales, amax to 448); bound = 2 x naive FP8 + 2^-7 x max|ref| (the FP8 rule); 'ref in e4m3': "
                  "the reference rounded to cuDNN's e4m3 output.", "",
                  "| inputs | d | causal | " + " | ".join(cols) + " | bound | ours within |",
                  "|---|---|---|" + "---|" * len(cols) + "---|---|"]
        for kind, d, causal, errors, bound in acc:
            ok = errors["ours FP8"] <= bound
            lines.append(f"| {kind} | {d} | {'yes' if causal else 'no'} | " +
                         " | ".join(fmt(errors.get(c), 4) for c in cols) + f" | {bound:.4f} | {'yes' if ok else '**no**'} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]))


if __name__ == "__main__":
    main()
