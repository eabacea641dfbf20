"""ALiBi (alibi_slopes, flash_attn's linear position bias: score (i, j) gets -slope * |d - j|, d
query i's diagonal position, i + seq_k - seq_q at the bottom right or i at the top left) on a
GPU: outputs and LSEs by test_variants' rule (error <= 2 x a naive same-dtype computation's +
1e-3), dq, dk and dv by test_backward's, against the float64 references; dense, packed (varlen)
and against a KV cache (flash_attn_with_kvcache). The argument checks and the autograd wiring
are test_autograd_cpu's and test_serving's, without a GPU."""

import itertools
import math

import pytest

import flash_attention_scratch as fa
from test_backward import BACKWARD_KINDS, assert_gradients_match, kind_id, leaves, needs_backward, seeded
from test_forward import needs_gpu, randn, torch_dtype
from test_serving import cache_for
from test_variants import check, is_hopper

try:
    import torch
except ImportError:
    torch = None


def alibi_slopes(batch, heads, per_entry):
    """ALiBi's slopes (Press et al.), 2^(-8 (h + 1) / heads) for head h: (heads,), or with
    per_entry (batch, heads), each entry's scaled by its own factor in [0.5, 2), so that an entry
    read with another's slopes shows."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device="cuda") / heads)
    if per_entry:
        slopes = slopes * (0.5 + 1.5 * torch.rand(batch, 1, device="cuda"))
    return slopes.float()


DENSE_CASES = [  # (seq_q, seq_k, heads, heads_kv, causal, top_left), (batch, heads) slopes, window, softcap, dlse
    ((257, 257, 4, 2, True, False), False, (-1, -1), 0.0, False),
    ((129, 333, 8, 2, False, False), True, (-1, -1), 0.0, True),
    ((333, 129, 4, 1, True, False), True, (-1, -1), 0.0, False),  # rows 0..203 see no key
    ((200, 333, 4, 2, True, True), False, (-1, -1), 0.0, True),
    ((301, 177, 4, 4, False, True), True, (-1, -1), 0.0, False),  # no causal mask, the diagonal at the top left
    ((513, 513, 8, 2, True, False), False, (100, 0), 5.0, True),  # with a window and a softcap
    ((255, 400, 4, 2, False, False), True, (64, 32), 0.0, False),
]


def dense_id(case):
    (sq, sk, h, hkv, causal, top_left), per_entry, window, softcap, with_dlse = case
    return (f"q{sq}_k{sk}_h{h}_{hkv}" + ("_causal" if causal else "") + ("_tl" if top_left else "")
            + ("-bh" if per_entry else "-h") + (f"-w{window[0]}_{window[1]}" if window != (-1, -1) else "")
            + ("-softcap" if softcap else "") + ("-dlse" if with_dlse else ""))


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("case", DENSE_CASES, ids=dense_id)
def test_dense_alibi_matches_reference(kind, case):
    """forward() with ALiBi: its output and LSE, then dq, dk and dv (the LSE's gradient too where
    the case says), against float64; with GQA, seq_q != seq_k, both alignments, a window and a
    softcap."""
    (sq, sk, h, hkv, causal, top_left), per_entry, window, softcap, with_dlse = case
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    q, k, v = randn(2, sq, h, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype), randn(2, sk, hkv, d, dtype=dtype)
    if softcap:
        q = q * 2  # scores of a few units, which a cap of 5 bends
    dout = randn(2, sq, h, d, dtype=dtype)
    slopes = alibi_slopes(2, h, per_entry)
    x = leaves(q, k, v)
    out, lse = fa.forward(*x, causal=causal, causal_alignment="top_left" if top_left else "bottom_right",
                          window_size=window, softcap=softcap, alibi_slopes=slopes, return_lse=True)
    check(out.detach(), lse.detach(), q, k, v, 1 / math.sqrt(d), causal=causal, window=window, softcap=softcap,
          top_left=top_left, alibi=slopes)
    # Rows that see no key (LSE -inf) are left out of the LSE's loss.
    dlse = torch.randn(2, h, sq, device="cuda") * torch.isfinite(lse.detach()) if with_dlse else None
    torch.autograd.backward([out, lse] if with_dlse else [out], [dout, dlse] if with_dlse else [dout])
    assert_gradients_match([t.grad for t in x], q, k, v, dout, dlse, causal=causal, top_left=top_left,
                           softcap=softcap, window=window, alibi=slopes, note=f"(seed {seed})")


@needs_gpu
@needs_backward
def test_flash_attn_func_takes_alibi_slopes():
    """flash_attn_func: forward()'s results with the slopes (aligned at the bottom right, as
    flash_attn aligns them), bit for bit, strided slopes read as their contiguous copy, and the
    reference's gradients; its kvpacked form, the reference's output."""
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    seed = seeded()
    q, k, v = randn(2, 200, 8, d, dtype=dtype), randn(2, 333, 2, d, dtype=dtype), randn(2, 333, 2, d, dtype=dtype)
    dout = randn(2, 200, 8, d, dtype=dtype)
    slopes = alibi_slopes(2, 8, True)
    strided = slopes.t().contiguous().t()
    assert not strided.is_contiguous()
    for causal in (False, True):
        ref_out, ref_lse = fa.forward(q, k, v, causal=causal, alibi_slopes=slopes, return_lse=True)
        out, lse, _ = fa.flash_attn_func(q, k, v, causal=causal, alibi_slopes=strided, return_attn_probs=True)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
        packed = fa.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), causal=causal, alibi_slopes=slopes)
        check(packed, None, q, k, v, 1 / math.sqrt(d), causal=causal, alibi=slopes)
        x = leaves(q, k, v)
        out = fa.flash_attn_func(*x, causal=causal, alibi_slopes=slopes)
        assert torch.equal(out.detach(), ref_out)
        out.backward(dout)
        assert_gradients_match([t.grad for t in x], q, k, v, dout, causal=causal, alibi=slopes,
                               note=f"(causal {causal}, seed {seed})")


# Packed sequences: empty and one-token sequences among them, keys cut by seqused_k, GQA, both
# alignments; one set of slopes, or a row a sequence.
VARLEN_CASES = [  # query lengths, key lengths, seqused_k, heads, heads_kv, causal alignment, (batch, heads) slopes
    ([300, 0, 1, 129, 64, 257], [300, 5, 1, 129, 200, 257], None, 8, 2, "bottom_right", True),
    ([100, 37, 250], [300, 64, 250], [280, 0, 250], 4, 4, False, False),
    ([150, 77, 513], [150, 300, 400], None, 4, 1, "top_left", True),
    ([200, 1, 181], [171, 130, 180], None, 4, 2, False, True),
]


@needs_gpu
@needs_backward
@pytest.mark.parametrize("kind", BACKWARD_KINDS, ids=kind_id)
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{len(c[0])}seqs-{c[5] or 'full'}"
                         f"{'-bh' if c[6] else '-h'}{'-seqused' if c[2] else ''}")
def test_varlen_alibi_matches_reference(kind, case):
    """forward_varlen with ALiBi, sequence b with row b of (batch, heads) slopes: each sequence's
    output, LSE, dq, dk and dv against float64 attention over that sequence alone; rows no
    sequence uses get zero gradients; flash_attn_varlen_func gives forward_varlen's output."""
    if not is_hopper():
        pytest.skip("ALiBi on packed sequences runs on the sm90 kernels (Hopper)")
    lens_q, lens_k, used, h, hkv, alignment, per_entry = case
    causal, top_left = bool(alignment), alignment == "top_left"
    dtype, d = torch_dtype(kind[0]), kind[1]
    seed = seeded()
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device="cuda")
    seqused = None if used is None else torch.tensor(used, dtype=torch.int32, device="cuda")
    total_q, total_k = sum(lens_q) + 2, sum(lens_k) + 2
    q, k, v = (randn(total_q, h, d, dtype=dtype), randn(total_k, hkv, d, dtype=dtype),
               randn(total_k, hkv, d, dtype=dtype))
    dout = randn(total_q, h, d, dtype=dtype)
    slopes = alibi_slopes(len(lens_q), h, per_entry)
    x = leaves(q, k, v)
    out, lse = fa.forward_varlen(*x, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                 causal_alignment="top_left" if top_left else "bottom_right", seqused_k=seqused,
                                 alibi_slopes=slopes, return_lse=True)
    out.backward(dout)
    grads = [t.grad for t in x]
    note = f"(seed {seed})"
    for g in grads:
        assert torch.isfinite(g).all() and not g[-2:].any(), f"rows no sequence uses got a gradient {note}"
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    for b, lq in enumerate(lens_q):
        lk = lens_k[b] if used is None else used[b]
        rows, keys = slice(starts_q[b], starts_q[b] + lq), slice(starts_k[b], starts_k[b] + lk)
        if lq == 0 or lk == 0:
            assert not grads[0][rows].any(), f"queries that see no key {note}"
            continue
        own = slopes[b] if per_entry else slopes
        sequence = (q[None, rows], k[None, keys], v[None, keys])
        where = f"sequence {b}, lengths {lq} and {lk} {note}"
        check(out.detach()[None, rows], lse.detach()[:, rows][None], *sequence, 1 / math.sqrt(d), causal=causal,
              top_left=top_left, alibi=own)
        assert_gradients_match([grads[0][None, rows], grads[1][None, keys], grads[2][None, keys]], *sequence,
                               dout[None, rows], causal=causal, top_left=top_left, alibi=own, note=where)
    if used is None and not top_left:
        ours = fa.forward_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, alibi_slopes=slopes)
        theirs = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                           alibi_slopes=slopes)
        rows = sum(lens_q)  # rows past the last sequence are left unwritten
        assert torch.equal(theirs[:rows], ours[:rows])


