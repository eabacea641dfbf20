"""The autograd wiring without a GPU: the custom ops' CUDA kernels are stood in for, on CPU
tensors, by float64 PyTorch kernels registered for this module only (a library fragment
destroyed afterwards), and forward()'s CUDA-tensor check is relaxed. What runs is the
package's own code: forward()'s and flash_attn_func()'s choice of op, the ops' autograd
(setup_context, backward, the recompute of the plain op), the fake implementations that
torch.compile traces, and the refusals before any work. The kernels' accuracy is
test_backward's, on a GPU.

The stand-in backward computes the gradients the way the library does (D = rowsum(dO * O),
dS = P * (dP - D + dLSE)), so agreement with PyTorch's autograd also checks that the dLSE
the wiring passes is the gradient of the LSE.
"""

import itertools

import pytest

import flash_attention_scratch as fa
from test_backward import reference_attention

try:
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.skipif(torch is None, reason="needs PyTorch")

CALLS = []  # (op, details) of every stand-in kernel call


def _scale(q, softmax_scale):
    return q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale


def _shape(t):
    """What a call record keeps of an optional tensor argument: its shape, or None."""
    return None if t is None else tuple(t.shape)


def _standin_forward_lse(q, k, v, softmax_scale, causal, config, window_left=-1, window_right=-1, softcap=0.0,
                         sinks=None, alibi_slopes=None, deterministic=False):
    CALLS.append(("forward_lse", dict(causal=causal, window=(window_left, window_right), softcap=softcap,
                                      sinks=sinks is not None, alibi=_shape(alibi_slopes))))
    out, lse = reference_attention(q, k, v, _scale(q, softmax_scale), causal in (1, 2), causal >= 2, sinks=sinks,
                                   softcap=softcap, window=(window_left, window_right), alibi=alibi_slopes)
    return out.to(q.dtype).contiguous(), lse.float().contiguous()


def _standin_forward(*args):
    out, _ = _standin_forward_lse(*args)
    CALLS[-1] = ("forward", CALLS[-1][1])
    return out


def _standin_backward(dout, q, k, v, out, lse, softmax_scale, causal, dlse=None, deterministic=False, sinks=None,
                      softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None):
    """The library's algorithm in float64: P from the saved LSE (which includes the sinks),
    D = rowsum(dO * O) - dLSE, dsinks = -sum over rows of exp(sink - LSE) * D; with a softcap,
    the scores softcap * tanh(s / softcap) and dS through tanh's derivative; a window's mask;
    ALiBi's bias on the scores (a constant: dS as without it)."""
    CALLS.append(("backward", dict(dlse=dlse is not None, causal=causal, dout_layout=dout.stride(),
                                   deterministic=deterministic, sinks=sinks is not None, softcap=softcap,
                                   window=(window_left, window_right), alibi=_shape(alibi_slopes))))
    scale = _scale(q, softmax_scale)
    b, sq, h = q.shape[:3]
    sk, hkv = k.shape[1], k.shape[2]
    group = h // hkv
    qt, dot, ot = (t.double().transpose(1, 2) for t in (q, dout, out))
    kt, vt = (t.double().transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v))
    s = (qt @ kt.transpose(-1, -2)) * scale
    slope = 1.0
    if softcap:
        t = torch.tanh(s / softcap)
        s, slope = softcap * t, 1 - t * t
    masked = torch.zeros(sq, sk, dtype=torch.bool)
    i = torch.arange(sq)[:, None] + (0 if causal >= 2 else sk - sq)
    j = torch.arange(sk)[None, :]
    if alibi_slopes is not None:
        s = s - alibi_slopes.double().reshape(-1, h, 1, 1) * (i - j).abs()
    if causal in (1, 2):
        masked |= j > i
    if window_left >= 0:
        masked |= j < i - window_left
    if window_right >= 0:
        masked |= j > i + window_right
    lse = lse.double()[..., None]
    p = torch.where(masked | torch.isinf(lse), 0.0, torch.exp(s - lse.nan_to_num(neginf=0.0)))
    dp = dot @ vt.transpose(-1, -2)
    delta = (dot * ot).sum(-1, keepdim=True) - (0.0 if dlse is None else dlse.double()[..., None])
    ds = p * (dp - delta) * slope
    dsinks = torch.empty(0, dtype=torch.float32)
    if sinks is not None:
        dsinks = -(torch.exp(sinks.double()[None, :, None, None] - lse) * delta).sum((0, 2, 3)).float()
    dq = (ds @ kt) * scale
    dk = (ds.transpose(-1, -2) @ qt) * scale
    dv = p.transpose(-1, -2) @ dot
    dk, dv = (t.view(b, hkv, group, sk, t.shape[-1]).sum(2) for t in (dk, dv))  # dv: V's head dim
    return (*(t.transpose(1, 2).to(q.dtype).contiguous() for t in (dq, dk, dv)), dsinks)


def _sequences(cu_seqlens_q, cu_seqlens_k, seqused_k):
    """Each packed sequence's (query rows, key rows) slices."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cu_q) - 1):
        used = cu_k[b + 1] - cu_k[b] if seqused_k is None else int(seqused_k[b])
        yield slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b] + used)


def _sequence_slopes(alibi_slopes, b):
    """Sequence b's ALiBi slopes: its row of (batch, heads) slopes, or the batch's (heads,)."""
    return alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes


def _standin_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q,
                            max_seqlen_k, softmax_scale, causal, num_splits, window_left=-1, window_right=-1,
                            softcap=0.0, sinks=None, alibi_slopes=None, deterministic=False):
    """forward_varlen as each sequence's dense forward_lse stand-in (rows no sequence uses: zeros)."""
    CALLS.append(("forward_varlen", dict(causal=causal, window=(window_left, window_right), softcap=softcap,
                                         sinks=sinks is not None, alibi=_shape(alibi_slopes),
                                         deterministic=deterministic)))
    out = q.new_zeros((*q.shape[:-1], v.shape[-1]))  # V's head dim (DeepSeek's MLA)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32)
    for b, (rows, keys) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k, seqused_k)):
        o, l = reference_attention(q[None, rows], k[None, keys], v[None, keys], _scale(q, softmax_scale),
                                   causal in (1, 2), causal >= 2, sinks=sinks, softcap=softcap,
                                   window=(window_left, window_right), alibi=_sequence_slopes(alibi_slopes, b))
        out[rows], lse[:, rows] = o[0].to(q.dtype), l[0].float()
    return out, lse


