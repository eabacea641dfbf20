"""The backward pass through autograd: forward()'s and flash_attn_func()'s gradients against
a float64 PyTorch reference, determinism, gradients through the LSE, torch.compile and
CUDA-graph capture of a training step, and the arguments the backward refuses.

Accuracy rule (FlashAttention's, as its own backward tests apply it): for each of dq, dk
and dv, max |ours - ref| <= 2 * max |naive - ref| + eps(dtype) * max |ref| + 1e-4, where
ref is the same loss differentiated by PyTorch autograd in float64 (inputs upcast on the
GPU) and naive the same computation in the inputs' dtype (matmuls, scores, softmax and
every gradient rounded to fp16/bf16, as FlashAttention's "PyTorch" reference does). The
two slack terms cover errors the naive computation need not have: eps * max |ref| (one
unit in the last place at the largest gradient, twice the rounding of our fp32
accumulators to the output dtype, which a naive result can escape at its largest element)
and 1e-4 for gradients that are exactly 0 in both references but only near 0 in fp32
arithmetic (one key per row: dS = P * (dP - D) cancels exactly in float64, to ~1e-6 in
fp32 summed in two orders).

Where scores are far outside the usual range (flash_attn's overflow inputs: q and k scaled by 5
and 3), the naive error also takes the larger of autograd's and the flash formula's
(flash_formula_gradients): every flash backward forms dS = P ∘ (dP - D) with D = rowsum(dO ∘ O)
from the 16-bit O, and when P is nearly one-hot that rounding is most of the error (in a CPU
simulation of 20 seeds at d_head 256, the formula alone, exact but for O's rounding, erred up
to 6x more than autograd in bf16).
"""

import inspect
import itertools
import math
import random

import pytest

import flash_attention_scratch as fa
from test_forward import built_kinds, needs_gpu, torch_dtype

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")


def backward_kinds():
    """(DType, d_head) pairs with both a forward and a backward kernel built (the release set:
    all six)."""
    return built_kinds(backward=True)


def kind_id(kind):
    return f"{str(kind[0]).split('.')[-1]}-d{kind[1]}"


BACKWARD_KINDS = backward_kinds()
needs_backward = pytest.mark.skipif(not BACKWARD_KINDS, reason="the build holds no backward kernel")


