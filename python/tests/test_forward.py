"""The flash_attention_scratch package: pure-Python behaviour everywhere, kernels on a GPU.

Results are compared with torch's scaled_dot_product_attention computed in float64,
using the FlashAttention rule: error <= 2 x PyTorch's own same-dtype error + 1e-3.
"""

import math
import os
import shutil
import subprocess
import sys

import pytest

import flash_attention_scratch as fa

try:
    import torch
except ImportError:
    torch = None

needs_gpu = pytest.mark.skipif(
    torch is None or not torch.cuda.is_available() or fa.device_count() == 0,
    reason="needs PyTorch and a CUDA GPU (run on the device machine; docs/PERF.md has the results)",
)


def built_kinds(backward=False):
    """16-bit (dtype, d_head) pairs with a built forward kernel (and with backward=True a built
    backward kernel too), in the build's order. FP8's kernels: test_fp8.py."""
    kinds = []
    for c in fa.configs():
        kind = (c.dtype, c.d_head)
        if not c.backward and c.dtype != fa.DType.E4M3 and kind not in kinds:
            kinds.append(kind)
    if backward:
        kinds = [kind for kind in kinds if any(c.backward and (c.dtype, c.d_head) == kind for c in fa.configs())]
    return kinds


def torch_dtype(dtype):
    return {fa.DType.FP16: torch.float16, fa.DType.BF16: torch.bfloat16}[dtype]