def _standin_backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                             max_seqlen_k, softmax_scale, causal, dlse=None, deterministic=False, sinks=None,
                             softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None):
    """backward_varlen as each sequence's dense backward stand-in; zeros where no sequence is."""
    CALLS.append(("backward_varlen", dict(dlse=dlse is not None, causal=causal, deterministic=deterministic,
                                          sinks=sinks is not None, softcap=softcap,
                                          window=(window_left, window_right), alibi=_shape(alibi_slopes))))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dsinks = torch.zeros(0 if sinks is None else q.shape[1], dtype=torch.float32)
    for b, (rows, keys) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k, seqused_k)):
        g = _standin_backward(dout[None, rows], q[None, rows], k[None, keys], v[None, keys], out[None, rows],
                              lse[None, :, rows], softmax_scale, causal,
                              None if dlse is None else dlse[None, :, rows], deterministic, sinks, softcap,
                              window_left, window_right, _sequence_slopes(alibi_slopes, b))
        CALLS.pop()
        dq[rows], dk[keys], dv[keys] = g[0][0], g[1][0], g[2][0]
        if sinks is not None:
            dsinks += g[3]
    return dq, dk, dv, dsinks


@pytest.fixture(scope="module")
def standins():
    lib = torch.library.Library("flash_attention_scratch", "FRAGMENT")
    lib.impl("forward_lse", _standin_forward_lse, "CPU")
    lib.impl("forward", _standin_forward, "CPU")
    lib.impl("backward", _standin_backward, "CPU")
    lib.impl("forward_varlen", _standin_forward_varlen, "CPU")
    lib.impl("backward_varlen", _standin_backward_varlen, "CPU")
    yield
    lib._destroy()


@pytest.fixture
def cpu(standins, monkeypatch):
    """forward() takes CPU tensors of any float dtype (its other checks stay)."""
    from flash_attention_scratch import _ops

    def check(name, t, device=None):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")

    monkeypatch.setattr(_ops, "_check", check)
    CALLS.clear()
    yield CALLS


def inputs(sq, sk, h, hkv, d=16, b=2, dtype=torch.float64 if torch else None):
    q = torch.randn(b, sq, h, d, dtype=dtype)
    k = torch.randn(b, sk, hkv, d, dtype=dtype)
    v = torch.randn(b, sk, hkv, d, dtype=dtype)
    return q, k, v


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def reference_grads(q, k, v, dout, dlse=None, scale=None, causal=False, top_left=False):
    x = leaves(q, k, v)
    out, lse = reference_attention(*x, scale or q.shape[-1] ** -0.5, causal, top_left)
    outputs, grads = [out], [dout]
    if dlse is not None:
        outputs.append(lse)
        grads.append(dlse)
    return torch.autograd.grad(outputs, x, grads)


def assert_same(ours, ref):
    for name, a, b in zip(("dq", "dk", "dv"), ours, ref):
        assert a is not None, f"{name}: None"
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


CASES = [  # seq_q, seq_k, heads, heads_kv, causal, top_left
    (5, 9, 2, 2, False, False),
    (9, 5, 4, 1, True, False),  # rows 0..3 see no key
    (9, 5, 4, 2, True, True),
    (7, 7, 8, 2, True, False),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out_and_lse"])
def test_gradients_flow_through_forward_lse(cpu, case, with_lse):
    sq, sk, h, hkv, causal, top_left = case
    q, k, v = inputs(sq, sk, h, hkv)
    dout = torch.randn_like(q)
    x = leaves(q, k, v)
    alignment = "top_left" if top_left else "bottom_right"
    if with_lse:
        out, lse = fa.forward(*x, causal=causal, causal_alignment=alignment, return_lse=True)
        seen = torch.isfinite(lse).detach()
        dlse = torch.randn_like(lse) * seen
        torch.autograd.backward([out, lse], [dout, dlse.float()])
    else:
        dlse = None
        fa.forward(*x, causal=causal, causal_alignment=alignment).backward(dout)
    assert [c[0] for c in cpu] == ["forward_lse", "backward"]
    assert cpu[0][1]["causal"] == (2 if top_left else 1 if causal else 0)
    assert cpu[1][1]["dlse"] == with_lse, "dlse must be None when the LSE does not reach the loss"
    assert_same([t.grad for t in x], reference_grads(q, k, v, dout, dlse, causal=causal, top_left=top_left))
    for t, g in zip((q, k, v), (t.grad for t in x)):
        assert g.shape == t.shape and g.is_contiguous()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out_and_lse"])
def test_sinks_get_their_gradient(cpu, case, with_lse):
    """learnable_sink requiring grad: the recorded op saves the sinks, the backward op gets them
    and returns dsinks, which autograd hands to the sinks (float32, shaped like them)."""
    sq, sk, h, hkv, causal, top_left = case
    q, k, v = inputs(sq, sk, h, hkv)
    sinks = torch.randn(h, dtype=torch.float32)
    dout = torch.randn_like(q)
    x = leaves(q, k, v, sinks)
    alignment = "top_left" if top_left else "bottom_right"
    out, lse = fa.forward(*x[:3], causal=causal, causal_alignment=alignment, learnable_sink=x[3], return_lse=True)
    dlse = torch.randn_like(lse) if with_lse else None
    torch.autograd.backward([out, lse] if with_lse else [out], [dout, dlse] if with_lse else [dout])
    assert cpu[-1][0] == "backward" and cpu[-1][1]["sinks"]
    ref_x = leaves(q, k, v, sinks.double())
    ref_out, ref_lse = reference_attention(*ref_x[:3], q.shape[-1] ** -0.5, causal, top_left, sinks=ref_x[3])
    outputs, grads = [ref_out], [dout]
    if with_lse:
        outputs.append(ref_lse)
        grads.append(dlse.double())
    ref = torch.autograd.grad(outputs, ref_x, grads)
    assert_same([t.grad for t in x[:3]], ref[:3])
    assert x[3].grad is not None and x[3].grad.dtype == torch.float32 and x[3].grad.shape == (h,)
    torch.testing.assert_close(x[3].grad.double(), ref[3], rtol=1e-5, atol=1e-5, msg="dsinks differs")


def test_frozen_sinks_cost_the_backward_nothing(cpu):
    """Sinks that do not require grad: the LSE carries them, so the backward op gets none and
    computes no dsinks; q, k and v still get their gradients, which the sinks shape."""
    q, k, v = inputs(6, 6, 2, 2)
    dout = torch.randn_like(q)
    x = leaves(q, k, v)
    sinks = torch.randn(2)
    fa.forward(*x, learnable_sink=sinks).backward(dout)
    assert not cpu[-1][1]["sinks"]
    assert sinks.grad is None
    ref_x = leaves(q, k, v)
    ref_out, _ = reference_attention(*ref_x, q.shape[-1] ** -0.5, sinks=sinks.double())
    assert_same([t.grad for t in x], torch.autograd.grad(ref_out, ref_x, dout))


def test_only_the_sinks_require_grad_and_the_plain_op_recomputes_the_lse(cpu):
    q, k, v = inputs(7, 9, 4, 2)
    dout = torch.randn_like(q)
    sinks = torch.randn(4).requires_grad_()
    fa.forward(q, k, v, causal=True, learnable_sink=sinks).backward(dout)
    ref_s = sinks.detach().double().requires_grad_()
    ref_out, _ = reference_attention(q, k, v, q.shape[-1] ** -0.5, True, sinks=ref_s)
    (expected,) = torch.autograd.grad(ref_out, [ref_s], dout)
    torch.testing.assert_close(sinks.grad.double(), expected, rtol=1e-5, atol=1e-5)
    # The plain op (no LSE output) runs forward_lse again, with the sinks, for the backward.
    sinks.grad = None
    CALLS.clear()
    torch.ops.flash_attention_scratch.forward(q, k, v, None, 1, None, -1, -1, 0.0, sinks).backward(dout)
    assert [c[0] for c in CALLS] == ["forward", "forward_lse", "backward"]
    assert CALLS[1][1]["sinks"] and CALLS[2][1]["sinks"]
    torch.testing.assert_close(sinks.grad.double(), expected, rtol=1e-5, atol=1e-5)


def test_sinks_ops_pass_opcheck(cpu):
    q, k, v = inputs(5, 8, 2, 2)
    sinks = torch.randn(2)
    out, lse = torch.ops.flash_attention_scratch.forward_lse(q, k, v, None, 1, None, -1, -1, 0.0, sinks)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flash_attention_scratch.backward.default,
                          (dout, q, k, v, out, lse, None, 1, None, False, sinks))
    qg, sg = q.clone().requires_grad_(), sinks.clone().requires_grad_()
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward_lse.default,
                          (qg, k, v, None, 1, None, -1, -1, 0.0, sg))