@needs_gpu
@pytest.mark.parametrize("num_splits", [0, 3])
@pytest.mark.parametrize("slots", [None, "cache_batch_idx", "cache_leftpad"])
@pytest.mark.parametrize("per_entry", [False, True], ids=["h", "bh"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kvcache_alibi_matches_reference(num_splits, slots, per_entry, causal):
    """flash_attn_with_kvcache with ALiBi and new keys: entry b (its slot cache_batch_idx[b], its
    keys from cache_leftpad[b] on) with row b of (batch, heads) slopes, against float64 attention
    over exactly the keys it sees, the new ones appended; num_splits is the split-KV kernel's hint,
    which takes no ALiBi."""
    if not is_hopper():
        pytest.skip("ALiBi against a KV cache runs on the sm90 kernels (Hopper)")
    dtype, batch, h, hkv, d, capacity, new = torch.float16, 3, 8, 2, 128, 1024, 2
    q = randn(batch, new, h, d, dtype=dtype)
    k_new, v_new = randn(batch, new, hkv, d, dtype=dtype), randn(batch, new, hkv, d, dtype=dtype)
    k_cache, v_cache = randn(batch, capacity, hkv, d, dtype=dtype), randn(batch, capacity, hkv, d, dtype=dtype)
    lens = torch.tensor([700, 1, 1022], dtype=torch.int32, device="cuda")
    slot = torch.tensor([2, 0, 1] if slots == "cache_batch_idx" else [0, 1, 2], dtype=torch.int32, device="cuda")
    pad = torch.tensor([5, 0, 300] if slots == "cache_leftpad" else [0, 0, 0], dtype=torch.int32, device="cuda")
    extra = {}
    if slots == "cache_batch_idx":
        extra = dict(cache_batch_idx=slot)
    elif slots == "cache_leftpad":
        extra = dict(cache_leftpad=pad)
    slopes = alibi_slopes(batch, h, per_entry)
    kc, vc = k_cache.clone(), v_cache.clone()
    out, lse = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=causal,
                                         alibi_slopes=slopes, num_splits=num_splits, return_softmax_lse=True,
                                         **extra)
    for b in range(batch):
        s, n, p = slot[b].item(), lens[b].item(), pad[b].item()
        keys = torch.cat([k_cache[s, p:n], k_new[b]])[None]
        values = torch.cat([v_cache[s, p:n], v_new[b]])[None]
        check(out[b:b + 1], lse[b:b + 1], q[b:b + 1], keys, values, 1 / math.sqrt(d), causal=causal,
              alibi=slopes[b] if per_entry else slopes)


@needs_gpu
@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("variant", [dict(causal=True), dict(causal=False, window_size=(300, 7), softcap=30.0)],
                         ids=["causal", "window-softcap"])
def test_paged_kvcache_alibi_matches_reference(page, variant):
    """flash_attn_with_kvcache with ALiBi over a paged cache (its own kernel instance) and new keys,
    (batch, heads) slopes, alone with causal masking and with a window and a softcap, against
    float64 attention over the keys each entry sees."""
    if not is_hopper():
        pytest.skip("ALiBi against a KV cache runs on the sm90 kernels (Hopper)")
    dtype, batch, h, hkv, d, capacity, new = torch.bfloat16, 3, 8, 2, 64, 1024, 3
    q = randn(batch, new, h, d, dtype=dtype)
    k_new, v_new = randn(batch, new, hkv, d, dtype=dtype), randn(batch, new, hkv, d, dtype=dtype)
    k_cache, v_cache = randn(batch, capacity, hkv, d, dtype=dtype), randn(batch, capacity, hkv, d, dtype=dtype)
    lens = torch.tensor([700, 0, capacity - new], dtype=torch.int32, device="cuda")
    slopes = alibi_slopes(batch, h, True)
    kc, vc, paged = cache_for(k_cache, v_cache, page)
    out, lse = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, alibi_slopes=slopes,
                                         return_softmax_lse=True, **paged, **variant)
    for b in range(batch):
        n = lens[b].item()
        keys, values = torch.cat([k_cache[b, :n], k_new[b]])[None], torch.cat([v_cache[b, :n], v_new[b]])[None]
        check(out[b:b + 1], lse[b:b + 1], q[b:b + 1], keys, values, 1 / math.sqrt(d), causal=variant["causal"],
              window=variant.get("window_size", (-1, -1)), softcap=variant.get("softcap", 0.0), alibi=slopes[b])


