"""The attention variants (issue 15): sliding window, logit softcap, attention sinks, on
forward(), forward_varlen() and forward_kvcache(), against a float64 torch reference with
the FlashAttention rule (error <= 2 x a naive same-dtype computation's + 1e-3)."""

import math

import pytest

import flash_attention_scratch as fa
from test_forward import needs_gpu

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")


def is_hopper():
    return torch.cuda.get_device_capability() == (9, 0)


def variant_attention(q, k, v, scale, causal, window=(-1, -1), softcap=0.0, sinks=None, dtype=None,
                      top_left=False, alibi=None):
    """(batch, seq, heads, d) attention in `dtype` (float64 by default) with the variants
    (alibi: (heads,) or (batch, heads) ALiBi slopes, as test_backward's reference_attention adds
    them); returns (out, lse (batch, heads, seq_q)). Rows that see nothing: zeros, lse -inf (or
    the sink)."""
    dtype = dtype or torch.float64
    group = q.shape[2] // k.shape[2]
    qt = q.to(dtype).transpose(1, 2)
    kt = k.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    vt = v.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    s = (qt @ kt.transpose(-1, -2)).to(dtype) * scale
    if softcap:
        s = (softcap * torch.tanh(s / softcap)).to(dtype)
    sq, sk = q.shape[1], k.shape[1]
    pos = torch.arange(sq, device=q.device)[:, None] + (0 if top_left else sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    if alibi is not None:
        s = s - alibi.to(dtype).reshape(-1, q.shape[2], 1, 1) * (pos - j).abs().to(dtype)
    left, right = window
    right = 0 if causal else right
    mask = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        mask |= j < pos - left
    if right >= 0:
        mask |= j > pos + right
    s = s.masked_fill(mask, float("-inf")).double()
    if sinks is not None:
        sink = sinks.double()[None, :, None, None].expand(s.shape[0], -1, sq, 1)
        s = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    out = (p.to(dtype) @ vt).to(dtype).transpose(1, 2)
    return out, lse


def check(out, lse, q, k, v, scale, **variants):
    assert torch.isfinite(out).all(), "non-finite values in the output"
    ref, ref_lse = variant_attention(q, k, v, scale, **variants)
    naive, _ = variant_attention(q, k, v, scale, dtype=q.dtype, **variants)
    ours = (out.double() - ref).abs().max().item()
    bound = 2 * (naive.double() - ref).abs().max().item() + 1e-3
    assert ours <= bound, f"max error {ours:.3g} > {bound:.3g}"
    if lse is not None:
        seen = torch.isfinite(ref_lse)
        assert torch.equal(seen, torch.isfinite(lse)), "LSE: -inf where the reference differs"
        assert (lse.double()[seen] - ref_lse[seen]).abs().max().item() <= 1e-3


@needs_torch
def test_bad_variant_arguments_name_the_argument():
    q = torch.zeros(1, 8, 2, 64, dtype=torch.float16)
    with pytest.raises((TypeError, ValueError), match="window_size"):
        fa.forward(q, q, q, window_size=4)
    with pytest.raises(TypeError, match=r"window_size\[0\]"):
        fa.forward(q, q, q, window_size=(1.5, 0))
    with pytest.raises(TypeError, match=r"window_size\[1\]: expected an int .* got a torch.float32 tensor"):
        fa.forward(q, q, q, window_size=(3, torch.tensor(0.5)))
    with pytest.raises(TypeError, match=r"window_size\[0\]"):
        fa.forward(q, q, q, window_size=torch.tensor([True, False]))
    with pytest.raises(TypeError, match="softcap"):
        fa.forward(q, q, q, softcap="50")


@needs_torch
def test_window_sides_may_be_integer_like():
    # flash_attn's own tests pass window_size = torch.randint(0, seqlen, (2,)).
    from flash_attention_scratch import _ops

    assert _ops._window(torch.tensor([5, 0])) == (5, 0)
    assert _ops._window((torch.tensor(-1), 7)) == (-1, 7)
    sides = _ops._window(torch.randint(0, 100, (2,)))
    assert all(type(side) is int for side in sides)


@needs_torch
def test_window_sides_and_softcap_are_read_before_any_work():
    """A window side past the kernels' int is a ValueError naming it (it reached the binding as
    nanobind's TypeError with a signature dump); a NumPy float is a softcap, as in flash_attn."""
    from flash_attention_scratch import _ops
    with pytest.raises(ValueError, match=r"^window_size\[0\]: expected -1 \(unbounded\) or a number of keys "
                                         r"below 2\^31, got 2147483648"):
        _ops._variants((2**31, -1), 0.0, None)
    with pytest.raises(ValueError, match=r"^window_size\[1\]: .* got -2147483649"):
        _ops._variants((-1, -2**31 - 1), 0.0, None)
    assert _ops._variants((2**31 - 1, -1), 0.0, None)[:2] == (2**31 - 1, -1)
    np = pytest.importorskip("numpy")
    softcap = _ops._variants((-1, -1), np.float32(30.0), None)[2]
    assert softcap == 30.0 and type(softcap) is float
    with pytest.raises(TypeError, match="softcap: expected a float"):
        _ops._variants((-1, -1), np.bool_(True), None)


def test_library_errors_name_the_python_arguments():
    """The C++ API's argument names in a library error become the ones a Python caller wrote
    (window_size, softcap, learnable_sink, alibi_slopes, out); other names stay as they are."""
    rename = fa._C._python_message
    assert rename("variants.window_left: expected x, got -2") == "window_size[0]: expected x, got -2"
    assert rename("variants.window_right: expected y, got 8") == "window_size[1]: expected y, got 8"
    assert rename("variants.softcap: expected z, got -1") == "softcap: expected z, got -1"
    assert rename("variants.sinks: expected a 4-byte aligned address") == \
        "learnable_sink: expected a 4-byte aligned address"
    assert rename("variants.alibi_batch_stride: expected 0") == "alibi_slopes: expected 0"
    assert rename("o.shape[1] (seq): expected 64, got 63") == "out.shape[1] (seq): expected 64, got 63"
    assert rename("o: expected memory apart from q") == "out: expected memory apart from q"
    assert rename("k_new.shape[3] (d_head): expected 128") == "k.shape[3] (d_head): expected 128"
    assert rename("pages.block_table: expected x") == "block_table: expected x"
    assert rename("descales.v: expected y") == "v_descale: expected y"
    for kept in ("offsets: expected", "d_o.shape[1] (seq): expected 64", "q: expected o", "o"):
        assert rename(kept) == kept


@needs_gpu
def test_bad_variant_values_raise():
    q = torch.randn(1, 64, 4, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match=r"window_size\[0\]: expected"):
        fa.forward(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match=r"window_size\[1\]: expected -1 or 0 with causal"):
        fa.forward(q, q, q, causal=True, window_size=(8, 8))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="^softcap: expected"):
            fa.forward(q, q, q, softcap=bad)
    sinks = torch.zeros(4, dtype=torch.float32, device="cuda")
    with pytest.raises(TypeError, match="learnable_sink.dtype"):
        fa.forward(q, q, q, learnable_sink=sinks.half())
    with pytest.raises(ValueError, match=r"learnable_sink.shape: expected \(4,\)"):
        fa.forward(q, q, q, learnable_sink=sinks[:3])
    with pytest.raises(ValueError, match="learnable_sink: expected a tensor on"):
        fa.forward(q, q, q, learnable_sink=sinks.cpu())
    # Sinks that require grad are trained, with a window too (test_backward).