@pytest.mark.parametrize("case", CASES)
def test_softcap_gradients_flow(cpu, case):
    """A softcap with grad: the recorded op passes it to the backward op, whose gradients go
    through tanh's derivative, sinks and the LSE's gradient included."""
    sq, sk, h, hkv, causal, top_left = case
    q, k, v = inputs(sq, sk, h, hkv)
    q = q * 3  # scores the cap bends
    sinks = torch.randn(h, dtype=torch.float32)
    dout = torch.randn_like(q)
    x = leaves(q, k, v, sinks)
    alignment = "top_left" if top_left else "bottom_right"
    out, lse = fa.forward(*x[:3], causal=causal, causal_alignment=alignment, softcap=2.0, learnable_sink=x[3],
                          return_lse=True)
    dlse = torch.randn_like(lse)
    torch.autograd.backward([out, lse], [dout, dlse])
    assert cpu[-1][0] == "backward" and cpu[-1][1]["softcap"] == 2.0
    ref_x = leaves(q, k, v, sinks.double())
    ref_out, ref_lse = reference_attention(*ref_x[:3], q.shape[-1] ** -0.5, causal, top_left, sinks=ref_x[3],
                                           softcap=2.0)
    ref = torch.autograd.grad([ref_out, ref_lse], ref_x, [dout, dlse.double()])
    assert_same([t.grad for t in x[:3]], ref[:3])
    torch.testing.assert_close(x[3].grad.double(), ref[3], rtol=1e-5, atol=1e-5, msg="dsinks differs")


def test_only_the_lse_reaches_the_loss(cpu):
    q, k, v = inputs(6, 11, 4, 2)
    x = leaves(q, k, v)
    _, lse = fa.forward(*x, causal=True, return_lse=True)
    dlse = torch.randn_like(lse)
    lse.backward(dlse)
    assert cpu[-1] == ("backward", dict(dlse=True, causal=1, dout_layout=q.stride(),  # zeros for dout
                                        deterministic=False, sinks=False, softcap=0.0, window=(-1, -1),
                                        alibi=None))
    assert_same([t.grad for t in x], reference_grads(q, k, v, torch.zeros_like(q), dlse.double(), causal=True))


def test_broadcast_dout_and_inputs_without_grad(cpu):
    q, k, v = inputs(8, 8, 2, 2)
    qg = q.clone().requires_grad_()
    fa.forward(qg, k, v, softmax_scale=0.7).sum().backward()  # dout: ones, a stride-0 view
    assert cpu[-1][1]["dout_layout"] == (0, 0, 0, 0)  # the kernel wrapper makes it readable (GPU)
    ref = reference_grads(q, k, v, torch.ones_like(q), scale=0.7)
    torch.testing.assert_close(qg.grad, ref[0], rtol=1e-5, atol=1e-6)
    kg = k.clone().requires_grad_()
    fa.forward(q, kg, v).sum().backward()
    assert kg.grad is not None


def test_no_grad_takes_the_eager_path(cpu, monkeypatch):
    from flash_attention_scratch import _ops

    eager = []
    monkeypatch.setattr(_ops, "_run", lambda q, k, v, out, lse, *args: eager.append(lse))
    q, k, v = leaves(*inputs(8, 8, 2, 2))
    with torch.no_grad():
        out = fa.forward(q, k, v)
    with torch.inference_mode():
        fa.forward(q, k, v, causal=True)
    fa.forward(*(t.detach() for t in (q, k, v)))
    assert not out.requires_grad
    assert cpu == [], "an op ran without grad"
    assert eager == [None, None, None], "the eager path allocated an LSE nobody asked for"


def test_the_plain_forward_op_recomputes_the_lse(cpu):
    q, k, v = inputs(9, 5, 4, 1)
    dout = torch.randn_like(q)
    x = leaves(q, k, v)
    torch.ops.flash_attention_scratch.forward(*x, 0.5, 1, None).backward(dout)
    assert [c[0] for c in cpu] == ["forward", "forward_lse", "backward"]
    assert_same([t.grad for t in x], reference_grads(q, k, v, dout, scale=0.5, causal=True))


WINDOW_CASES = [  # seq_q, seq_k, heads, heads_kv, causal, window, softcap, sinks, top_left
    (9, 9, 2, 1, True, (2, 0), 0.0, False, False),
    (7, 12, 4, 2, False, (3, 1), 0.0, False, False),
    (12, 7, 2, 2, True, (1, 0), 2.0, True, False),  # rows that see no key
    (8, 8, 2, 2, False, (0, 0), 0.0, True, False),
    (7, 12, 4, 2, False, (3, 1), 0.0, False, True),  # the window's diagonal at the top left, no causal mask
    (12, 7, 2, 2, True, (2, 0), 0.0, False, True),
]