@needs_gpu
def test_alibi_slopes_on_another_device_raise():
    q = randn(2, 64, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 64, 128], dtype=torch.int32, device="cuda")
    message = r"alibi_slopes: expected a tensor on cuda:\d \(q's device\), got cpu"
    slopes = torch.rand(4)
    with pytest.raises(ValueError, match=message):
        fa.forward(q, q, q, alibi_slopes=slopes)
    with pytest.raises(ValueError, match=message):
        fa.forward_varlen(q.flatten(0, 1), q.flatten(0, 1), q.flatten(0, 1), cu, cu, 64, 64, alibi_slopes=slopes)
    with pytest.raises(ValueError, match=message):
        fa.flash_attn_with_kvcache(q, q, q, alibi_slopes=slopes)


@needs_gpu
@needs_backward
def test_alibi_under_torch_compile():
    """fullgraph torch.compile of a training step with ALiBi: the same kernels as eager, bit for
    bit (deterministic: ALiBi's backward runs on the band kernels, whose dQ adds are unordered
    otherwise)."""
    dtype, d = torch_dtype(BACKWARD_KINDS[0][0]), BACKWARD_KINDS[0][1]
    q, k, v = randn(2, 256, 4, d, dtype=dtype), randn(2, 300, 2, d, dtype=dtype), randn(2, 300, 2, d, dtype=dtype)
    dout = torch.randn_like(q)
    slopes = alibi_slopes(2, 4, True)

    def loss_fn(q, k, v, slopes):
        return (fa.forward(q, k, v, causal=True, alibi_slopes=slopes, deterministic=True).float() * dout).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True)
    eager, traced = leaves(q, k, v), leaves(q, k, v)
    loss_fn(*eager, slopes).backward()
    compiled(*traced, slopes).backward()
    for name, a, b in zip("qkv", eager, traced):
        assert b.grad is not None and torch.equal(a.grad, b.grad), f"d{name} differs compiled"