CASES = [  # seq_q, seq_k, heads, heads_kv, causal, window, softcap, sinks, top_left
    (1000, 1000, 4, 2, True, (100, 0), 0.0, False, False),
    (300, 1000, 4, 4, False, (64, 32), 0.0, False, False),
    (777, 777, 4, 2, False, (128, 128), 10.0, True, False),
    (1000, 1000, 8, 2, True, (-1, -1), 0.0, True, False),
    (300, 1000, 4, 2, True, (50, 0), 30.0, True, True),
    (300, 1000, 4, 2, False, (50, 20), 0.0, False, True),  # a window's diagonal at the top left, no causal mask
    (1, 4096, 8, 2, False, (-1, -1), 0.0, True, False),  # decoding: the split-KV path
]


@needs_gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("d", [64, 128])
def test_forward_variants_match_reference(case, d):
    sq, sk, h, hkv, causal, window, softcap, with_sinks, top_left = case
    dtype = torch.bfloat16
    q = torch.randn(2, sq, h, d, dtype=dtype, device="cuda")
    k = torch.randn(2, sk, hkv, d, dtype=dtype, device="cuda")
    v = torch.randn(2, sk, hkv, d, dtype=dtype, device="cuda")
    sinks = torch.randn(h, device="cuda") * 3 if with_sinks else None
    out, lse = fa.forward(q, k, v, causal=causal, causal_alignment="top_left" if top_left else "bottom_right",
                          window_size=window, softcap=softcap, learnable_sink=sinks, return_lse=True)
    check(out, lse, q, k, v, 1 / math.sqrt(d), causal=causal, window=window, softcap=softcap, sinks=sinks,
          top_left=top_left)