@pytest.mark.parametrize("case", WINDOW_CASES)
def test_window_reaches_the_backward(cpu, case):
    """A window's sides reach forward_lse and the backward op, and the gradients are its own
    (against float64 autograd through the same mask)."""
    sq, sk, h, hkv, causal, window, softcap, with_sinks, top_left = case
    q, k, v = inputs(sq, sk, h, hkv)
    dout = torch.randn_like(q)
    sinks = torch.randn(h) if with_sinks else None
    x = leaves(q, k, v) + ([sinks.clone().requires_grad_()] if with_sinks else [])
    fa.forward(*x[:3], causal=causal, window_size=window, softcap=softcap, learnable_sink=x[3] if with_sinks else None,
               causal_alignment="top_left" if top_left else "bottom_right").backward(dout)
    code = (2 if top_left else 1) if causal else (3 if top_left else 0)
    assert cpu[0] == ("forward_lse", dict(causal=code, window=window, softcap=softcap, sinks=with_sinks, alibi=None))
    assert cpu[1][0] == "backward" and cpu[1][1]["window"] == window and cpu[1][1]["softcap"] == softcap
    ref_x = leaves(q, k, v) + ([sinks.clone().requires_grad_()] if with_sinks else [])
    out, _ = reference_attention(*ref_x[:3], q.shape[-1] ** -0.5, causal, top_left,
                                 sinks=ref_x[3] if with_sinks else None, softcap=softcap, window=window)
    out.backward(dout)
    assert_same([t.grad for t in x], [t.grad for t in ref_x])
    if with_sinks:
        torch.testing.assert_close(x[3].grad, ref_x[3].grad, rtol=1e-5, atol=1e-6)


ALIBI_CASES = [  # seq_q, seq_k, heads, heads_kv, causal, top_left, (batch, heads) slopes
    (9, 9, 2, 1, True, False, False),
    (7, 12, 4, 2, False, False, True),
    (12, 7, 2, 2, True, False, True),  # rows that see no key
    (9, 5, 4, 2, True, True, False),
    (7, 12, 4, 2, False, True, True),  # ALiBi's diagonal at the top left, no causal mask
]


@pytest.mark.parametrize("case", ALIBI_CASES)
def test_alibi_reaches_the_backward(cpu, case):
    """alibi_slopes, (heads,) or (batch, heads), reach forward_lse and the backward op with the
    alignment's code (3 without causal masking at the top left: ALiBi has a diagonal); the
    gradients are float64 autograd's through the same bias, the LSE's included, and the slopes,
    though they require grad, get none (as in flash_attn)."""
    sq, sk, h, hkv, causal, top_left, per_entry = case
    q, k, v = inputs(sq, sk, h, hkv)
    dout = torch.randn_like(q)
    slopes = torch.rand(2, h) if per_entry else torch.rand(h)
    x = leaves(q, k, v, slopes)
    out, lse = fa.forward(*x[:3], causal=causal, causal_alignment="top_left" if top_left else "bottom_right",
                          alibi_slopes=x[3], return_lse=True)
    dlse = torch.randn_like(lse) * torch.isfinite(lse).detach()
    torch.autograd.backward([out, lse], [dout, dlse])
    code = (2 if top_left else 1) if causal else (3 if top_left else 0)
    assert cpu[0] == ("forward_lse", dict(causal=code, window=(-1, -1), softcap=0.0, sinks=False,
                                          alibi=tuple(slopes.shape)))
    assert cpu[1][0] == "backward" and cpu[1][1]["causal"] == code and cpu[1][1]["alibi"] == tuple(slopes.shape)
    assert x[3].grad is None
    ref_x = leaves(q, k, v)
    ref_out, ref_lse = reference_attention(*ref_x, q.shape[-1] ** -0.5, causal, top_left, alibi=slopes.double())
    assert_same([t.grad for t in x[:3]], torch.autograd.grad([ref_out, ref_lse], ref_x, [dout, dlse.double()]))


def test_alibi_through_the_plain_op_and_opcheck(cpu):
    """The plain op's backward runs forward_lse again with the slopes; the ops with slopes pass
    opcheck (schema, fake implementations, autograd registration)."""
    q, k, v = inputs(7, 9, 4, 2)
    dout = torch.randn_like(q)
    slopes = torch.rand(2, 4)
    x = leaves(q, k, v)
    torch.ops.flash_attention_scratch.forward(*x, None, 1, None, -1, -1, 0.0, None, slopes).backward(dout)
    assert [c[0] for c in CALLS] == ["forward", "forward_lse", "backward"]
    assert all(c[1]["alibi"] == (2, 4) for c in CALLS)
    ref_x = leaves(q, k, v)
    ref_out, _ = reference_attention(*ref_x, q.shape[-1] ** -0.5, True, alibi=slopes.double())
    assert_same([t.grad for t in x], torch.autograd.grad(ref_out, ref_x, dout))
    out, lse = torch.ops.flash_attention_scratch.forward_lse(q, k, v, None, 3, None, -1, -1, 0.0, None, slopes)
    torch.library.opcheck(torch.ops.flash_attention_scratch.backward.default,
                          (dout, q, k, v, out, lse, None, 3, None, False, None, 0.0, -1, -1, slopes))
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward_lse.default,
                          (*leaves(q, k, v), None, 1, None, -1, -1, 0.0, None, slopes[0]))


def test_flash_attn_functions_pass_alibi_slopes(cpu):
    """flash_attn_func, its packed forms and the varlen functions pass alibi_slopes on, aligned at
    the bottom right as flash_attn aligns them; the gradients are the reference's."""
    q, k, v = inputs(9, 9, 4, 2)
    dout = torch.randn_like(q)
    slopes = torch.rand(2, 4)
    ref_x = leaves(q, k, v)
    ref_out, _ = reference_attention(*ref_x, q.shape[-1] ** -0.5, True, alibi=slopes.double())
    ref = torch.autograd.grad(ref_out, ref_x, dout)
    x = leaves(q, k, v)
    fa.flash_attn_func(*x, causal=True, alibi_slopes=slopes).backward(dout)
    assert cpu[0] == ("forward_lse", dict(causal=1, window=(-1, -1), softcap=0.0, sinks=False, alibi=(2, 4)))
    assert_same([t.grad for t in x], ref)
    kv = torch.stack([k, v], dim=2).requires_grad_()
    q1 = q.clone().requires_grad_()
    fa.flash_attn_kvpacked_func(q1, kv, causal=True, alibi_slopes=slopes).backward(dout)
    assert_same([q1.grad, *kv.grad.unbind(2)], ref)
    # Varlen: the batch's two entries packed, (batch, heads) slopes one row a sequence.
    cu = torch.tensor([0, 9, 18], dtype=torch.int32)
    q2, k2, v2 = leaves(*(t.flatten(0, 1) for t in (q, k, v)))
    fa.flash_attn_varlen_func(q2, k2, v2, cu, cu, 9, 9, causal=True, alibi_slopes=slopes).backward(dout.flatten(0, 1))
    assert cpu[-1] == ("backward_varlen", dict(dlse=False, causal=1, deterministic=False, sinks=False, softcap=0.0,
                                               window=(-1, -1), alibi=(2, 4)))
    assert_same([t.grad.unflatten(0, (2, 9)) for t in (q2, k2, v2)], ref)
    qkv = torch.stack([q, q, q], dim=2).flatten(0, 1).requires_grad_()
    fa.flash_attn_varlen_qkvpacked_func(qkv, cu, 9, alibi_slopes=slopes[0])
    assert cpu[-1][0] == "forward_varlen" and cpu[-1][1]["alibi"] == (4,)