def reference_attention(q, k, v, scale, causal=False, top_left=False, dtype=None, sinks=None, softcap=0.0,
                        window=(-1, -1), alibi=None):
    """Attention computed by PyTorch in `dtype` (float64 by default), differentiable: q
    (batch, seq_q, heads, d), k and v (batch, seq_k, heads_kv, d), K/V heads repeated for
    grouped-query attention (autograd sums their gradients back). Causal aligned at the
    bottom right, or the top left; window=(left, right): query i sees keys j with d - left <=
    j <= d + right around its diagonal position d (-1: unbounded). Returns out (batch, seq_q,
    heads, d) and lse (batch, heads, seq_q); a row that sees no key gives zeros, LSE -inf,
    and no gradient. sinks (heads,): a score per head with no value in every row's softmax
    (the LSE includes it; a row that sees no key then gives zeros and LSE = its sink).
    softcap: scores become softcap · tanh(scores / softcap) (after the scale, before the
    mask). alibi ((heads,) or (batch, heads) slopes): ALiBi, -slope · |d - j| added to score
    (i, j) after the softcap, d i's diagonal position (in `dtype`, as a naive implementation
    adds it)."""
    dtype = dtype or torch.float64
    group = q.shape[2] // k.shape[2]
    qt = q.to(dtype).transpose(1, 2)
    kt = k.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    vt = v.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    s = (qt @ kt.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    pos = torch.arange(sq, device=q.device)[:, None] + (0 if top_left else sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    if alibi is not None:
        s = s - alibi.to(dtype).reshape(-1, q.shape[2], 1, 1) * (pos - j).abs().to(dtype)
    left, right = window
    masked = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        masked |= j > pos
    if left >= 0:
        masked |= j < pos - left
    if right >= 0:
        masked |= j > pos + right
    s = s.masked_fill(masked, float("-inf"))
    if sinks is not None:
        sink = sinks.to(dtype).reshape(1, -1, 1, 1).expand(s.shape[0], -1, sq, 1)
        s = torch.cat([s, sink], dim=-1)  # the sink is finite: no row is all -inf
        p = torch.softmax(s, dim=-1)[..., :-1]
        return (p @ vt).transpose(1, 2), torch.logsumexp(s, dim=-1)
    # Rows that see no key get finite scores here and are zeroed below, so that no NaN reaches
    # autograd.
    empty = masked.all(dim=-1)
    s = s.masked_fill(empty[:, None], 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(empty[:, None], 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(empty, float("-inf"))
    return (p @ vt).transpose(1, 2), lse


def reference_gradients(q, k, v, dout, dlse, scale, causal, top_left, dtype, sinks=None, softcap=0.0,
                        window=(-1, -1), alibi=None):
    """(dq, dk, dv) of sum(out * dout) (+ sum(lse * dlse)) by autograd in `dtype`; with sinks,
    (dq, dk, dv, dsinks). ALiBi's slopes are constants (no gradient, as in flash_attn)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    if sinks is not None:
        leaves.append(sinks.detach().to(dtype).requires_grad_())
    out, lse = reference_attention(*leaves[:3], scale, causal, top_left, dtype,
                                   sinks=leaves[3] if sinks is not None else None, softcap=softcap,
                                   window=window, alibi=alibi)
    outputs, grads = [out], [dout.to(dtype)]
    if dlse is not None:
        outputs.append(lse)
        grads.append(dlse.to(lse.dtype))
    return torch.autograd.grad(outputs, leaves, grads)


def naive_sink_gradients(q, k, v, dout, dlse, scale, causal, top_left, sinks, softcap=0.0, window=(-1, -1),
                         alibi=None):
    """dsinks of two naive computations in the inputs' dtype, in float64: PyTorch's autograd,
    and the formula every flash backward uses, -sum over rows of exp(sink - LSE) * (rowsum(dO *
    O) - dLSE), on PyTorch's O and LSE in the dtype. The sum over a head's rows cancels (each
    row's term has either sign), so a 16-bit O's rounding, which the flash formula carries and
    autograd's softmax gradient does not, can be most of the error; with autograd's alone, 1 in
    100 of the packed-sequence cases failed for a simulated flash kernel (P rounded to bf16
    before PV; d_head 64 and 256, 1,000 seeds), none with the larger of the two."""
    auto = reference_gradients(q, k, v, dout, dlse, scale, causal, top_left, q.dtype, sinks, softcap, window,
                               alibi)[3]
    out, lse = reference_attention(q, k, v, scale, causal, top_left, q.dtype, sinks, softcap, window, alibi)
    delta = (out.double() * dout.double()).sum(-1).transpose(1, 2)  # (batch, heads, seq_q)
    if dlse is not None:
        delta = delta - dlse.double()
    formula = -(torch.exp(sinks.double()[None, :, None] - lse.double()) * delta).sum((0, 2))
    return auto.double(), formula


def flash_formula_gradients(q, k, v, dout, dlse, scale, causal, top_left, sinks=None, softcap=0.0,
                            window=(-1, -1), alibi=None):
    """(dq, dk, dv) by the formula every flash backward uses, D = rowsum(dO ∘ O) - dLSE with O
    rounded to the inputs' dtype, and everything else in float64. O's rounding shifts each row's
    D by delta, and dS = P ∘ (dP - D - delta) is the float64 gradient with dLSE - delta in place
    of dLSE (d LSE / d S = P), so the reference computes it."""
    out, _ = reference_attention(q, k, v, scale, causal, top_left, torch.float64, sinks, softcap, window, alibi)
    delta = ((out.to(q.dtype).double() - out) * dout.double()).sum(-1).transpose(1, 2)
    shifted = (0 if dlse is None else dlse.double()) - delta
    return reference_gradients(q, k, v, dout, shifted, scale, causal, top_left, torch.float64, sinks, softcap,
                               window, alibi)[:3]


def assert_gradients_match(ours, q, k, v, dout, dlse=None, scale=None, causal=False, top_left=False, note="",
                           sinks=None, softcap=0.0, window=(-1, -1), formula=False, alibi=None):
    """The module docstring's rule for each of dq, dk, dv (and dsinks, whose naive error is the
    larger of naive_sink_gradients'; with `formula`, dq's, dk's and dv's the larger of
    flash_formula_gradients'); also finite, contiguous, shaped like the inputs."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    variants = (sinks, softcap, window, alibi)
    ref = reference_gradients(q, k, v, dout, dlse, scale, causal, top_left, torch.float64, *variants)
    naive = list(reference_gradients(q, k, v, dout, dlse, scale, causal, top_left, q.dtype, *variants))
    if formula:
        flash = flash_formula_gradients(q, k, v, dout, dlse, scale, causal, top_left, *variants)
        naive[:3] = [[n, f] for n, f in zip(naive[:3], flash)]
    if sinks is not None:
        naive[3:] = [naive_sink_gradients(q, k, v, dout, dlse, scale, causal, top_left, *variants)]
    eps = torch.finfo(q.dtype).eps
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    for name, g, r, n, x in zip(("dq", "dk", "dv", "dsinks"), ours, ref, naive, inputs):
        assert g is not None, f"{name}: no gradient {note}"
        assert g.shape == x.shape and g.dtype == x.dtype, f"{name}: {tuple(g.shape)} {g.dtype} {note}"
        assert torch.isfinite(g).all(), f"{name}: non-finite values {note}"
        err = (g.double() - r).abs().max().item()
        naive_err = max((m.double() - r).abs().max().item() for m in (n if isinstance(n, (list, tuple)) else [n]))
        bound = 2 * naive_err + eps * r.abs().max().item() + 1e-4
        assert err <= bound, (f"{name}: max error {err:.3g} > {bound:.3g} (naive {naive_err:.3g}, "
                              f"max |ref| {r.abs().max().item():.3g}) {note}")


def seeded():
    """A fresh seed each run, returned for the failure message."""
    seed = random.randrange(2**31)
    torch.manual_seed(seed)
    return seed


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device="cuda")


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


# ---- no GPU needed ----------------------------------------------------------------

# flash_attn.flash_attn_func's parameters and defaults (flash_attn 2.6-2.8).
FLASH_ATTN_FUNC = [("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty), ("v", inspect.Parameter.empty),
                   ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                   ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                   ("return_attn_probs", False)]


def test_flash_attn_func_signature_is_flash_attns():
    assert "flash_attn_func" in fa.__all__
    params = inspect.signature(fa.flash_attn_func).parameters
    assert [(p.name, p.default) for p in params.values()] == FLASH_ATTN_FUNC
    try:
        from flash_attn import flash_attn_func as theirs
    except Exception:  # not installed (or built for another torch): the list above stands
        return
    assert list(inspect.signature(theirs).parameters) == list(params)


# flash_attn's packed functions (flash_attn 2.6-2.8): their first parameters, then
# flash_attn_func's after q, k and v.
PACKED_FUNCS = {
    "flash_attn_qkvpacked_func": ["qkv"],
    "flash_attn_kvpacked_func": ["q", "kv"],
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"],
    "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"],
}


@pytest.mark.parametrize("name", PACKED_FUNCS)
def test_packed_function_signatures_are_flash_attns(name):
    assert name in fa.__all__
    params = inspect.signature(getattr(fa, name)).parameters
    expected = [(p, inspect.Parameter.empty) for p in PACKED_FUNCS[name]] + FLASH_ATTN_FUNC[3:]
    assert [(p.name, p.default) for p in params.values()] == expected
    try:
        import flash_attn
        theirs = getattr(flash_attn, name)
    except Exception:  # not installed (or built for another torch): the list above stands
        return
    assert list(inspect.signature(theirs).parameters) == list(params)


def test_flash_attn_func_refuses_dropout_before_any_work():
    # Before any argument is read: not even a tensor is needed to get the refusal.
    with pytest.raises(NotImplementedError, match="dropout_p: expected 0.0.*got 0.1"):
        fa.flash_attn_func(None, None, None, dropout_p=0.1)
    fa.flash_attn_func.__doc__.index("S_dmask")  # documented: the third result is None


@needs_torch
def test_cpu_tensors_are_rejected_with_grad_too():
    q = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        fa.forward(q, q, q)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        fa.flash_attn_func(q, q, q, causal=True)


# ---- GPU: accuracy ----------------------------------------------------------------

GRAD_SHAPES = [  # (seq_q, seq_k, heads, heads_kv, causal, top_left)
    (1, 1, 2, 2, False, False),
    (1, 1, 2, 2, True, False),
    (17, 17, 4, 1, True, False),
    (100, 257, 8, 1, True, False),
    (257, 100, 8, 8, True, False),  # rows 0..156 see no key
    (257, 100, 4, 1, True, True),
    (100, 257, 8, 2, True, True),
    (1000, 1000, 8, 2, True, False),
    (1000, 17, 8, 1, False, False),
    (17, 1000, 4, 4, False, False),
    (1, 1000, 8, 8, True, False),
    (1000, 1, 4, 1, True, True),
]


def shape_id(s):
    return "q{}_k{}_h{}_{}{}".format(*s[:4], "_causal_" + ("tl" if s[5] else "br") if s[4] else "")


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=shape_id)
def test_gradients_match_reference(kind, shape):
    sq, sk, h, hkv, causal, top_left = shape
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q, k, v = randn(2, sq, h, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype)
    dout = randn(2, sq, h, d, dtype=dtype)
    qg, kg, vg = leaves(q, k, v)
    alignment = "top_left" if top_left else "bottom_right"
    out = fa.forward(qg, kg, vg, causal=causal, causal_alignment=alignment)
    assert out.requires_grad and out.grad_fn is not None
    out.backward(dout)
    assert_gradients_match((qg.grad, kg.grad, vg.grad), q, k, v, dout, causal=causal, top_left=top_left,
                           note=f"(seed {seed})")
    for g in (qg.grad, kg.grad, vg.grad):
        assert g.is_contiguous()


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_value_head_dim_gradients_match_reference(causal):
    """DeepSeek's MLA: q and k of head dim 192, v, out and dout of 128; odd lengths and GQA."""
    dtypes = [c.dtype for c in fa.configs() if c.backward and c.d_v == 128]
    if not dtypes:
        pytest.skip("no backward kernel with V's head dim 128 in this build")
    for dtype in dict.fromkeys(dtypes):
        t = torch_dtype(dtype)
        seed = seeded()
        q, k, v = randn(2, 333, 8, 192, dtype=t), randn(2, 1001, 2, 192, dtype=t), randn(2, 1001, 2, 128, dtype=t)
        dout = randn(2, 333, 8, 128, dtype=t)
        qg, kg, vg = leaves(q, k, v)
        out = fa.forward(qg, kg, vg, causal=causal)
        assert out.shape == dout.shape
        out.backward(dout)
        assert_gradients_match((qg.grad, kg.grad, vg.grad), q, k, v, dout, causal=causal,
                               note=f"({dtype}, seed {seed})")


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("seq", [1, 2, 5, 17, 129])
@pytest.mark.parametrize("causal", [False, True])
def test_large_scores_past_the_last_key_stay_finite(kind, seq, causal):
    """Rows whose scores all lie far below 0 (q and k scaled up, few keys), as flash_attn's
    test_flash_attn_bwd_overflow draws them: the key block's rows past seq_k must be masked, or
    their probability 2^-LSE overflows and dQ turns NaN."""
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q = randn(2, seq, 5, d, dtype=dtype) * 5
    k, v = randn(2, seq, 5, d, dtype=dtype) * 3, randn(2, seq, 5, d, dtype=dtype) * 3
    dout = randn(2, seq, 5, d, dtype=dtype)
    qg, kg, vg = leaves(q, k, v)
    fa.flash_attn_func(qg, kg, vg, causal=causal).backward(dout)
    assert_gradients_match((qg.grad, kg.grad, vg.grad), q, k, v, dout, causal=causal, note=f"(seed {seed})",
                           formula=True)


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
def test_packed_functions_gradients_match_reference(kind):
    """flash_attn's qkvpacked and kvpacked functions on packed CUDA tensors (the kernels read the
    parts as row-strided views): outputs and gradients by the FlashAttention rule, dense and
    varlen."""
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q, k, v = (randn(2, 257, 4, d, dtype=dtype) for _ in range(3))
    dout = randn(2, 257, 4, d, dtype=dtype)
    qkv = torch.stack([q, k, v], dim=2).requires_grad_()
    fa.flash_attn_qkvpacked_func(qkv, causal=True).backward(dout)
    assert_gradients_match(qkv.grad.unbind(2), q, k, v, dout, causal=True, note=f"qkvpacked (seed {seed})")
    q1, kv = q.clone().requires_grad_(), torch.stack([k[:, :100, :2], v[:, :100, :2]], dim=2).requires_grad_()
    fa.flash_attn_kvpacked_func(q1, kv, causal=True).backward(dout)
    assert_gradients_match((q1.grad, *kv.grad.unbind(2)), q, k[:, :100, :2], v[:, :100, :2], dout, causal=True,
                           note=f"kvpacked (seed {seed})")
    # Varlen: the two sequences of the batch packed one after the other.
    cu = torch.tensor([0, 257, 514], dtype=torch.int32, device="cuda")
    qkv = torch.stack([t.flatten(0, 1) for t in (q, k, v)], dim=1).requires_grad_()
    out = fa.flash_attn_varlen_qkvpacked_func(qkv, cu, 257, causal=True)
    out.backward(dout.flatten(0, 1))
    grads = [g.unflatten(0, (2, 257)) for g in qkv.grad.unbind(1)]
    assert_gradients_match(grads, q, k, v, dout, causal=True, note=f"varlen qkvpacked (seed {seed})")
    q1 = q.flatten(0, 1).clone().requires_grad_()
    kv = torch.stack([k.flatten(0, 1), v.flatten(0, 1)], dim=1).requires_grad_()
    fa.flash_attn_varlen_kvpacked_func(q1, kv, cu, cu, 257, 257, causal=True).backward(dout.flatten(0, 1))
    grads = [g.unflatten(0, (2, 257)) for g in (q1.grad, *kv.grad.unbind(1))]
    assert_gradients_match(grads, q, k, v, dout, causal=True, note=f"varlen kvpacked (seed {seed})")


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("shape", [(200, 333, 8, 2, True, False), (130, 60, 4, 4, True, True),
                                   (257, 100, 4, 2, True, False), (257, 257, 4, 1, False, False)],
                         ids=shape_id)
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out_and_lse"])
def test_sinks_gradients_match_reference(kind, shape, with_lse):
    """gpt-oss's learnable sinks: dq, dk, dv and dsinks against float64 autograd, the LSE's
    gradient included (q257 k100 bottom right: rows that see no key, whose LSE is their sink,
    and a gradient through it)."""
    sq, sk, h, hkv, causal, top_left = shape
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q, k, v = randn(2, sq, h, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype)
    sinks = torch.randn(h, device="cuda") * 2
    dout = randn(2, sq, h, d, dtype=dtype)
    qg, kg, vg, sg = leaves(q, k, v, sinks)
    alignment = "top_left" if top_left else "bottom_right"
    out, lse = fa.forward(qg, kg, vg, causal=causal, causal_alignment=alignment, learnable_sink=sg, return_lse=True)
    dlse = torch.randn_like(lse) if with_lse else None
    torch.autograd.backward([out, lse] if with_lse else [out], [dout, dlse] if with_lse else [dout])
    assert_gradients_match((qg.grad, kg.grad, vg.grad, sg.grad), q, k, v, dout, dlse, causal=causal,
                           top_left=top_left, note=f"(seed {seed})", sinks=sinks)


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("shape", [(200, 333, 8, 2, True, False), (257, 100, 4, 2, True, False),
                                   (130, 130, 4, 4, False, False)], ids=shape_id)
@pytest.mark.parametrize("softcap", [2.0, 5.0])  # caps the test's scores (std ~2) bend
def test_softcap_gradients_match_reference(kind, shape, softcap):
    """Gemma-2's logit softcap: dq, dk, dv through tanh's derivative against float64 autograd,
    every built head dim (Gemma-2 9B is d_head 256); with sinks too on the first shape."""
    sq, sk, h, hkv, causal, top_left = shape
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q, k, v = randn(2, sq, h, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype)
    # Scores of a few units: a softcap of 5 bends them, 30 barely.
    q = q * 2
    dout = randn(2, sq, h, d, dtype=dtype)
    sinks = torch.randn(h, device="cuda") if sq == 200 else None
    x = leaves(q, k, v) + ([sinks.clone().requires_grad_()] if sinks is not None else [])
    out = fa.forward(*x[:3], causal=causal, softcap=softcap, learnable_sink=x[3] if sinks is not None else None)
    out.backward(dout)
    assert_gradients_match([t.grad for t in x], q, k, v, dout, causal=causal, top_left=top_left,
                           note=f"(softcap {softcap}, seed {seed})", sinks=sinks, softcap=softcap)


# Windows (left, right) with causal or not, on shapes where whole key blocks fall outside them,
# both alignments, seq_q != seq_k, rows that see no key; composed with the softcap, the sinks,
# GQA and the LSE's gradient.
WINDOW_CASES = [  # (seq_q, seq_k, heads, heads_kv, causal, top_left), window, softcap, sinks, dlse
    ((700, 700, 4, 2, True, False), (100, 0), 0.0, False, False),
    ((700, 700, 4, 4, False, False), (64, 200), 0.0, False, True),
    ((333, 900, 8, 2, True, False), (129, 0), 0.0, False, False),
    ((900, 333, 4, 1, True, True), (37, 0), 0.0, True, False),
    ((500, 500, 4, 2, False, False), (0, 0), 0.0, False, False),
    ((640, 513, 4, 4, False, True), (-1, 100), 0.0, False, False),
    ((700, 700, 4, 2, True, False), (255, 0), 5.0, False, False),
    ((450, 700, 8, 2, False, False), (90, 90), 5.0, True, True),
]


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: f"{shape_id(c[0])}-w{c[1][0]}_{c[1][1]}"
                         f"{'-softcap' if c[2] else ''}{'-sinks' if c[3] else ''}{'-dlse' if c[4] else ''}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_window_gradients_match_reference(kind, case, deterministic):
    """Sliding windows (Mistral, Gemma-2/3 local layers, gpt-oss): dq, dk, dv (and dsinks)
    against float64 autograd, every built head dim; deterministic runs twice, bitwise equal."""
    (sq, sk, h, hkv, causal, top_left), window, softcap, with_sinks, with_lse = case
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q, k, v = randn(2, sq, h, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype)
    if softcap:
        q = q * 2  # scores of a few units, which a cap of 5 bends
    dout = randn(2, sq, h, d, dtype=dtype)
    sinks = torch.randn(h, device="cuda") * 2 if with_sinks else None
    dlse = torch.randn(2, h, sq, device="cuda") if with_lse else None
    alignment = "top_left" if top_left else "bottom_right"

    def run():
        x = leaves(q, k, v) + ([sinks.clone().requires_grad_()] if with_sinks else [])
        out, lse = fa.forward(*x[:3], causal=causal, causal_alignment=alignment, window_size=window,
                              softcap=softcap, learnable_sink=x[3] if with_sinks else None, return_lse=True,
                              deterministic=deterministic)
        torch.autograd.backward([out, lse] if with_lse else [out], [dout, dlse] if with_lse else [dout])
        return [t.grad for t in x]

    grads = run()
    assert_gradients_match(grads, q, k, v, dout, dlse, causal=causal, top_left=top_left, sinks=sinks,
                           softcap=softcap, window=window, note=f"(window {window}, seed {seed})")
    if deterministic:
        again = run()
        for name, a, b in zip(("dq", "dk", "dv", "dsinks"), grads, again):
            assert torch.equal(a, b), f"{name}: deterministic run differs (window {window}, seed {seed})"


# Packed sequences: lengths 0 to 3000 (empty and one-token sequences among them), keys cut by
# seqused_k, two rows past the last offset; causal at either corner (False, "bottom_right",
# "top_left"), windows, a softcap and sinks; GQA.
VARLEN_CASES = [  # query lengths, key lengths, seqused_k, heads, heads_kv, causal, window, softcap, sinks
    ([300, 0, 1, 129, 64, 257], [300, 5, 1, 129, 200, 257], None, 8, 2, "bottom_right", (-1, -1), 0.0, False),
    ([100, 37, 250], [300, 64, 250], [280, 0, 250], 4, 4, False, (-1, -1), 0.0, True),
    ([200, 1, 180], [200, 130, 180], None, 4, 2, "bottom_right", (63, 0), 0.0, False),
    ([150, 77], [150, 300], None, 4, 1, False, (40, 40), 5.0, True),
    ([3000, 0, 1500, 2999], [2500, 7, 3000, 3001], None, 8, 2, "top_left", (-1, -1), 0.0, True),
]


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{len(c[0])}seqs-{c[5] or 'full'}"
                         f"-w{c[6][0]}_{c[6][1]}{'-softcap' if c[7] else ''}{'-sinks' if c[8] else ''}"
                         f"{'-seqused' if c[2] else ''}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_varlen_gradients_match_reference(kind, case, deterministic):
    """forward_varlen's backward: each sequence's dq, dk, dv against float64 autograd of that
    sequence alone (the FlashAttention rule), dsinks against their sum over the sequences; rows
    no sequence uses get zeros; deterministic runs twice, bitwise equal."""
    lens_q, lens_k, used, h, hkv, alignment, window, softcap, with_sinks = case
    causal, top_left = bool(alignment), alignment == "top_left"
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device="cuda")
    seqused = None if used is None else torch.tensor(used, dtype=torch.int32, device="cuda")
    total_q, total_k = sum(lens_q) + 2, sum(lens_k) + 2
    q, k, v = randn(total_q, h, d, dtype=dtype), randn(total_k, hkv, d, dtype=dtype), randn(total_k, hkv, d, dtype=dtype)
    if softcap:
        q = q * 2
    dout = randn(total_q, h, d, dtype=dtype)
    sinks = torch.randn(h, device="cuda") * 2 if with_sinks else None
    # Rows no sequence uses hold NaN (a buffer's unwritten tail): nothing may reach the gradients.
    q[-2:], dout[-2:], k[-2:], v[-2:] = float("nan"), float("nan"), float("nan"), float("nan")
    for b in range(len(lens_k)):
        if used is not None:
            k[int(cu_k[b]) + used[b]:int(cu_k[b + 1])] = float("nan")
            v[int(cu_k[b]) + used[b]:int(cu_k[b + 1])] = float("nan")

    def run():
        x = leaves(q, k, v) + ([sinks.clone().requires_grad_()] if with_sinks else [])
        out = fa.forward_varlen(*x[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                causal_alignment="top_left" if top_left else "bottom_right", seqused_k=seqused,
                                window_size=window, softcap=softcap, learnable_sink=x[3] if with_sinks else None,
                                deterministic=deterministic)
        out.backward(dout)
        return [t.grad for t in x]

    grads = run()
    note = f"(window {window}, seed {seed})"
    for g in grads[:3]:
        assert torch.isfinite(g).all() and not g[-2:].any(), f"rows no sequence uses got a gradient {note}"
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    sink_ref, sink_naive = 0.0, (0.0, 0.0)
    for b, lq in enumerate(lens_q):
        lk = lens_k[b] if used is None else used[b]
        rows, keys = slice(starts_q[b], starts_q[b] + lq), slice(starts_k[b], starts_k[b] + lk)
        unused = slice(starts_k[b] + lk, starts_k[b + 1])
        assert not grads[1][unused].any() and not grads[2][unused].any(), f"keys past seqused_k {note}"
        if lq == 0 or lk == 0:
            assert not grads[0][rows].any(), f"queries that see no key {note}"
            continue
        # dq, dk and dv of the sequence alone (with sinks, in its softmax).
        sequence = (q[None, rows], k[None, keys], v[None, keys], dout[None, rows])
        assert_gradients_match([grads[0][None, rows], grads[1][None, keys], grads[2][None, keys]], *sequence,
                               causal=causal, top_left=top_left, softcap=softcap, window=window, sinks=sinks,
                               note=f"sequence {b}, lengths {lq} and {lk} {note}")
        if with_sinks:
            scale = 1 / math.sqrt(d)
            sink_ref = sink_ref + reference_gradients(*sequence, None, scale, causal, top_left, torch.float64, sinks,
                                                      softcap, window)[3]
            each = naive_sink_gradients(*sequence, None, scale, causal, top_left, sinks, softcap, window)
            sink_naive = tuple(total + n for total, n in zip(sink_naive, each))
    if with_sinks:  # summed over the sequences, by the module's rule
        err = (grads[3].double() - sink_ref).abs().max().item()
        naive_err = max((n - sink_ref).abs().max().item() for n in sink_naive)
        bound = 2 * naive_err + torch.finfo(q.dtype).eps * sink_ref.abs().max().item() + 1e-4
        assert err <= bound, (f"dsinks: max error {err:.3g} > {bound:.3g} (naive {naive_err:.3g}, max |ref| "
                              f"{sink_ref.abs().max().item():.3g}) {note}")
    if deterministic:
        again = run()
        for name, a, b in zip(("dq", "dk", "dv", "dsinks"), grads, again):
            assert torch.equal(a, b), f"{name}: deterministic run differs {note}"


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
def test_scale_strided_inputs_and_broadcast_dout(kind):
    # SDPA's (batch, heads, seq, d) storage seen through a transpose, slices of a packed QKV
    # tensor, a scale of its own, and out.sum()'s gradient (a stride-0 view) as dout.
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q_sdpa = randn(2, 4, 300, d, dtype=dtype).requires_grad_()
    kv = randn(2, 500, 2, 2, d, dtype=dtype).requires_grad_()
    q, k, v = q_sdpa.transpose(1, 2), kv[:, :, 0], kv[:, :, 1]
    out = fa.forward(q, k, v, softmax_scale=0.3, causal=True)
    out.sum().backward()  # dout: a bf16/fp16 one broadcast with stride 0, copied before the kernels
    dout = torch.ones_like(out)
    dq, dkv = q_sdpa.grad.transpose(1, 2), kv.grad
    assert_gradients_match((dq, dkv[:, :, 0], dkv[:, :, 1]), q, k, v, dout, scale=0.3, causal=True,
                           note=f"(seed {seed})")


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("only_lse", [False, True], ids=["out_and_lse", "lse_only"])
def test_gradient_through_the_lse(kind, only_lse):
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    for sq, sk, h, hkv, causal, top_left in [(257, 100, 8, 2, True, False), (300, 777, 4, 1, True, True),
                                             (129, 129, 4, 4, False, False)]:
        q, k, v = randn(2, sq, h, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype)
        dout = torch.zeros_like(q) if only_lse else randn(2, sq, h, d, dtype=dtype)
        dlse = torch.randn(2, h, sq, device="cuda")
        qg, kg, vg = leaves(q, k, v)
        out, lse = fa.forward(qg, kg, vg, causal=causal, causal_alignment="top_left" if top_left else "bottom_right",
                              return_lse=True)
        assert lse.requires_grad and lse.dtype == torch.float32
        seen = torch.isfinite(lse).detach()  # rows that see no key: LSE -inf, left out of the loss
        loss = (lse.masked_fill(~seen, 0.0) * dlse).sum()
        if not only_lse:
            loss = loss + (out.float() * dout.float()).sum()
        loss.backward()
        assert_gradients_match((qg.grad, kg.grad, vg.grad), q, k, v, dout, dlse * seen, causal=causal,
                               top_left=top_left, note=f"({sq}, {sk}, seed {seed})")


@needs_gpu
@needs_backward
def test_flash_attn_func_gradients_and_results():
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    seed = seeded()
    q, k, v = randn(2, 200, 8, d, dtype=dtype), randn(2, 333, 2, d, dtype=dtype), randn(2, 333, 2, d, dtype=dtype)
    dout = randn(2, 200, 8, d, dtype=dtype)
    for kwargs in (dict(causal=True), dict(), dict(window_size=(-1, 0)), dict(causal=True, window_size=(5000, -1)),
                   dict(causal=True, deterministic=True, softmax_scale=0.2)):
        qg, kg, vg = leaves(q, k, v)
        out, lse, s_dmask = fa.flash_attn_func(qg, kg, vg, return_attn_probs=True, **kwargs)
        assert s_dmask is None and lse.shape == (2, 8, 200)
        out.backward(dout)
        causal = kwargs.get("causal", False) or kwargs.get("window_size") == (-1, 0)
        assert_gradients_match((qg.grad, kg.grad, vg.grad), q, k, v, dout, scale=kwargs.get("softmax_scale"),
                               causal=causal, note=f"({kwargs}, seed {seed})")
        # The same as forward(), bit for bit (causal: bottom right).
        ref = fa.forward(q, k, v, causal=causal, softmax_scale=kwargs.get("softmax_scale"))
        assert torch.equal(out.detach(), ref)
    assert fa.flash_attn_func(q, k, v).shape == q.shape  # out alone by default
    # Head dims that are not contiguous are copied, as flash_attn's maybe_contiguous does; the
    # gradients reach the strided leaves.
    qg, kg, vg = leaves(*(t.transpose(2, 3).contiguous().transpose(2, 3) for t in (q, k, v)))
    assert all(t.stride(-1) != 1 for t in (qg, kg, vg))
    out = fa.flash_attn_func(qg, kg, vg, causal=True)
    assert torch.equal(out.detach(), fa.forward(q, k, v, causal=True))
    out.backward(dout)
    assert_gradients_match((qg.grad, kg.grad, vg.grad), q, k, v, dout, causal=True,
                           note=f"(strided head dims, seed {seed})")


# ---- GPU: determinism, None gradients, eager paths ---------------------------------


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
def test_backward_is_deterministic(kind):
    dtype, d = torch_dtype(kind[0]), kind[1]
    qg, kg, vg = leaves(randn(2, 1000, 8, d, dtype=dtype), randn(2, 777, 2, d, dtype=dtype),
                        randn(2, 777, 2, d, dtype=dtype))
    out = fa.forward(qg, kg, vg, causal=True, deterministic=True)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    # Every run's gradients kept alive, so that no run's outputs land in blocks the caching
    # allocator freed from an earlier run (whose bits a run that wrote nothing would keep).
    runs = [torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True) for _ in range(9)]
    for again in runs:
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs between two runs of the same backward"


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
def test_a_rows_gradients_do_not_depend_on_the_batch(kind):
    # The backward op on batch 4 and on batch row 2 alone, from the same forward's O and LSE
    # (the forward's own kernel choice may depend on the batch; the backward's may not).
    dtype, d = torch_dtype(kind[0]), kind[1]
    q, k, v = randn(4, 513, 8, d, dtype=dtype), randn(4, 700, 2, d, dtype=dtype), randn(4, 700, 2, d, dtype=dtype)
    out, lse = fa.forward(q, k, v, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    backward = torch.ops.flash_attention_scratch.backward
    whole = backward(dout, q, k, v, out, lse, None, 1, dlse, True)
    row = backward(*(t[2:3] for t in (dout, q, k, v, out, lse)), None, 1, dlse[2:3], True)
    for name, a, b in zip(("dq", "dk", "dv"), whole, row):
        assert torch.equal(a[2:3], b), f"{name}: batch row 2 differs alone and in a batch of 4"


@needs_gpu
@needs_backward
def test_inputs_without_grad_get_none_and_grads_are_finite():
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q, k, v = (randn(2, 300, 4, d, dtype=dtype) for _ in range(3))
    for wants in ("q", "k", "v", "qv", "kv"):
        args = {n: (t.clone().requires_grad_() if n in wants else t) for n, t in zip("qkv", (q, k, v))}
        fa.forward(args["q"], args["k"], args["v"], causal=True).float().pow(2).sum().backward()
        for n in "qkv":
            g = args[n].grad
            if n in wants:
                assert g is not None and torch.isfinite(g).all() and g.abs().max() > 0, f"{n}.grad"
            else:
                assert g is None, f"{n} does not require grad, yet got a gradient"


@needs_gpu
@needs_backward
def test_without_grad_the_fast_path_runs(monkeypatch):
    # No graph, and no LSE allocated, whenever autograd records nothing.
    from flash_attention_scratch import _ops

    def no_lse(q):
        raise AssertionError("an LSE was allocated for a call that does not need one")

    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q = randn(1, 256, 2, d, dtype=dtype).requires_grad_()
    monkeypatch.setattr(_ops, "_lse_like", no_lse)
    with torch.no_grad():
        assert fa.forward(q, q, q).grad_fn is None
    with torch.inference_mode():
        assert not fa.forward(q, q, q).requires_grad
    assert fa.forward(q.detach(), q.detach(), q.detach()).grad_fn is None
    monkeypatch.undo()
    assert fa.forward(q, q, q).requires_grad  # with grad: forward_lse, and its LSE


@needs_gpu
@needs_backward
def test_the_forward_op_itself_is_differentiable():
    # torch.ops.flash_attention_scratch.forward saves no LSE: its backward runs the forward
    # again for it, and gives forward()'s gradients bit for bit (deterministic: the default
    # kernel's dQ may differ in the last bits from run to run).
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q, k, v = randn(2, 300, 8, d, dtype=dtype), randn(2, 400, 2, d, dtype=dtype), randn(2, 400, 2, d, dtype=dtype)
    dout = torch.randn_like(q)
    a, b = leaves(q, k, v), leaves(q, k, v)
    torch.ops.flash_attention_scratch.forward(*a, None, 1, None, deterministic=True).backward(dout)
    fa.forward(*b, causal=True, deterministic=True).backward(dout)
    for x, y in zip(a, b):
        assert torch.equal(x.grad, y.grad)


@needs_gpu
@needs_backward
def test_forward_config_is_allowed_with_grad():
    configs = [c for c in fa.configs() if not c.backward and c.is_supported() and (c.dtype, c.d_head) in BACKWARD_KINDS]
    if not configs:
        pytest.skip("no forward config runs here for a built backward kind")
    c = configs[0]
    q, k, v = (randn(1, 256, 2, c.d_head, dtype=torch_dtype(c.dtype)) for _ in range(3))
    dout = torch.randn_like(q)
    qg, kg, vg = leaves(q, k, v)
    fa.forward(qg, kg, vg, config=c, causal=True).backward(dout)
    assert_gradients_match((qg.grad, kg.grad, vg.grad), q, k, v, dout, causal=True)


@needs_gpu
@needs_backward
def test_custom_op_contract():
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q, k, v = randn(2, 200, 4, d, dtype=dtype), randn(2, 300, 2, d, dtype=dtype), randn(2, 300, 2, d, dtype=dtype)
    out, lse = fa.forward(q, k, v, causal=True, return_lse=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    backward = torch.ops.flash_attention_scratch.backward.default
    torch.library.opcheck(backward, (dout, q, k, v, out, lse, None, 1, None))
    torch.library.opcheck(backward, (dout, q, k, v, out, lse, 0.1, 2, dlse))
    # The forward ops with inputs that require grad: their autograd registrations.
    qg, kg, vg = leaves(q, k, v)
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward_lse.default, (qg, kg, vg, None, 1, None))
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward.default, (qg, kg, vg, None, 0, None))


# ---- GPU: torch.compile and CUDA graphs ----------------------------------------------


@needs_gpu
@needs_backward
def test_torch_compile_traces_forward_and_backward():
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q, k, v = randn(2, 512, 8, d, dtype=dtype), randn(2, 512, 2, d, dtype=dtype), randn(2, 512, 2, d, dtype=dtype)
    dout = torch.randn_like(q)
    dlse = torch.randn(2, 8, 512, device="cuda")

    def loss_fn(q, k, v):
        out, lse = fa.forward(q, k, v, causal=True, return_lse=True)
        return (out.float() * dout).sum() + (lse * dlse).sum()

    def flash_attn_loss(q, k, v):
        return (fa.flash_attn_func(q, k, v, causal=True).float() * dout).sum()

    for fn in (loss_fn, flash_attn_loss):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True)
        eager, traced = leaves(q, k, v), leaves(q, k, v)
        fn(*eager).backward()
        loss = compiled(*traced)
        loss.backward()
        # The same kernels on the same inputs (the loss's gradient is dout itself): bit for bit.
        for name, a, b in zip("qkv", eager, traced):
            assert b.grad is not None and torch.equal(a.grad, b.grad), f"d{name} differs compiled"


@needs_gpu
@needs_backward
def test_cuda_graph_training_step():
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q, k, v = leaves(randn(2, 1000, 8, d, dtype=dtype), randn(2, 1000, 2, d, dtype=dtype),
                     randn(2, 1000, 2, d, dtype=dtype))
    dout = randn(2, 1000, 8, d, dtype=dtype)
    dlse = torch.randn(2, 8, 1000, device="cuda")

    # deterministic: the replay is compared bitwise with an eager run, and the default backward's
    # dQ adds land in any order (one such run differed in its last bits on an H100, 2026-12-07)
    def step():
        out, lse = fa.forward(q, k, v, causal=True, return_lse=True, deterministic=True)
        torch.autograd.backward([out, lse], [dout, dlse])
        return out

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture's stream, as PyTorch's guide does
        for _ in range(2):
            for t in (q, k, v):
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(stream)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    grads = [t.grad for t in (q, k, v)]
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
            dlse.copy_(torch.randn_like(dlse))
        graph.replay()
        torch.cuda.synchronize()
        eager = leaves(q, k, v)
        eager_out, eager_lse = fa.forward(*eager, causal=True, return_lse=True, deterministic=True)
        torch.autograd.backward([eager_out, eager_lse], [dout, dlse])
        assert torch.equal(out, eager_out.detach())
        for name, g, e in zip("qkv", grads, eager):
            assert torch.isfinite(g).all() and torch.equal(g, e.grad), f"d{name}: replay differs from eager"


# ---- GPU: what the backward refuses --------------------------------------------------


@needs_gpu
def test_out_with_grad_raises_before_the_forward_runs(monkeypatch):
    from flash_attention_scratch import _ops

    def ran(*args, **kwargs):
        raise AssertionError("the forward ran")

    dtype, d = built_kinds()[0]
    q = randn(1, 128, 4, d, dtype=torch_dtype(dtype))
    qg = q.clone().requires_grad_()
    monkeypatch.setattr(_ops, "_run", ran)
    with pytest.raises(RuntimeError, match="out= tensor cannot carry an autograd graph"):
        fa.forward(qg, q, q, out=torch.empty_like(q))
    monkeypatch.undo()
    with torch.no_grad():
        fa.forward(qg, q, q, out=torch.empty_like(q))


@needs_gpu
def test_dropout_raises():
    q = randn(1, 128, 4, 64, dtype=torch.bfloat16).requires_grad_()
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fa.flash_attn_func(q, q, q, dropout_p=0.1)


@needs_gpu
@needs_backward
def test_double_backward_raises():
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q = randn(1, 64, 2, d, dtype=dtype).requires_grad_()
    out = fa.forward(q, q, q)
    (dq,) = torch.autograd.grad(out.float().sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        dq.float().sum().backward()