@needs_gpu
def test_kvcache_decode_with_sinks_and_varlen_with_a_window():
    d, h, hkv = 128, 8, 2
    q = torch.randn(3, 1, h, d, dtype=torch.float16, device="cuda")
    kc = torch.randn(3, 2048, hkv, d, dtype=torch.float16, device="cuda")
    vc = torch.randn_like(kc)
    lens = torch.tensor([2048, 700, 1], dtype=torch.int32, device="cuda")
    sinks = torch.randn(h, device="cuda")
    out, lse = fa.forward_kvcache(q, kc, vc, cache_seqlens=lens, learnable_sink=sinks, return_lse=True)
    for b, n in enumerate(lens.tolist()):
        check(out[b:b + 1], lse[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], 1 / math.sqrt(d),
              causal=False, sinks=sinks)
    if not is_hopper():
        with pytest.raises(ValueError, match="variants: expected no sliding window or softcap here"):
            fa.forward_kvcache(q, kc, vc, cache_seqlens=lens, window_size=(64, 0))
        return
    lengths = [300, 1, 1000]
    cu = torch.tensor([0, 300, 301, 1301], dtype=torch.int32, device="cuda")
    qv = torch.randn(1301, h, d, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(1301, hkv, d, dtype=torch.bfloat16, device="cuda")
    vv = torch.randn_like(kv)
    out, lse = fa.forward_varlen(qv, kv, vv, cu, cu, 1000, 1000, causal=True, window_size=(77, 0), softcap=20.0,
                                 learnable_sink=sinks, return_lse=True)
    for b, n in enumerate(lengths):
        r = slice(cu[b].item(), cu[b].item() + n)
        check(out[None, r], lse[:, r][None], qv[None, r], kv[None, r], vv[None, r], 1 / math.sqrt(d),
              causal=True, window=(77, 0), softcap=20.0, sinks=sinks)
    # num_splits is the split-KV kernel's hint: a window or softcap runs on the sm90 kernel whatever it
    # says (flash_attn honours them with any num_splits), the same bits as with the library's choice.
    windowed = [fa.forward_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, window_size=(64, 0), softcap=30.0,
                                   num_splits=n, return_lse=True) for n in (0, 1, 4, 16)]
    for b, n in enumerate(lens.tolist()):
        check(windowed[0][0][b:b + 1], windowed[0][1][b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n],
              1 / math.sqrt(d), causal=True, window=(64, 0), softcap=30.0)
    for out_n, lse_n in windowed[1:]:
        assert torch.equal(out_n, windowed[0][0]) and torch.equal(lse_n, windowed[0][1])


@needs_gpu
def test_variants_under_torch_compile():
    q = torch.randn(1, 256, 4, 64, dtype=torch.bfloat16, device="cuda")
    sinks = torch.randn(4, device="cuda")

    @torch.compile(fullgraph=True)
    def f(q, sinks):
        return fa.forward(q, q, q, causal=True, window_size=(31, 0), softcap=10.0, learnable_sink=sinks)

    check(f(q, sinks), None, q, q, q, 1 / 8, causal=True, window=(31, 0), softcap=10.0, sinks=sinks)