BAD_ALIBI_SLOPES = [  # for q of batch 2 and 4 heads: slopes, the error, its message
    ([0.5] * 4, TypeError, r"alibi_slopes: expected a torch.Tensor of float32, got list"),
    ("float64", TypeError, r"alibi_slopes.dtype: expected torch.float32, got torch.float64"),
    ("meta", ValueError, r"alibi_slopes: expected a tensor on cpu \(q's device\), got meta"),
    ((5,), ValueError, r"alibi_slopes.shape: expected \(4,\) or \(2, 4\) \(one per query head, or per batch entry "
                       r"and query head\), got \(5,\)"),
    ((3, 4), ValueError, r"alibi_slopes.shape: expected \(4,\) or \(2, 4\) .*got \(3, 4\)"),
    ((2, 2), ValueError, r"alibi_slopes.shape: .*got \(2, 2\)"),  # a slope per K/V head
    ((1, 2, 4), ValueError, r"alibi_slopes.shape: .*got \(1, 2, 4\)"),
]
BAD_ALIBI_IDS = ["list", "float64", "meta", "shape5", "shape3x4", "shape2x2", "shape1x2x4"]


def bad_alibi_slopes(spec):
    """BAD_ALIBI_SLOPES' slopes: a shape, a dtype's or a device's name (4 slopes), or as given."""
    if isinstance(spec, tuple):
        return torch.rand(spec)
    if spec == "float64":
        return torch.rand(4, dtype=torch.float64)
    if spec == "meta":
        return torch.rand(4, device="meta")
    return spec


@pytest.mark.parametrize("spec,error,message", BAD_ALIBI_SLOPES, ids=BAD_ALIBI_IDS)
def test_bad_alibi_slopes_raise_before_any_work(cpu, spec, error, message):
    """Dense calls (batch 2, 4 query heads) and varlen ones over two sequences, whose batch is the
    sequences (so (total_q, heads) slopes are refused), with inputs that require grad or not."""
    q, k, v = inputs(5, 7, 4, 2)
    slopes = bad_alibi_slopes(spec)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    calls = [lambda: fa.forward(*leaves(q, k, v), alibi_slopes=slopes),
             lambda: fa.forward(q, k, v, causal=True, alibi_slopes=slopes),
             lambda: fa.flash_attn_func(*leaves(q, k, v), alibi_slopes=slopes),
             lambda: fa.forward_varlen(*leaves(q[0], k[0, :5], v[0, :5]), cu, cu, 3, 3, alibi_slopes=slopes),
             lambda: fa.flash_attn_varlen_func(q[0], k[0, :5], v[0, :5], cu, cu, 3, 3, alibi_slopes=slopes)]
    for call in calls:
        with pytest.raises(error, match=message):
            call()
    with pytest.raises(ValueError, match=r"alibi_slopes.shape: expected \(4,\) or \(2, 4\) .*got \(5, 4\)"):
        fa.forward_varlen(*leaves(q[0], k[0, :5], v[0, :5]), cu, cu, 3, 3, alibi_slopes=torch.rand(5, 4))
    assert cpu == [], "a kernel ran before the refusal"


def test_alibi_slopes_are_read_contiguous():
    """Strided slopes are copied contiguous; the binding gets their address and the distance
    between batch entries' rows (0 for the batch's (heads,) slopes)."""
    from flash_attention_scratch import _ops

    q = torch.zeros(3, 5, 4, 16)
    strided = torch.rand(4, 3).t()
    slopes = _ops._check_alibi(strided, q)
    assert slopes.is_contiguous() and torch.equal(slopes, strided)
    assert _ops._alibi(slopes) == dict(alibi_slopes=slopes.data_ptr(), alibi_batch_stride=4)
    shared = _ops._check_alibi(torch.rand(8)[::2], q)
    assert shared.is_contiguous() and _ops._alibi(shared) == dict(alibi_slopes=shared.data_ptr(), alibi_batch_stride=0)
    assert _ops._check_alibi(None, q) is None and _ops._alibi(None) == dict(alibi_slopes=0, alibi_batch_stride=0)
    # One row with any row stride (a slice of a wider table, a transposed column): read as one row.
    q1 = q[:1]
    for one_row in (torch.rand(1, 8)[:, :4], torch.rand(4, 1).t(), torch.rand(1, 3, 4)[:, 1]):
        checked = _ops._check_alibi(one_row, q1)
        assert _ops._alibi(checked) == dict(alibi_slopes=checked.data_ptr(), alibi_batch_stride=0)


def test_out_with_grad_raises_before_any_work(cpu):
    q, k, v = inputs(8, 8, 4, 4)
    qg = q.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="out= tensor cannot carry an autograd graph"):
        fa.forward(qg, k, v, out=torch.empty_like(q))
    assert cpu == [], "a kernel ran before the refusal"


def test_q_of_three_dimensions_is_refused_by_name(cpu):
    q, k, v = inputs(8, 8, 4, 4)
    with pytest.raises(ValueError, match=r"^q: expected 4 dimensions \(batch, seq, heads, d_head\), got 3"):
        fa.forward(q[0], k[0], v[0], learnable_sink=torch.zeros(4))
    assert cpu == []


def test_a_window_that_states_causal_is_causal(cpu):
    q, k, v = inputs(9, 5, 2, 2)
    dout = torch.randn_like(q)
    ref = reference_grads(q, k, v, dout, causal=True, top_left=True)
    for kwargs in (dict(window_size=(-1, 0), causal_alignment="top_left"),
                   dict(window_size=(-1, 0), causal=True, causal_alignment="top_left")):
        x = leaves(q, k, v)
        fa.forward(*x, **kwargs).backward(dout)
        assert cpu[-2] == ("forward_lse", dict(causal=2, window=(-1, -1), softcap=0.0, sinks=False, alibi=None))
        assert_same([t.grad for t in x], ref)