def assert_close_to_reference(out, q, k, v, scale=None):
    """Non-causal and without the LSE: assert_matches(), at 1/sqrt(d_head) unless given."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    assert_matches(out, None, q, k, v, scale, causal=False)


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device="cuda")


def masked_attention(q, k, v, scale, causal, dtype=None, top_left=False):
    """Attention in `dtype` (matmuls and softmax output rounded to it), any lengths,
    bottom-right causal mask (top_left: query i sees keys j <= i, SDPA's), grouped K/V heads.
    Returns (out, lse) in (batch, seq, heads, d) and (batch, heads, seq); rows that see no
    key give zeros and lse -inf."""
    dtype = dtype or torch.float64
    group = q.shape[2] // k.shape[2]
    qt = q.to(dtype).transpose(1, 2)
    kt = k.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    vt = v.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    scores = (qt @ kt.transpose(-1, -2)).to(dtype) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        scores = scores.masked_fill(j > i + (0 if top_left else sk - sq), float("-inf"))
    lse = torch.logsumexp(scores.double(), dim=-1)
    p = torch.exp(scores.double() - lse[..., None]).nan_to_num(0.0).to(dtype)
    out = (p @ vt).to(dtype).transpose(1, 2)
    return out, lse


def assert_matches(out, lse, q, k, v, scale, causal, top_left=False):
    """FlashAttention's rule, as src/reference applies it: the error against float64 at
    most twice a naive same-dtype computation's, plus 1e-3. Naive, not PyTorch's fused
    kernels: those keep each row's largest probability exactly 1 before rounding it, which
    lazy rescaling does not (docs/PERF.md), and their error is no bound the rule names."""
    assert torch.isfinite(out).all(), "non-finite values in the output"
    ref, ref_lse = masked_attention(q, k, v, scale, causal, top_left=top_left)
    naive, _ = masked_attention(q, k, v, scale, causal, dtype=q.dtype, top_left=top_left)
    ours = (out.double() - ref).abs().max().item()
    torch_error = (naive.double() - ref).abs().max().item()
    assert ours <= 2 * torch_error + 1e-3, f"max error {ours:.3g} > 2 x {torch_error:.3g} + 1e-3"
    if lse is not None:
        empty = torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "LSE is not -inf exactly where rows see no key"
        assert (lse[~empty].double() - ref_lse[~empty]).abs().max().item() <= 1e-3


# ---- no GPU needed ----------------------------------------------------------------


def test_configs_and_parse_round_trip():
    configs = fa.configs()
    assert configs, "the build holds no kernels"
    for c in configs:
        assert fa.KernelConfig.parse(str(c)) == c
        assert c.is_built()
        if c.backward and c.family == fa.Family.sm90:
            # K and V, `stages` Q and dO tiles (V and dO of V's head dim), two dS tiles (with every consumer on the same 64
            # keys, d_head 256, two P tiles too), dQ's fp32 staging, two steps' LSE and D rows
            # (fp32; lag_dq a stage's) and the mbarriers (K and V full and empty, a full and
            # an empty per stage of Q and of dO; lag_dq four more; dynamic, the key-block ring of
            # two indices and four mbarriers), rounded up to the struct's 1024-byte alignment,
            # plus 1024 to align it.
            stages = c.stages
            consumers = c.n_warps // 4 - 1
            score_tiles = 2 if c.B_c == 64 and consumers > 1 else 1
            stats_buffers = stages if c.lag_dq else 2
            # Whole sub-tiles of their swizzle (64 columns, or 32 at d_head 96): no padding.
            d = c.d_head
            d_v = c.d_v or c.d_head  # V's and dO's columns (d_v 0: d_head)
            raw = (2 * (c.B_c * (d + d_v) + stages * c.B_r * (d + d_v) + 2 * score_tiles * c.B_c * c.B_r)
                   + 4 * c.B_r * d + 8 * c.B_r * stats_buffers + 8 * (2 + 4 * stages)
                   + (32 if c.lag_dq else 0) + (40 if c.dynamic_schedule else 0))
            assert c.smem_bytes() == (raw + 1023) // 1024 * 1024 + 1024
        elif c.backward:
            # The larger of its two kernels': dK/dV holds K, V, a Q and a dO tile, Pᵀ and dSᵀ
            # and the tile's LSE and D; dQ holds Q, dO, K, V and dS.
            # Q, K at d_head columns, dO, V at V's head dim (d_head where 0).
            d = c.d_head + (c.d_v or c.d_head)
            dkdv = 2 * ((c.B_r + c.B_c) * d + 2 * c.B_c * c.B_r) + 8 * c.B_r
            dq = 2 * ((c.B_r + c.B_c) * d + c.B_c * c.B_r)
            assert c.smem_bytes() == max(dkdv, dq)
        elif c.family == fa.Family.sm90:
            # One or (persistent, when it fits) two Q tiles, `stages` K and V tiles, the
            # 1024-byte alignment pad, the mbarriers (persistent with one Q tile: a Q pair per
            # consumer warpgroup), with the dynamic schedule each Q buffer's tile slot (16 bytes)
            # and (persistent with one Q tile and at most two consumers, when it fits) a region of
            # 64 rows for O and its barrier, and with psmem each consumer's P tile (64 rows x B_c).
            # Q's and K's rows have d_head columns, V's and O's d_v (d_head where 0), each whole
            # sub-tiles of its swizzle: 64 columns, or 32 where d is not a multiple of 64 (96), so
            # no padding.
            # FP8 (E4M3): a byte an element (V's transposed tile as many as V's), O in bf16; with
            # transpose_v a staging tile (B_c x d_v bytes), a barrier pair and an end word (8 bytes) a stage.
            d = c.d_head
            d_v = c.d_v or c.d_head
            element = 1 if c.dtype == fa.DType.E4M3 else 2

            def size(q_tiles, o_apart=False):
                tiles = (q_tiles * c.B_r * d + c.stages * c.B_c * (d + d_v)) * element
                q_pairs = c.n_warps // 4 - 1 if c.persistent and q_tiles == 1 else q_tiles
                slots = 16 * q_tiles if c.dynamic_schedule else 0
                o_region = 64 * d_v * 2 + 8 if o_apart else 0
                p_tiles = (c.n_warps // 4 - 1) * 64 * c.B_c * 2 if c.p_in_smem else 0
                staging = c.stages * (c.B_c * d_v + 16 + 8) if c.transpose_v else 0
                return tiles + 1024 + 8 * (2 * q_pairs + 4 * c.stages) + slots + o_region + p_tiles + staging
            persistent = (size(1), size(1, True), size(2))
            assert c.smem_bytes() in (persistent if c.persistent else (size(1),))
        else:
            assert c.smem_bytes() == ((c.B_r + c.B_c) * c.d_head + c.B_c * (c.d_v or c.d_head)) * 2
    assert len({hash(c) for c in configs}) == len(configs)
    assert sorted(configs) == configs


def test_parse_errors_name_the_token():
    with pytest.raises(ValueError, match='"asyn"'):
        fa.KernelConfig.parse("(FP16, 128, 64, 64, 4): asyn+load_0_0_0_tiles")
    with pytest.raises(ValueError, match='"FP32"'):
        fa.KernelConfig.parse("(FP32, 128, 64, 64, 4): load_0_0_0_tiles")


def test_parse_errors_are_value_errors_with_a_printable_message():
    # The message quoted the input's first 100 bytes, cutting "é" in two: Python could not
    # decode it and raised UnicodeDecodeError. Control characters were echoed raw: a
    # newline split the message, a NUL ended Python's copy of it.
    with pytest.raises(ValueError, match="a" * 98 + r"\.\.\."):
        fa.KernelConfig.parse("(" + "a" * 98 + "é")
    with pytest.raises(ValueError) as newline:
        fa.KernelConfig.parse("(BF16, 64, 128, 64, 4): asy\nnc+load_1_1_1_tiles")
    assert "\n" not in str(newline.value) and r'"asy\nnc"' in str(newline.value)
    with pytest.raises(ValueError) as nul:
        fa.KernelConfig.parse("(BF16, 64, 128, 64, 4): asy\0nc+load_1_1_1_tiles")
    message = str(nul.value)
    assert r"asy\x00nc+load_1_1_1_tiles" in message and "\0" not in message
    assert message.endswith("at position 27")  # the whole message, past the NUL


def test_configs_compare_with_other_objects():
    # Comparing with None or a string raised TypeError.
    c = fa.configs()[0]
    assert not (c == None)  # noqa: E711 (the operator is what is tested)
    assert c != None  # noqa: E711
    assert not (c == "x") and c != "x"
    assert c in [None, c] and None not in [c]
    assert c == fa.KernelConfig.parse(str(c)) and not (c != fa.KernelConfig.parse(str(c)))
    with pytest.raises(TypeError):
        c < None  # noqa: B015 (an order with None has no meaning)


@pytest.mark.skipif(fa.device_count() > 0, reason="only without a GPU")
def test_nothing_is_supported_without_a_gpu():
    # "Supported on the current device" is false when there is none; it raised.
    assert not any(c.is_supported() for c in fa.configs())


def test_version_and_typing():
    assert fa.__version__.count(".") == 2 and all(p.isdigit() for p in fa.__version__.split("."))
    package = os.path.dirname(fa.__file__)
    assert os.path.exists(os.path.join(package, "py.typed"))
    assert os.path.exists(os.path.join(package, "_C.pyi"))


def test_extension_exports_its_entry_point_alone():
    # Anything else it exported could capture other libraries' symbols: exporting
    # libstdc++'s locale facet ids crashed `import torch` after this package (issue 11).
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm (binutils)")
    out = subprocess.run([nm, "-D", "--defined-only", fa._C.__file__], capture_output=True,
                         text=True, check=True).stdout
    assert [line.split()[-1] for line in out.splitlines()] == ["PyInit__C"]


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
@pytest.mark.parametrize("order", [["flash_attention_scratch", "torch"], ["torch", "flash_attention_scratch"]],
                         ids=["package_first", "torch_first"])
def test_import_in_either_order(order):
    # A fresh interpreter: the order in which the two are loaded is what matters.
    code = "; ".join(f"import {m}" for m in order) + "; print(torch.zeros(2).sum().item())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.strip().endswith("0.0")


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
def test_named_configs_leave_nothing_at_exit():
    # forward(config=...) caches the parsed config; at exit nanobind reported it as a leaked
    # instance on stderr unless the cache is released first.
    code = ("import flash_attention_scratch as fa, flash_attention_scratch._ops as ops; "
            "[ops._parse(str(c)) for c in fa.configs()]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "leaked" not in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
def test_cpu_tensors_are_rejected():
    q = torch.zeros(1, 128, 1, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        fa.forward(q, q, q)


@pytest.mark.skipif(fa.device_count() > 0 or torch is None, reason="only without a GPU")
def test_without_gpu_calls_raise_a_clear_error():
    with pytest.raises((ValueError, RuntimeError)):
        fa.forward(torch.zeros(1, 128, 1, 64, dtype=torch.float16), None, None)


# ---- GPU --------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("seq", [128, 512, 2048])
def test_matches_reference(seq):
    for dtype, d in built_kinds():
        q, k, v = (randn(2, seq, 3, d, dtype=torch_dtype(dtype)) for _ in range(3))
        assert_close_to_reference(fa.forward(q, k, v), q, k, v)


@needs_gpu
def test_automatic_choice_runs_the_devices_family_for_every_pair():
    # On Hopper every (dtype, d_head) the build holds an sm90 kernel for runs one; the
    # default (release) build holds both families for all ten pairs.
    hopper = torch.cuda.get_device_capability() == (9, 0)
    kinds = built_kinds()
    if os.environ.get("FLASH_EXPECT_RELEASE_SET"):
        assert sorted(kinds, key=str) == sorted(((t, d) for t in (fa.DType.FP16, fa.DType.BF16)
                                                 for d in (64, 96, 128, 192, 256)), key=str)
    for dtype, d in kinds:
        q, k, v = (randn(2, 1024, 4, d, dtype=torch_dtype(dtype)) for _ in range(3))
        out = torch.full_like(q, float("nan"))  # poisoned: a call that writes nothing fails
        chosen = fa._C.choose_config(q, k, v, out)
        sm90_built = any(c.family == fa.Family.sm90 and not c.backward and c.dtype == dtype and c.d_head == d
                         for c in fa.configs())
        assert chosen.family == (fa.Family.sm90 if hopper and sm90_built else fa.Family.sm80), str(chosen)
        assert_close_to_reference(fa.forward(q, k, v, out=out), q, k, v)


@needs_gpu
def test_every_built_config():
    for c in fa.configs():
        # sm90 kernels off Hopper; test_backward runs backward ones, test_fp8 FP8's
        if not c.is_supported() or c.backward or c.dtype == fa.DType.E4M3:
            continue
        seq = max(c.B_r, c.B_c) * 2
        q, k = (randn(1, seq, 2, c.d_head, dtype=torch_dtype(c.dtype)) for _ in range(2))
        v = randn(1, seq, 2, c.d_v or c.d_head, dtype=torch_dtype(c.dtype))  # d_v 0: V's is d_head
        assert_close_to_reference(fa.forward(q, k, v, config=c), q, k, v)
        assert_close_to_reference(fa.forward(q, k, v, config=str(c)), q, k, v)


@needs_gpu
def test_scale_and_cross_lengths():
    for dtype, d in built_kinds():
        t = torch_dtype(dtype)
        q, k, v = randn(1, 256, 2, d, dtype=t), randn(1, 1024, 2, d, dtype=t), randn(1, 1024, 2, d, dtype=t)
        assert_close_to_reference(fa.forward(q, k, v, softmax_scale=0.3), q, k, v, scale=0.3)


@needs_gpu
def test_non_contiguous_views():
    for dtype, d in built_kinds():
        t = torch_dtype(dtype)
        # (batch, heads, seq, d) storage seen as (batch, seq, heads, d)
        q, k, v = (randn(2, 4, 512, d, dtype=t).transpose(1, 2) for _ in range(3))
        assert not q.is_contiguous()
        out = fa.forward(q, k, v)
        assert out.is_contiguous(), "the output is contiguous whatever q's strides"
        assert_close_to_reference(out, q, k, v)
        # slices of a packed (batch, seq, 3, heads, d) QKV tensor
        qkv = randn(2, 512, 3, 4, d, dtype=t)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        out = fa.forward(q, k, v)
        assert out.is_contiguous()
        assert_close_to_reference(out, q, k, v)


@needs_gpu
def test_out_is_reused():
    for dtype, d in built_kinds():
        t = torch_dtype(dtype)
        q, k, v = (randn(1, 512, 2, d, dtype=t) for _ in range(3))
        padded = torch.full((1, 512, 2, d + 64), float("nan"), dtype=t, device="cuda")
        out = padded[..., :d]
        result = fa.forward(q, k, v, out=out)
        assert result is out
        assert_close_to_reference(out, q, k, v)
        assert torch.isnan(padded[..., d:]).all(), "wrote outside out"


@needs_gpu
def test_errors():
    d = built_kinds()[0][1]
    t = torch_dtype(built_kinds()[0][0])
    q = randn(1, 512, 2, d, dtype=t)
    with pytest.raises(TypeError, match="float32"):
        fa.forward(q.float(), q.float(), q.float())
    with pytest.raises(TypeError, match="k.dtype"):
        fa.forward(q, q.to(torch.float16 if t == torch.bfloat16 else torch.bfloat16), q)
    with pytest.raises(ValueError, match=r"q.shape\[2\] \(heads\): expected a multiple of k's heads 3"):
        fa.forward(q, randn(1, 512, 3, d, dtype=t), randn(1, 512, 3, d, dtype=t))
    with pytest.raises(ValueError, match=r"v.shape\[2\] \(heads\)"):
        fa.forward(q, q, randn(1, 512, 1, d, dtype=t))
    with pytest.raises(ValueError, match="4 dimensions"):
        fa.forward(q[0], q[0], q[0])
    with pytest.raises(ValueError, match=r"d_head\): expected 64, 96, 128, 192 or 256"):
        x = randn(1, 512, 2, 80, dtype=t)
        fa.forward(x, x, x)
    with pytest.raises(ValueError, match='"bogus"'):
        fa.forward(q, q, q, config="(FP16, 128, 64, 64, 4): bogus+load_0_0_0_tiles")
    with pytest.raises(ValueError, match="compiled into this build|valid config"):
        name = "BF16" if t == torch.bfloat16 else "FP16"
        fa.forward(q, q, q, config=f"({name}, {d}, 64, 16, 4): async+load_0_1_1_tiles")
    with pytest.raises(TypeError, match="config"):
        fa.forward(q, q, q, config=42)
    with pytest.raises(ValueError, match="overlap"):
        fa.forward(q, q, q, out=q)
    with pytest.raises(ValueError, match="softmax_scale"):
        fa.forward(q, q, q, softmax_scale=math.inf)


GENERAL_SHAPES = [  # (seq_q, seq_k, heads, heads_kv, causal)
    (1, 1, 2, 2, False),
    (7, 1000, 4, 2, True),
    (1000, 7, 4, 4, True),  # rows 0..992 see no key
    (257, 129, 8, 1, False),
    (129, 257, 8, 8, True),
    (1000, 1000, 8, 2, True),
]


@needs_gpu
@pytest.mark.parametrize("shape", GENERAL_SHAPES, ids=lambda s: "q{}_k{}_h{}_{}{}".format(*s[:4], "_causal" if s[4] else ""))
def test_any_length_causal_gqa_and_lse(shape):
    sq, sk, h, hkv, causal = shape
    for dtype, d in built_kinds():
        t = torch_dtype(dtype)
        q, k, v = randn(2, sq, h, d, dtype=t), randn(2, sk, hkv, d, dtype=t), randn(2, sk, hkv, d, dtype=t)
        out, lse = fa.forward(q, k, v, causal=causal, return_lse=True)
        assert lse.shape == (2, h, sq) and lse.dtype == torch.float32
        assert_matches(out, lse, q, k, v, 1 / math.sqrt(d), causal)


@needs_gpu
@pytest.mark.parametrize("sq", [16, 33])
def test_speculative_decoding(sq):
    # A few positions of 32 query heads over 8 K/V heads, batch 16: packed GQA tiles where
    # they are built (Hopper, d_head 128), else the split-KV kernel; causal at the bottom
    # right, the LSE checked.
    for dtype, d in built_kinds():
        t = torch_dtype(dtype)
        q = randn(16, sq, 32, d, dtype=t)
        k, v = randn(16, 2048, 8, d, dtype=t), randn(16, 2048, 8, d, dtype=t)
        out, lse = fa.forward(q, k, v, causal=True, return_lse=True)
        assert_matches(out, lse, q, k, v, 1 / math.sqrt(d), True)


@needs_gpu
@pytest.mark.parametrize("sq,sk", [(300, 1000), (1000, 300), (4, 3000)])
def test_top_left_causal_is_sdpas_is_causal(sq, sk):
    # Callers porting from SDPA: causal_alignment="top_left" is its is_causal (query i sees
    # keys j <= i), on the dense kernels and on the split-KV path forward() takes for (4, 3000).
    for dtype, d in built_kinds():
        t = torch_dtype(dtype)
        q, k, v = randn(2, sq, 4, d, dtype=t), randn(2, sk, 2, d, dtype=t), randn(2, sk, 2, d, dtype=t)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(1, 2), k.float().repeat_interleave(2, dim=2).transpose(1, 2),
            v.float().repeat_interleave(2, dim=2).transpose(1, 2), is_causal=True).transpose(1, 2)
        for out in (fa.forward(q, k, v, causal=True, causal_alignment="top_left"),
                    fa.forward_kvcache(q, k, v, causal=True, causal_alignment="top_left")):
            # The FlashAttention rule against float64 at SDPA's alignment; SDPA's own answer
            # (fp32) as a check of the semantics.
            assert_matches(out, None, q, k, v, 1 / math.sqrt(d), True, top_left=True)
            assert (out.float() - expected).abs().max().item() < 2e-2
    with pytest.raises(ValueError, match="causal_alignment"):
        fa.forward(q, k, v, causal=True, causal_alignment="top-left")


@needs_gpu
def test_lse_with_out_and_scale():
    dtype, d = built_kinds()[0]
    t = torch_dtype(dtype)
    q, k, v = (randn(1, 300, 4, d, dtype=t) for _ in range(3))
    out = torch.full_like(q, float("nan"))  # poisoned: a call that writes nothing fails
    result, lse = fa.forward(q, k, v, softmax_scale=0.2, causal=True, return_lse=True, out=out)
    assert result is out
    assert_matches(out, lse, q, k, v, 0.2, True)


@needs_gpu
def test_grouped_heads_must_divide():
    dtype, d = built_kinds()[0]
    t = torch_dtype(dtype)
    q = randn(1, 128, 6, d, dtype=t)
    kv = randn(1, 128, 4, d, dtype=t)
    with pytest.raises(ValueError, match="multiple of k's heads"):
        fa.forward(q, kv, kv)
    with pytest.raises(ValueError, match="softmax_scale"):
        fa.forward(q, q, q, softmax_scale=-1.0)


@needs_gpu
def test_custom_op_contract():
    dtype, d = built_kinds()[0]
    q, k, v = (randn(1, 256, 2, d, dtype=torch_dtype(dtype)) for _ in range(3))
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward.default, (q, k, v, None, False, None))
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward_lse.default, (q, k, v, None, True, None))


@needs_gpu
def test_torch_compile():
    dtype, d = built_kinds()[0]
    q, k, v = (randn(2, 512, 2, d, dtype=torch_dtype(dtype)) for _ in range(3))

    @torch.compile(fullgraph=True)
    def attention_then_scale(q, k, v):
        return fa.forward(q, k, v) * 2

    out = attention_then_scale(q, k, v)
    torch.testing.assert_close(out, fa.forward(q, k, v) * 2)

    @torch.compile(fullgraph=True)
    def causal_with_lse(q, k, v):
        out, lse = fa.forward(q, k, v, causal=True, return_lse=True)
        return out + 1, lse * 2

    out, lse = causal_with_lse(q, k, v)
    ref_out, ref_lse = fa.forward(q, k, v, causal=True, return_lse=True)
    torch.testing.assert_close(out, ref_out + 1)
    torch.testing.assert_close(lse, ref_lse * 2)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("warm_up", [True, False])
def test_cuda_graph_replay(causal, warm_up):
    # Causal on Hopper runs the dynamic tile schedule, whose per-launch counter becomes
    # graph allocation and memset nodes; without a warm-up its first launch (pool creation,
    # shared-memory opt-in) happens inside the capture.
    dtype, d = built_kinds()[0]
    t = torch_dtype(dtype)
    q, k, v = (randn(2, 1024, 16, d, dtype=t) for _ in range(3))
    if warm_up:
        fa.forward(q, k, v, causal=causal)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            out = fa.forward(q, k, v, causal=causal)
    for _ in range(2):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), "non-finite values in the output"
        ref, _ = masked_attention(q, k, v, 1 / math.sqrt(d), causal)
        naive, _ = masked_attention(q, k, v, 1 / math.sqrt(d), causal, dtype=q.dtype)
        assert (out.float() - ref).abs().max() <= 2 * (naive.float() - ref).abs().max() + 1e-3


@needs_gpu
@pytest.mark.parametrize("raw_getter", [True, False], ids=["raw_getter", "public_fallback"])
def test_runs_on_the_current_stream(monkeypatch, raw_getter):
    from flash_attention_scratch import _ops

    if not raw_getter:  # a PyTorch without torch._C._cuda_getCurrentRawStream
        monkeypatch.setattr(_ops, "_raw_stream", None)
    dtype, d = built_kinds()[0]
    q, k, v = (randn(4, 2048, 8, d, dtype=torch_dtype(dtype)) for _ in range(3))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # The address every launch takes is this stream's, not the default one's.
        assert _ops._current_stream(q.device) == stream.cuda_stream
        out = fa.forward(q, k, v)
        total = out.float().sum()  # ordered after the kernel on the same stream
    torch.cuda.synchronize()
    assert torch.isfinite(total)
    assert_close_to_reference(out, q, k, v)


@needs_gpu
def test_value_head_dim_of_its_own():
    """DeepSeek's MLA: q and k of head dim 192, v of 128; the output has v's head dim. Odd lengths,
    GQA, causal or not, the LSE, torch.compile."""
    dtypes = [c.dtype for c in fa.configs() if not c.backward and c.d_v == 128]
    if not dtypes:
        pytest.skip("no kernel with V's head dim 128 in this build")
    for dtype in dict.fromkeys(dtypes):
        t = torch_dtype(dtype)
        q, k, v = randn(2, 333, 8, 192, dtype=t), randn(2, 1001, 2, 192, dtype=t), randn(2, 1001, 2, 128, dtype=t)
        for causal in (False, True):
            out, lse = fa.forward(q, k, v, causal=causal, return_lse=True)
            assert out.shape == (2, 333, 8, 128)
            assert_matches(out, lse, q, k, v, 1 / math.sqrt(192), causal=causal)
        compiled = torch.compile(lambda a, b, c: fa.forward(a, b, c, causal=True), fullgraph=True)
        assert compiled(q, k, v).shape == (2, 333, 8, 128)