def test_a_window_that_states_causal_is_causal_in_every_entry_point(cpu, monkeypatch):
    """forward_varlen and forward_kvcache read window_size=(-1, 0) as forward() does: causal
    masking at the call's alignment, no window (the plain causal kernels: the split-KV decoding
    kernel and every GPU family take it)."""
    from flash_attention_scratch import _ops
    lens = [5, 9]
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)
    x = leaves(*(torch.randn(14, 2, 16, dtype=torch.float64) for _ in range(3)))
    for alignment, code in (("bottom_right", 1), ("top_left", 2)):
        fa.forward_varlen(*x, cu, cu, max(lens), max(lens), window_size=(-1, 0), causal_alignment=alignment)
        assert cpu[-1] == ("forward_varlen", dict(causal=code, window=(-1, -1), softcap=0.0, sinks=False, alibi=None,
                                                  deterministic=False))
        launches = []
        monkeypatch.setattr(_ops, "_run_kvcache", lambda *a: launches.append((a[10], a[12:14])))
        q, cache = torch.zeros(2, 1, 4, 16), torch.zeros(2, 32, 2, 16)
        fa.forward_kvcache(q, cache, cache, cache_seqlens=7, window_size=(-1, 0), causal_alignment=alignment)
        assert launches == [(code, (-1, -1))]


FLASH_ATTN_CASES = [  # kwargs, and what forward() must receive: causal, window
    (dict(), 0),
    (dict(causal=True), 1),
    (dict(window_size=(-1, 0)), 1),
    (dict(causal=True, window_size=(-1, 3)), 1),  # causal sets the right side to 0
    (dict(window_size=(11, 11)), 0),  # sides of at least seq_k keys are unbounded
    (dict(window_size=(-5, 0)), 1),  # any negative side is unbounded
    (dict(window_size=(-2, 2**40)), 0),
    (dict(causal=True, window_size=(100, -1), softmax_scale=0.3, deterministic=True), 1),
]


@pytest.mark.parametrize("kwargs,causal", FLASH_ATTN_CASES)
def test_flash_attn_func_reads_arguments_as_flash_attn(cpu, kwargs, causal):
    q, k, v = inputs(9, 11, 4, 2)
    dout = torch.randn_like(q)
    x = leaves(q, k, v)
    out, lse, s_dmask = fa.flash_attn_func(*x, return_attn_probs=True, **kwargs)
    assert s_dmask is None and lse.shape == (2, 4, 9)
    out.backward(dout)
    assert cpu[0] == ("forward_lse", dict(causal=causal, window=(-1, -1), softcap=0.0, sinks=False, alibi=None))
    # flash_attn's deterministic reaches the backward op.
    assert cpu[1][1]["deterministic"] == kwargs.get("deterministic", False)
    assert_same([t.grad for t in x], reference_grads(q, k, v, dout, scale=kwargs.get("softmax_scale"),
                                                     causal=bool(causal)))
    assert fa.flash_attn_func(*x, **kwargs).shape == q.shape


@pytest.mark.parametrize("kwargs,causal", FLASH_ATTN_CASES[:3])
def test_packed_functions_are_flash_attn_func_on_their_parts(cpu, kwargs, causal):
    """flash_attn's qkvpacked and kvpacked functions: the same calls as flash_attn_func on the
    packed tensor's parts, and the gradient reaches the packed tensor whole."""
    q, k, v = inputs(9, 9, 4, 4)
    dout = torch.randn_like(q)
    ref = reference_grads(q, k, v, dout, scale=kwargs.get("softmax_scale"), causal=bool(causal))
    qkv = torch.stack([q, k, v], dim=2).requires_grad_()
    out, lse, s_dmask = fa.flash_attn_qkvpacked_func(qkv, return_attn_probs=True, **kwargs)
    assert s_dmask is None and lse.shape == (2, 4, 9) and out.shape == q.shape
    out.backward(dout)
    assert cpu[0] == ("forward_lse", dict(causal=causal, window=(-1, -1), softcap=0.0, sinks=False, alibi=None))
    assert_same(qkv.grad.unbind(2), ref)
    q1, kv = q.clone().requires_grad_(), torch.stack([k, v], dim=2).requires_grad_()
    fa.flash_attn_kvpacked_func(q1, kv, **kwargs).backward(dout)
    assert_same([q1.grad, *kv.grad.unbind(2)], ref)


def test_flash_attn_varlen_takes_any_upper_bound_of_the_lengths(cpu, monkeypatch):
    """flash_attn_varlen_func with max_seqlen_q past the packed rows (flash_attn takes any bound,
    e.g. a fixed one for CUDA graphs): forward_varlen gets the rows' count, a bound as good."""
    from flash_attention_scratch import _ops
    bounds, forward_varlen = [], _ops.forward_varlen
    monkeypatch.setattr(_ops, "forward_varlen", lambda *a, **kw: bounds.append(a[5:7]) or forward_varlen(*a, **kw))
    lens = [5, 0, 9]
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    q, k, v = leaves(*(torch.randn(int(cu[-1]), 2, 16, dtype=torch.float64) for _ in range(3)))
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, 4096, 4096, causal=True)
    assert bounds == [(14, 4096)]
    torch.testing.assert_close(out, fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True))


def test_varlen_packed_functions_are_the_varlen_function_on_their_parts(cpu):
    lens = [5, 0, 9]
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    q, k, v = (torch.randn(int(cu[-1]), 2, 16, dtype=torch.float64) for _ in range(3))
    dout = torch.randn_like(q)
    x = leaves(q, k, v)
    fa.flash_attn_varlen_func(*x, cu, cu, max(lens), max(lens), causal=True).backward(dout)
    qkv = torch.stack([q, k, v], dim=1).requires_grad_()
    out, lse, _ = fa.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True, return_attn_probs=True)
    assert lse.shape == (2, int(cu[-1]))
    out.backward(dout)
    assert_same(qkv.grad.unbind(1), [t.grad for t in x])
    q1, kv = q.clone().requires_grad_(), torch.stack([k, v], dim=1).requires_grad_()
    fa.flash_attn_varlen_kvpacked_func(q1, kv, cu, cu, max(lens), max(lens), causal=True).backward(dout)
    assert_same([q1.grad, *kv.grad.unbind(1)], [t.grad for t in x])


def test_packed_functions_refuse_other_layouts_before_any_work(cpu):
    q, k, v = inputs(4, 4, 2, 2)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"qkv: expected shape \(batch, seqlen, 3, nheads, headdim\), got "
                                         r"\(2, 4, 2, 2, 16\)"):
        fa.flash_attn_qkvpacked_func(torch.stack([q, k], dim=2))
    with pytest.raises(ValueError, match=r"kv: expected shape \(batch, seqlen_k, 2, nheads_k, headdim\)"):
        fa.flash_attn_kvpacked_func(q, k)
    with pytest.raises(ValueError, match=r"qkv: expected shape \(total, 3, nheads, headdim\)"):
        fa.flash_attn_varlen_qkvpacked_func(q[0], cu, 4)
    with pytest.raises(ValueError, match=r"kv: expected shape \(total_k, 2, nheads_k, headdim\)"):
        fa.flash_attn_varlen_kvpacked_func(q[0], torch.stack([k[0], v[0], v[0]], dim=1), cu, cu, 4, 4)
    with pytest.raises(TypeError, match="qkv: expected a torch.Tensor, got list"):
        fa.flash_attn_qkvpacked_func([q, k, v])
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fa.flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), dropout_p=0.1)
    assert cpu == []


def test_double_backward_raises(cpu):
    q, k, v = leaves(*inputs(4, 4, 2, 2))
    (dq,) = torch.autograd.grad(fa.forward(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        dq.sum().backward()


def test_opcheck(cpu):
    q, k, v = inputs(9, 5, 4, 2)
    out, lse = torch.ops.flash_attention_scratch.forward_lse(q, k, v, None, 1, None)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    torch.library.opcheck(torch.ops.flash_attention_scratch.backward.default, (dout, q, k, v, out, lse, None, 1, dlse))
    torch.library.opcheck(torch.ops.flash_attention_scratch.backward.default, (dout, q, k, v, out, lse, 0.5, 0))
    x = leaves(*inputs(7, 7, 4, 2))
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward_lse.default, (*x, None, 1, None))
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward.default, (*x, None, 2, None))
    # forward_varlen's fake output has V's head dim (DeepSeek's MLA: q and k 192, v 128).
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    q2, k2, v2 = torch.randn(7, 4, 24), torch.randn(7, 2, 24), torch.randn(7, 2, 16)
    torch.library.opcheck(torch.ops.flash_attention_scratch.forward_varlen.default,
                          (*leaves(q2, k2, v2), cu, cu, None, None, 4, 4, None, 1, 0))


def test_kernel_view_copies_only_what_the_kernels_cannot_read():
    from flash_attention_scratch import _ops

    x = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    for readable in (x, x.transpose(1, 2), x[:, :, :2], x[1:]):
        assert _ops._kernel_view(readable) is readable
    flat = torch.randn(x.numel() + 8, dtype=torch.bfloat16)
    unreadable = [
        torch.ones(1, dtype=torch.bfloat16).expand(2, 8, 4, 64),  # out.sum()'s gradient: stride 0
        x.transpose(2, 3).contiguous().transpose(2, 3),  # head dim not contiguous
        flat[1:1 + x.numel()].view(2, 8, 4, 64),  # an address 2 bytes past 16-byte alignment
        flat[:x.numel()].as_strided((2, 8, 4, 64), (2048, 256, 60, 1)),  # rows 120 bytes apart
    ]
    for t in unreadable:
        view = _ops._kernel_view(t)
        assert view is not t and view.is_contiguous() and view.data_ptr() % 16 == 0
        assert torch.equal(view, t)


def test_flash_attn_wrappers_copy_only_a_strided_head_dim():
    from flash_attention_scratch import _ops

    x = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    kept = (x, x.transpose(1, 2), x[:, :, :2], None, 3.0)
    assert all(a is b for a, b in zip(_ops._head_dim_contiguous(*kept), kept))
    strided = x.transpose(2, 3).contiguous().transpose(2, 3)
    (copied,) = _ops._head_dim_contiguous(strided)
    assert copied.stride(-1) == 1 and torch.equal(copied, strided)


@pytest.mark.parametrize("entry", ["forward", "flash_attn_func", "out_only", "alibi"])
def test_torch_compile_fullgraph_traces_both_passes(cpu, entry):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = str(gm.graph)
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    q, k, v = inputs(9, 13, 4, 2)
    dout = torch.randn_like(q)
    dlse = torch.randn(2, 4, 9, dtype=torch.float32)
    slopes = torch.rand(2, 4)

    def loss_fn(q, k, v):
        if entry == "out_only":  # the LSE reaches no loss: the backward gets no dLSE
            return (fa.forward(q, k, v, causal=True) * dout).sum()
        if entry == "forward":
            out, lse = fa.forward(q, k, v, causal=True, return_lse=True)
        elif entry == "alibi":
            out, lse = fa.forward(q, k, v, causal=True, return_lse=True, alibi_slopes=slopes)
        else:
            out, lse, _ = fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        return (out * dout).sum() + (lse * dlse).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, backend=backend, fullgraph=True)
    eager, traced = leaves(q, k, v), leaves(q, k, v)
    loss_fn(*eager).backward()
    compiled(*traced).backward()
    assert "flash_attention_scratch.forward_lse" in graphs["forward"]
    assert "flash_attention_scratch.backward" in graphs["backward"]
    assert [c[1]["dlse"] for c in cpu if c[0] == "backward"] == [entry != "out_only"] * 2  # eager, compiled
    assert all(c[1]["alibi"] == ((2, 4) if entry == "alibi" else None) for c in cpu)
    assert_same([t.grad for t in traced], [t.grad for t in eager])


def test_the_backward_reaches_the_binding_with_its_arguments(monkeypatch):
    # No GPU here: the binding's own device check answers, which shows that nanobind took the
    # call's arguments (a signature mismatch would be a TypeError).
    from flash_attention_scratch import _ops

    monkeypatch.setattr(_ops, "_current_stream", lambda device: 0)
    monkeypatch.setattr(_ops, "_on_device", lambda device, fn: fn())
    q, k, v = inputs(9, 5, 4, 2, dtype=torch.bfloat16)
    lse = torch.zeros(2, 4, 9)
    for dlse in (None, lse):
        for deterministic in (False, True):
            with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
                _ops._run_backward(q, q, k, v, q, lse, q.clone(), k.clone(), v.clone(), None, 1, dlse,
                                   deterministic)
            with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
                _ops._run_backward(q, q, k, v, q, lse, q.clone(), k.clone(), v.clone(), 0.5, 2, dlse,
                                   deterministic)


def test_alibi_reaches_the_binding(monkeypatch):
    """Every entry point's binding takes alibi_slopes and alibi_batch_stride: without a GPU the
    binding's own device check answers, so nanobind took the call's arguments (a signature
    mismatch would be a TypeError)."""
    from flash_attention_scratch import _ops

    monkeypatch.setattr(_ops, "_current_stream", lambda device: 0)
    monkeypatch.setattr(_ops, "_on_device", lambda device, fn: fn())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # _run's check: q is "on it"
    q, k, v = inputs(9, 5, 4, 2, dtype=torch.bfloat16)
    lse = torch.zeros(2, 4, 9)
    cu = torch.tensor([0, 9, 18], dtype=torch.int32)
    lens = torch.tensor([5, 5], dtype=torch.int32)
    packed = [t.flatten(0, 1) for t in (q, k, v)]
    for slopes in (torch.rand(4), torch.rand(2, 4)):
        runs = [lambda: _ops._run(q, k, v, q.clone(), None, None, 1, None, alibi_slopes=slopes),
                lambda: _ops._run_backward(q, q, k, v, q, lse, q.clone(), k.clone(), v.clone(), None, 1, None, False,
                                           alibi_slopes=slopes),
                lambda: _ops._run_varlen(*packed, packed[0].clone(), None, cu, cu, None, None, 9, 9, None, 1, 0,
                                         alibi_slopes=slopes),
                lambda: _ops._run_backward_varlen(packed[0], *packed, packed[0], lse.view(4, 18),
                                                  *(t.clone() for t in packed), cu, cu, None, 9, 9, None, 1, None,
                                                  False, None, None, 0.0, -1, -1, slopes),
                lambda: _ops._run_kvcache(q, k, v, q.clone(), None, None, None, lens, None, None, 1, 0,
                                          alibi_slopes=slopes)]
        for run in runs:
            with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
                run()


VARLEN_CASES = [  # query lengths, key lengths, seqused_k, heads, heads_kv, causal, window, softcap, sinks
    ([5, 0, 9], [7, 3, 9], None, 4, 2, True, (-1, -1), 0.0, False),
    ([4, 6], [6, 10], [5, 8], 2, 2, False, (2, 1), 0.0, True),
    ([3, 8, 1], [3, 8, 4], None, 2, 1, True, (3, 0), 2.0, False),
]


@pytest.mark.parametrize("case", VARLEN_CASES)
@pytest.mark.parametrize("d_v", [16, 8], ids=["d_v=d", "d_v<d"])
def test_varlen_gradients_reach_the_packed_inputs(cpu, case, d_v):
    """forward_varlen with inputs that require grad records its op, and backward() runs
    backward_varlen with the call's offsets and variants: the gradients are each sequence's own
    (float64 autograd of each sequence alone), and rows no sequence uses (two past the last
    offset; keys past seqused_k) get zeros. V may have a head dim of its own (DeepSeek's MLA), which
    the output takes."""
    lens_q, lens_k, used, h, hkv, causal, window, softcap, with_sinks = case
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
    seqused = None if used is None else torch.tensor(used, dtype=torch.int32)
    total_q, total_k = int(cu_q[-1]) + 2, int(cu_k[-1]) + 2
    q = torch.randn(total_q, h, 16, dtype=torch.float64)
    k = torch.randn(total_k, hkv, 16, dtype=torch.float64)
    v = torch.randn(total_k, hkv, d_v, dtype=torch.float64)
    dout = torch.randn(total_q, h, d_v, dtype=torch.float64)
    sinks = torch.randn(h) if with_sinks else None
    x = leaves(q, k, v) + ([sinks.clone().requires_grad_()] if with_sinks else [])
    out = fa.forward_varlen(*x[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, seqused_k=seqused,
                            window_size=window, softcap=softcap, learnable_sink=x[3] if with_sinks else None,
                            deterministic=True)
    assert out.shape == dout.shape
    out.backward(dout)
    assert [c[0] for c in cpu] == ["forward_varlen", "backward_varlen"]
    assert cpu[1][1] == dict(dlse=False, causal=int(causal), deterministic=True, sinks=with_sinks,
                             softcap=softcap, window=window, alibi=None)
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    dsinks = torch.zeros(h) if with_sinks else None
    for rows, keys in _sequences(cu_q, cu_k, seqused):
        ref = leaves(q[None, rows], k[None, keys], v[None, keys]) + \
            ([sinks.clone().requires_grad_()] if with_sinks else [])
        o, _ = reference_attention(*ref[:3], 16 ** -0.5, causal, sinks=ref[3] if with_sinks else None,
                                   softcap=softcap, window=window)
        o.backward(dout[None, rows])
        grads[0][rows] += ref[0].grad[0]
        grads[1][keys] += ref[1].grad[0]
        grads[2][keys] += ref[2].grad[0]
        if with_sinks:
            dsinks += ref[3].grad
    assert_same([t.grad for t in x[:3]], grads)
    for g in (x[0].grad[-2:], x[1].grad[-2:], x[2].grad[-2:]):
        assert not g.any(), "rows no sequence uses got a gradient"
    if with_sinks:
        torch.testing.assert_close(x[3].grad, dsinks, rtol=1e-5, atol=1e-6)


def test_paged_varlen_with_grad_raises_before_any_work(cpu):
    q = torch.randn(4, 2, 16, dtype=torch.float64, requires_grad=True)
    pages = torch.randn(2, 16, 2, 16, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="paged cache has no backward pass"):
        fa.forward_varlen(q, pages, pages, torch.tensor([0, 4], dtype=torch.int32), None, 4, 16,
                          seqused_k=torch.tensor([16], dtype=torch.int32),
                          block_table=torch.zeros(1, 1, dtype=torch.int32))
    assert cpu == []


def test_kvcache_slots_trace_under_torch_compile_fullgraph(cpu):
    # flash_attn_with_kvcache with cache_batch_idx and new keys: the slots' checks (no address)
    # and the append trace whole; the check-only launch, which cannot, is left to the op.
    torch._dynamo.reset()
    k_cache, v_cache = torch.randn(3, 16, 2, 16, dtype=torch.float64), torch.randn(3, 16, 2, 16, dtype=torch.float64)
    q, k, v = inputs(2, 1, 4, 2)
    seqlens, idx = torch.tensor([5, 9], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    kc, vc = k_cache.clone(), v_cache.clone()

    def step(q, k, v, k_cache, v_cache):
        return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_batch_idx=idx,
                                          causal=True)

    out = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, k_cache, v_cache)
    for e in range(2):
        slot, length = int(idx[e]), int(seqlens[e])
        kc[slot, length], vc[slot, length] = k[e, 0], v[e, 0]
        ref, _ = reference_attention(q[e:e + 1], kc[None, slot, :length + 1], vc[None, slot, :length + 1],
                                     16 ** -0.5, causal=True)
        torch.testing.assert_close(out[e:e + 1], ref.to(out.dtype))
    assert torch.equal(k_cache, kc) and torch.equal(v_cache, vc)
