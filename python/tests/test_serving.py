"""forward_varlen and forward_kvcache: per-sequence results against the float64 reference
(test_forward's rule), KV append in place, argument errors, torch.compile and a captured
decode step replayed on new cache contents."""

import re

import pytest

import flash_attention_scratch as fa
from test_autograd_cpu import BAD_ALIBI_IDS, BAD_ALIBI_SLOPES, bad_alibi_slopes
from test_forward import assert_matches, needs_gpu, randn

try:
    import torch
except ImportError:
    torch = None


def test_varlen_needs_torch_tensors():
    if torch is None:
        pytest.skip("needs PyTorch")
    with pytest.raises((TypeError, ValueError)):
        fa.forward_varlen([1], [2], [3], None, None, 1, 1)


def needs_sm90_at(d, d_v):
    """Head dims without a split-KV kernel (96, 192) or with V's own (DeepSeek's MLA) run the
    serving entry points on the sm90 family only."""
    from test_variants import is_hopper
    if (d not in (64, 128, 256) or d_v != d) and not is_hopper():
        pytest.skip(f"d_head {d}, d_v {d_v}: the serving entry points run them on Hopper only")


@needs_gpu
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d, d_v", [(128, 128), (96, 96), (192, 128)], ids=["d128", "d96", "mla"])
def test_varlen_matches_reference(paged, causal, d, d_v):
    """Packed and paged sequences against the float64 reference, d_head 96 (64-byte swizzled
    tiles) and DeepSeek's MLA (d_head 192 with V's 128: the output has V's head dim) among them."""
    needs_sm90_at(d, d_v)
    dtype, hq, hkv = torch.bfloat16, 8, 2
    lens_q = [5, 0, 130, 1, 64]
    lens_k = [300, 7, 129, 0, 1000]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = randn(sum(lens_q), hq, d, dtype=dtype)
    k = randn(sum(lens_k), hkv, d, dtype=dtype)
    v = randn(sum(lens_k), hkv, d_v, dtype=dtype)
    kwargs = {}
    kk, vv = k, v
    if paged:
        page = 64
        pages_per_seq = -(-max(lens_k) // page)
        table = torch.randperm(len(lens_k) * pages_per_seq, dtype=torch.int32, device="cuda").view(len(lens_k), -1)
        kk = torch.zeros(table.numel(), page, hkv, d, dtype=dtype, device="cuda")
        vv = torch.zeros(table.numel(), page, hkv, d_v, dtype=dtype, device="cuda")
        for b, n in enumerate(lens_k):
            for p in range(-(-n // page)):
                rows = slice(cu_k[b].item() + p * page, cu_k[b].item() + min(n, (p + 1) * page))
                cnt = rows.stop - rows.start
                kk[table[b, p].item(), :cnt] = k[rows]
                vv[table[b, p].item(), :cnt] = v[rows]
        kwargs = dict(block_table=table, seqused_k=torch.tensor(lens_k, dtype=torch.int32, device="cuda"))
    out, lse = fa.forward_varlen(q, kk, vv, cu_q, None if paged else cu_k, max(lens_q), max(lens_k),
                                 causal=causal, return_lse=True, **kwargs)
    assert lse.shape == (hq, sum(lens_q)) and out.shape == (sum(lens_q), hq, d_v)
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        qs, qe, ks, ke = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
        if ke == ks:
            assert (out[qs:qe] == 0).all() and torch.isneginf(lse[:, qs:qe]).all()
            continue
        assert_matches(out[qs:qe][None], lse[:, qs:qe][None], q[qs:qe][None], k[ks:ke][None], v[ks:ke][None],
                       d ** -0.5, causal)


def cache_for(k_cache, v_cache, page):
    """The caches as the call takes them: copies of the contiguous ones, or (page set) their rows
    in pages of a paged cache whose block table lists each sequence's pages in reverse; and the
    call's extra arguments."""
    if not page:
        return k_cache.clone(), v_cache.clone(), {}
    b, cap, hkv, d = k_cache.shape
    d_v = v_cache.shape[3]
    table = torch.arange(b * cap // page, dtype=torch.int32, device="cuda").flip(0).view(b, -1).contiguous()
    kc = torch.empty(b * cap // page, page, hkv, d, dtype=k_cache.dtype, device="cuda")
    vc = torch.empty(b * cap // page, page, hkv, d_v, dtype=v_cache.dtype, device="cuda")
    kc[table.long()] = k_cache.view(b, cap // page, page, hkv, d)
    vc[table.long()] = v_cache.view(b, cap // page, page, hkv, d_v)
    return kc, vc, dict(block_table=table)


@needs_gpu
@pytest.mark.parametrize("page", [None, 16])
@pytest.mark.parametrize("d, d_v", [(64, 64), (192, 128)], ids=["d64", "mla"])
def test_kvcache_appends_and_matches_reference(page, d, d_v):
    """Decoding with appended keys against the float64 reference, DeepSeek's MLA among them (V's
    rows, appended and read, of 128 columns)."""
    needs_sm90_at(d, d_v)
    dtype, b, hq, hkv, cap = torch.float16, 3, 8, 2, 512
    q = randn(b, 1, hq, d, dtype=dtype)
    k_cache = randn(b, cap, hkv, d, dtype=dtype)
    v_cache = randn(b, cap, hkv, d_v, dtype=dtype)
    k_new = randn(b, 2, hkv, d, dtype=dtype)
    v_new = randn(b, 2, hkv, d_v, dtype=dtype)
    lens = torch.tensor([0, 100, cap - 2], dtype=torch.int32, device="cuda")
    expect_k = [torch.cat([k_cache[i, :lens[i]], k_new[i]]) for i in range(b)]
    expect_v = [torch.cat([v_cache[i, :lens[i]], v_new[i]]) for i in range(b)]
    kc, vc, kwargs = cache_for(k_cache, v_cache, page)
    out, lse = fa.forward_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=True, return_lse=True,
                                  **kwargs)
    assert out.shape == (b, 1, hq, d_v)
    for i in range(b):
        assert_matches(out[i:i + 1], lse[i:i + 1], q[i:i + 1], expect_k[i][None], expect_v[i][None], d ** -0.5, True)
    if page:  # the pages' rows in each sequence's order, through its block table
        kc, vc = (c[kwargs["block_table"].long()].reshape(b, cap, *c.shape[2:]) for c in (kc, vc))
    for i in range(b):
        n = lens[i].item()
        assert torch.equal(kc[i, n:n + 2], k_new[i]) and torch.equal(vc[i, n:n + 2], v_new[i])
        assert torch.equal(vc[i, :n], v_cache[i, :n])


@needs_gpu
def test_kvcache_errors_name_the_argument():
    q = randn(2, 1, 8, 128, dtype=torch.bfloat16)
    kc = randn(2, 256, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="cache_seqlens.dtype"):
        fa.forward_kvcache(q, kc, kc.clone(), cache_seqlens=torch.zeros(2, device="cuda"))
    with pytest.raises(ValueError, match="page_size"):
        fa.forward_kvcache(q, randn(8, 24, 2, 128, dtype=torch.bfloat16), randn(8, 24, 2, 128, dtype=torch.bfloat16),
                           cache_seqlens=4, block_table=torch.zeros(2, 4, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="v_new"):
        fa.forward_kvcache(q, kc, kc.clone(), randn(2, 1, 2, 128, dtype=torch.bfloat16), cache_seqlens=3)
    with pytest.raises(ValueError, match="num_splits"):
        fa.forward_kvcache(q, kc, kc.clone(), cache_seqlens=3, num_splits=100000)


@needs_gpu
def test_kvcache_compiles_and_replays_in_a_cuda_graph():
    dtype, b, hq, hkv, d, cap = torch.bfloat16, 4, 16, 2, 128, 4096
    q = randn(b, 1, hq, d, dtype=dtype)
    kc = randn(b, cap, hkv, d, dtype=dtype)
    vc = randn(b, cap, hkv, d, dtype=dtype)
    lens = torch.tensor([1, 4000, 17, 2048], dtype=torch.int32, device="cuda")

    compiled = torch.compile(lambda q, kc, vc, lens: fa.forward_kvcache(q, kc, vc, cache_seqlens=lens), fullgraph=True)
    eager = fa.forward_kvcache(q, kc, vc, cache_seqlens=lens)
    assert torch.equal(compiled(q, kc, vc, lens), eager)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fa.forward_kvcache(q, kc, vc, cache_seqlens=lens)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa.forward_kvcache(q, kc, vc, cache_seqlens=lens)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        kc.copy_(torch.randn_like(kc))
        lens.copy_(torch.randint(1, cap, (b,), dtype=torch.int32, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        for i in range(b):
            n = lens[i].item()
            assert_matches(out[i:i + 1], None, q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], d ** -0.5, False)


@needs_gpu
def test_inputs_that_require_grad_are_refused():
    q = randn(2, 1, 8, 128, dtype=torch.bfloat16).requires_grad_()
    kc = randn(2, 256, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="q: expected a tensor that does not require grad"):
        fa.forward_kvcache(q, kc, kc.clone(), cache_seqlens=3)
    # Packed sequences train; paged ones (a cache: one page of 256 rows a sequence) do not.
    with pytest.raises(NotImplementedError, match="q: expected a tensor that does not require grad"):
        fa.forward_varlen(q[:, 0], kc, kc.clone(), torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda"), None,
                          1, 156, seqused_k=torch.tensor([100, 156], dtype=torch.int32, device="cuda"),
                          block_table=torch.tensor([[0], [1]], dtype=torch.int32, device="cuda"))
    with torch.no_grad():  # allowed without grad mode, as forward() is
        fa.forward_kvcache(q, kc, kc.clone(), cache_seqlens=3)


# flash_attn.flash_attn_with_kvcache's parameters and defaults (flash_attn 2.7-2.8).
WITH_KVCACHE = ["q", "k_cache", "v_cache", ("k", None), ("v", None), ("rotary_cos", None), ("rotary_sin", None),
                ("cache_seqlens", None), ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
                ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
                ("return_softmax_lse", False)]


def test_flash_attn_with_kvcache_signature_is_flash_attns():
    import inspect
    assert "flash_attn_with_kvcache" in fa.__all__
    params = inspect.signature(fa.flash_attn_with_kvcache).parameters
    expected = [(p, inspect.Parameter.empty) if isinstance(p, str) else p for p in WITH_KVCACHE]
    assert [(p.name, p.default) for p in params.values()] == expected
    try:
        from flash_attn import flash_attn_with_kvcache as theirs
    except Exception:  # not installed (or built for another torch): the list above stands
        return
    assert list(inspect.signature(theirs).parameters) == list(params)


WITH_KVCACHE_CASES = [  # flash_attn's arguments, and what forward_kvcache must receive: causal, window
    (dict(), False, (-1, -1)),
    (dict(causal=True), True, (-1, -1)),
    (dict(window_size=(-1, 0)), True, (-1, -1)),
    (dict(causal=True, window_size=(30, 5)), True, (30, 0)),  # causal sets the right side to 0
    (dict(window_size=(64, 64)), False, (-1, -1)),  # sides of at least the cache's 64 keys are unbounded
]


@pytest.fixture
def kvcache_calls(monkeypatch):
    """forward_kvcache's calls, recorded instead of run (each returns "out")."""
    if torch is None:
        pytest.skip("needs PyTorch")
    from flash_attention_scratch import _ops
    calls = []
    monkeypatch.setattr(_ops, "forward_kvcache", lambda *a, **kw: calls.append((a, kw)) or "out")
    return calls


@pytest.mark.parametrize("kwargs,causal,window", WITH_KVCACHE_CASES)
def test_flash_attn_with_kvcache_reads_arguments_as_flash_attn(kvcache_calls, kwargs, causal, window):
    calls = kvcache_calls
    q, kc = torch.zeros(2, 1, 4, 64), torch.zeros(2, 64, 2, 64)
    lens = torch.tensor([3, 9], dtype=torch.int32)
    assert fa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, return_softmax_lse=True, num_splits=2,
                                      softmax_scale=0.5, softcap=3.0, **kwargs) == "out"
    (args, kw), = calls
    assert args == (q, kc, kc, None, None)
    assert kw == dict(cache_seqlens=lens, block_table=None, softmax_scale=0.5, causal=causal, num_splits=2,
                      return_lse=True, window_size=window, softcap=3.0, alibi_slopes=None)


def test_flash_attn_with_kvcache_passes_alibi_slopes_on(kvcache_calls):
    q, kc = torch.zeros(2, 1, 4, 64), torch.zeros(2, 64, 2, 64)
    for slopes in (torch.rand(4), torch.rand(2, 4)):
        fa.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, alibi_slopes=slopes)
        assert kvcache_calls[-1][1]["alibi_slopes"] is slopes


def test_flash_attn_with_kvcache_refuses_what_it_lacks_before_any_work(monkeypatch):
    if torch is None:
        pytest.skip("needs PyTorch")
    from flash_attention_scratch import _ops
    monkeypatch.setattr(_ops, "forward_kvcache", lambda *a, **kw: pytest.fail("forward_kvcache ran"))
    monkeypatch.setattr(_ops, "forward_varlen", lambda *a, **kw: pytest.fail("forward_varlen ran"))
    q = torch.zeros(1, 1, 2, 64)
    # flash_attn takes slot indices and left padding only for caches that are not paged.
    table = torch.zeros(1, 1, dtype=torch.int32)
    for name in ("cache_batch_idx", "cache_leftpad"):
        with pytest.raises(ValueError, match="expected None with block_table"):
            fa.flash_attn_with_kvcache(q, q, q, block_table=table, **{name: torch.zeros(1, dtype=torch.int32)})


def refusing_any_work(monkeypatch):
    """CPU tensors standing in for a cache call's: the CUDA check relaxed and every kernel or append
    refused (a test of checks made before any work). Returns q (2, 1, 4, 64), a cache
    (2, 64, 2, 64) and new keys (2, 1, 2, 64), fp16."""
    from flash_attention_scratch import _ops
    monkeypatch.setattr(_ops, "_check", lambda name, t, device=None: None)
    for name in ("_run_kvcache", "_run_varlen", "_append_to_slots", "forward_varlen"):
        monkeypatch.setattr(_ops, name, lambda *a, name=name, **kw: pytest.fail(f"{name} ran"))
    return (torch.zeros(2, 1, 4, 64, dtype=torch.float16), torch.zeros(2, 64, 2, 64, dtype=torch.float16),
            torch.ones(2, 1, 2, 64, dtype=torch.float16))


@pytest.mark.parametrize("slots", [False, True], ids=["cache", "cache_batch_idx"])
@pytest.mark.parametrize("spec,error,message", BAD_ALIBI_SLOPES, ids=BAD_ALIBI_IDS)
def test_kvcache_alibi_slopes_are_checked_before_any_work(monkeypatch, slots, spec, error, message):
    """alibi_slopes of flash_attn_with_kvcache: float32 on q's device, (heads,) or (batch, heads),
    checked before the new keys are appended (CPU tensors stand in: the CUDA check relaxed, and
    every kernel or append refused)."""
    if torch is None:
        pytest.skip("needs PyTorch")
    q, kc, new = refusing_any_work(monkeypatch)
    extra = dict(cache_batch_idx=torch.tensor([1, 0], dtype=torch.int32)) if slots else {}
    with pytest.raises(error, match=message):
        fa.flash_attn_with_kvcache(q, kc, kc.clone(), new, new, cache_seqlens=3, alibi_slopes=bad_alibi_slopes(spec),
                                   **extra)


@pytest.mark.parametrize("slots", [False, True], ids=["cache", "cache_batch_idx"])
def test_kvcache_inputs_that_require_grad_are_refused_by_name_before_any_work(monkeypatch, slots):
    """The cache entry points have no backward pass: new keys or values that require grad, or a
    cache that does, are refused under their own names before any append or kernel (an output
    without a graph would lose their gradients, and an append would put the caches in a graph).
    CPU tensors stand in: the CUDA check relaxed, and every kernel or append refused."""
    if torch is None:
        pytest.skip("needs PyTorch")
    q, kc, new = refusing_any_work(monkeypatch)
    extra = dict(cache_batch_idx=torch.tensor([1, 0], dtype=torch.int32)) if slots else {}
    for name in ("k", "v", "k_cache", "v_cache"):
        args = dict(k_cache=kc, v_cache=kc.clone(), k=new, v=new.clone())
        args[name] = args[name].clone().requires_grad_()
        with pytest.raises(NotImplementedError, match=f"^{name}: expected a tensor that does not require grad"):
            fa.flash_attn_with_kvcache(q, cache_seqlens=3, **args, **extra)
        if not slots:
            with pytest.raises(NotImplementedError, match=f"^{name}: expected a tensor that does not require grad"):
                fa.forward_kvcache(q, cache_seqlens=3, **args)


def test_kvcache_q_of_three_dimensions_is_refused_by_name(monkeypatch):
    if torch is None:
        pytest.skip("needs PyTorch")
    from flash_attention_scratch import _ops
    monkeypatch.setattr(_ops, "_check", lambda name, t, device=None: None)
    monkeypatch.setattr(_ops, "_run_kvcache", lambda *a, **kw: pytest.fail("_run_kvcache ran"))
    kc = torch.zeros(2, 64, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^q: expected 4 dimensions \(batch, seq, heads, d_head\), got 3"):
        fa.forward_kvcache(torch.zeros(2, 4, 64, dtype=torch.float16), kc, kc, cache_seqlens=3)


def test_appending_to_cache_slots_writes_only_the_kept_rows():
    """The append of cache_batch_idx (on the CPU: index_put_ is the same there): each entry's new
    rows land in its slot from its length on; rows past the capacity, and an entry whose slot is
    outside the cache, write nothing (the last case: no row kept at all). No value is read back
    to the host (a 0-d index tensor would be: CUDA-graph capture and torch.compile refuse it)."""
    if torch is None:
        pytest.skip("needs PyTorch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from flash_attention_scratch import _ops

    class HostReads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                HostReads.count += 1
            return func(*args, **(kwargs or {}))

    for case in range(4):
        torch.manual_seed(case)
        slots, capacity, new = 5, 8, 3
        kc, vc = torch.randn(slots, capacity, 2, 16), torch.randn(slots, capacity, 2, 16)
        k, v = torch.randn(3, new, 2, 16), torch.randn(3, new, 2, 16)
        slot = torch.tensor([[4, 0, 2], [1, 3, 0], [2, 7, -1], [5, -1, 0]][case], dtype=torch.int32)
        lengths = torch.tensor([[0, 6, 8], [5, 7, 2], [1, 0, 0], [0, 0, 8]][case], dtype=torch.int32)
        want_k, want_v = kc.clone(), vc.clone()
        for b in range(3):
            for i in range(new):
                if 0 <= slot[b] < slots and lengths[b] + i < capacity:
                    want_k[slot[b], lengths[b] + i] = k[b, i]
                    want_v[slot[b], lengths[b] + i] = v[b, i]
        with HostReads():
            _ops._append_to_slots(kc, vc, k, v, slot, lengths)
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v), f"case {case}"
    assert HostReads.count == 0, f"{HostReads.count} values read back to the host"


def test_cache_slots_with_new_keys_need_their_lengths(monkeypatch):
    """flash_attn_with_kvcache with cache_batch_idx and new keys but no cache_seqlens is refused
    (the lengths say where the new keys go), as forward_kvcache refuses it: without the check
    the keys were dropped and left out of the attention."""
    if torch is None:
        pytest.skip("needs PyTorch")
    q, kc, new = refusing_any_work(monkeypatch)
    with pytest.raises(ValueError, match="^cache_seqlens: expected an int32 tensor of batch lengths"):
        fa.flash_attn_with_kvcache(q, kc, kc.clone(), new, new, cache_batch_idx=torch.tensor([1, 0],
                                                                                             dtype=torch.int32))


def test_cache_slots_name_a_dtype_mismatch_as_a_type_error(monkeypatch):
    """cache_batch_idx's path: caches or new keys of another dtype raise TypeError naming the tensor,
    as forward_kvcache's path does (it raised ValueError)."""
    if torch is None:
        pytest.skip("needs PyTorch")
    q, kc, new = refusing_any_work(monkeypatch)
    idx = torch.tensor([1, 0], dtype=torch.int32)
    for name in ("k_cache", "v_cache", "k", "v"):
        args = dict(k_cache=kc, v_cache=kc.clone(), k=new, v=new.clone())
        args[name] = args[name].to(torch.bfloat16)
        with pytest.raises(TypeError, match=f"^{name}.dtype: expected"):
            fa.flash_attn_with_kvcache(q, cache_seqlens=3, cache_batch_idx=idx, **args)


def test_flash_attn_functions_refuse_fp8_by_name_before_any_work(monkeypatch):
    """flash_attn's functions take no descales: FP8 inputs raise TypeError pointing to forward()
    and forward_kvcache(), not a request for a q_descale they cannot pass."""
    if torch is None or not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("needs a PyTorch with torch.float8_e4m3fn")
    from flash_attention_scratch import _ops
    for name in ("forward", "forward_kvcache", "forward_varlen"):
        monkeypatch.setattr(_ops, name, lambda *a, name=name, **kw: pytest.fail(f"{name} ran"))
    q8 = torch.zeros(1, 4, 2, 64).to(torch.float8_e4m3fn)
    for call in (lambda: fa.flash_attn_func(q8, q8, q8),
                 lambda: fa.flash_attn_qkvpacked_func(torch.stack([q8.view(torch.uint8)] * 3, 2).view(q8.dtype)),
                 lambda: fa.flash_attn_with_kvcache(q8, q8, q8, cache_seqlens=1)):
        with pytest.raises(TypeError, match=r"^q\.dtype: expected torch.float16 or torch.bfloat16 in flash_attn_"
                                            r".*forward\(\) and forward_kvcache\(\)"):
            call()


def rotated64(x, cos, sin, positions, interleaved):
    """Rotary embedding in float64, written apart from the package's: interleaved pairs as complex
    numbers times e^(i theta), GPT-NeoX's halves as a 2 x 2 rotation."""
    half = cos.shape[1]
    c = cos.double()[positions.long()][:, :, None]  # (batch, seq, 1, half)
    s = sin.double()[positions.long()][:, :, None]
    r = x[..., :2 * half].double()
    if interleaved:
        z = torch.view_as_complex(r.reshape(*r.shape[:-1], half, 2).contiguous()) * torch.complex(c, s)
        r = torch.view_as_real(z).flatten(-2)
    else:
        a, b = r[..., :half], r[..., half:]
        r = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    return torch.cat((r, x[..., 2 * half:].double()), dim=-1)


def rotary_tables(positions, half, dtype, device):
    theta = torch.arange(positions, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(half) / half)
    return theta.cos().to(dtype).to(device), theta.sin().to(dtype).to(device)


ROTARY_CASES = [  # flash_attn's arguments, and whether the queries sit at their own positions
    (dict(causal=True), True),
    (dict(window_size=(8, 0)), True),
    (dict(), False),
    (dict(window_size=(64, 64)), False),  # both sides unbounded over the cache's 64 keys: not local
]


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("kwargs,per_token", ROTARY_CASES)
def test_flash_attn_with_kvcache_rotates_as_flash_attn(kvcache_calls, kwargs, per_token, interleaved):
    """The rotated q and new keys forward_kvcache receives, against a float64 rotation (no GPU)."""
    calls = kvcache_calls
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 64, generator=generator).to(torch.bfloat16)
    k_new = torch.randn(2, 3, 2, 64, generator=generator).to(torch.bfloat16)
    kc = torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16)
    lens = torch.tensor([5, 60], dtype=torch.int32)
    cos, sin = rotary_tables(64, 16, torch.bfloat16, "cpu")  # rotary_dim 32 of d_head 64
    assert fa.flash_attn_with_kvcache(q, kc, kc, k_new, k_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                      rotary_interleaved=interleaved, **kwargs) == "out"
    (args, kw), = calls
    steps = torch.arange(3)
    k_at = lens[:, None] + steps
    q_at = k_at if per_token else lens[:, None].expand(-1, 3)
    for got, x, at in ((args[0], q, q_at), (args[3], k_new, k_at)):
        want = rotated64(x, cos, sin, at.clamp(max=63), interleaved)
        assert got.dtype == x.dtype and torch.equal(got[..., 32:], x[..., 32:])
        # fp32 arithmetic rounded once to bf16: within one bf16 ulp of the float64 rotation.
        assert ((got.double() - want).abs() <= want.abs() * 2.0 ** -8 + 1e-6).all()
    assert args[4] is k_new and kw["cache_seqlens"] is lens


ROTARY_REFUSALS = [  # a change to a good call, and the argument the error must name
    (dict(rotary_sin=None), "rotary_sin"),
    (dict(k=None), "k:"),
    (dict(cache_seqlens=None), "cache_seqlens"),
    (dict(cache_seqlens=torch.tensor([1, 2]) if torch else None), "cache_seqlens"),  # int64
    (dict(rotary_cos=torch.zeros(64, 12, dtype=torch.bfloat16) if torch else None,
          rotary_sin=torch.zeros(64, 12, dtype=torch.bfloat16) if torch else None), "rotary_cos.shape"),  # dim 24
    (dict(rotary_cos=torch.zeros(64, 40, dtype=torch.bfloat16) if torch else None,
          rotary_sin=torch.zeros(64, 40, dtype=torch.bfloat16) if torch else None), "rotary_cos.shape"),  # > d_head
    (dict(rotary_cos=torch.zeros(32, 16, dtype=torch.bfloat16) if torch else None), "rotary_sin.shape"),
    (dict(rotary_cos=torch.zeros(32, 16, dtype=torch.bfloat16) if torch else None,
          rotary_sin=torch.zeros(32, 16, dtype=torch.bfloat16) if torch else None), "rotary_cos.shape[0]"),
    (dict(rotary_sin=torch.zeros(64, 16, dtype=torch.float16) if torch else None), "rotary_sin"),
]


@pytest.mark.parametrize("change,name", ROTARY_REFUSALS)
def test_flash_attn_with_kvcache_rotary_refusals_name_the_argument(monkeypatch, change, name):
    if torch is None:
        pytest.skip("needs PyTorch")
    from flash_attention_scratch import _ops
    monkeypatch.setattr(_ops, "forward_kvcache", lambda *a, **kw: pytest.fail("forward_kvcache ran"))
    q = torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16)
    k_new, kc = torch.zeros(2, 1, 2, 64, dtype=torch.bfloat16), torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16)
    cos = torch.zeros(64, 16, dtype=torch.bfloat16)
    call = dict(k=k_new, v=k_new, rotary_cos=cos, rotary_sin=cos.clone(),
                cache_seqlens=torch.tensor([1, 2], dtype=torch.int32))
    call.update(change)
    with pytest.raises((ValueError, TypeError), match=re.escape(name)):
        fa.flash_attn_with_kvcache(q, kc, kc, **call)


@needs_gpu
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("page", [None, 16])
def test_flash_attn_with_kvcache_rotary_matches_reference(page, interleaved):
    """Rotary q and appended keys: the output against float64 attention over the float64-rotated
    inputs (the FlashAttention rule), and the cache rows the rotated keys."""
    dtype, b, hq, hkv, d, cap, new = torch.bfloat16, 3, 8, 2, 128, 256, 2
    q = randn(b, new, hq, d, dtype=dtype)
    k_new, v_new = randn(b, new, hkv, d, dtype=dtype), randn(b, new, hkv, d, dtype=dtype)
    k_cache, v_cache = randn(b, cap, hkv, d, dtype=dtype), randn(b, cap, hkv, d, dtype=dtype)
    lens = torch.tensor([0, 17, 200], dtype=torch.int32, device="cuda")
    cos, sin = rotary_tables(cap, 32, dtype, "cuda")  # rotary_dim 64 of d_head 128
    kc, vc, kwargs = cache_for(k_cache, v_cache, page)
    out, lse = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                         cache_seqlens=lens, causal=True, rotary_interleaved=interleaved,
                                         return_softmax_lse=True, **kwargs)
    at = lens[:, None].long() + torch.arange(new, device="cuda")
    q_rot = rotated64(q, cos, sin, at, interleaved).to(dtype)
    k_rot = rotated64(k_new, cos, sin, at, interleaved)
    stored = kc[kwargs["block_table"].long()].view(b, cap, hkv, d) if page else kc
    for i in range(b):
        n = lens[i].item()
        assert ((stored[i, n:n + new].double() - k_rot[i]).abs() <= k_rot[i].abs() * 2.0 ** -8 + 1e-6).all()
        keys = torch.cat([k_cache[i, :n], k_rot[i].to(dtype)])[None]
        values = torch.cat([v_cache[i, :n], v_new[i]])[None]
        assert_matches(out[i:i + 1], lse[i:i + 1], q_rot[i:i + 1], keys, values, d ** -0.5, True)


@needs_gpu
@pytest.mark.parametrize("page", [None, 16])
def test_flash_attn_with_kvcache_is_forward_kvcache(page):
    """The same kernels as forward_kvcache: bitwise the same output, LSE and appended cache."""
    dtype, b, hq, hkv, d, cap = torch.bfloat16, 3, 8, 2, 128, 256
    q = randn(b, 2, hq, d, dtype=dtype)
    k_new, v_new = randn(b, 2, hkv, d, dtype=dtype), randn(b, 2, hkv, d, dtype=dtype)
    lens = torch.tensor([0, 17, 200], dtype=torch.int32, device="cuda")
    kwargs = {}
    if page:
        kc = randn(b * cap // page, page, hkv, d, dtype=dtype)
        kwargs = dict(block_table=torch.arange(b * cap // page, dtype=torch.int32, device="cuda").view(b, -1))
    else:
        kc = randn(b, cap, hkv, d, dtype=dtype)
    vc = torch.randn_like(kc)
    caches = [(kc.clone(), vc.clone()) for _ in range(2)]
    ours = fa.forward_kvcache(q, *caches[0], k_new, v_new, cache_seqlens=lens, causal=True, return_lse=True,
                              **kwargs)
    theirs = fa.flash_attn_with_kvcache(q, *caches[1], k_new, v_new, cache_seqlens=lens, causal=True,
                                        return_softmax_lse=True, **kwargs)
    for a, b_ in zip(ours + caches[0], theirs + caches[1]):
        assert torch.equal(a, b_)


@needs_gpu
@pytest.mark.parametrize("variant", [dict(causal=True), dict(causal=False, window=(40, 3), softcap=20.0, splits=3)])
def test_flash_attn_with_kvcache_slots_and_left_padding_match_reference(variant):
    """cache_batch_idx and cache_leftpad: entry b attends to keys [leftpad, length + new) of slot
    cache_batch_idx[b] with the new keys appended there, against float64 attention over exactly
    those keys (the FlashAttention rule); the cache holds the new rows; an entry whose slot lies
    outside the cache, or whose leftpad lies past its keys, sees nothing."""
    from test_variants import check
    dtype, b, hq, hkv, d, slots, cap, new = torch.bfloat16, 5, 8, 2, 128, 6, 256, 2
    window, softcap, causal = variant.get("window", (-1, -1)), variant.get("softcap", 0.0), variant["causal"]
    q = randn(b, new, hq, d, dtype=dtype)
    k_new, v_new = randn(b, new, hkv, d, dtype=dtype), randn(b, new, hkv, d, dtype=dtype)
    k_cache, v_cache = randn(slots, cap, hkv, d, dtype=dtype), randn(slots, cap, hkv, d, dtype=dtype)
    idx = torch.tensor([4, 0, 5, 9, 2], dtype=torch.int32, device="cuda")  # slot 9: outside the cache
    pad = torch.tensor([0, 30, 100, 0, 50], dtype=torch.int32, device="cuda")  # 50 past entry 4's 20 keys
    lens = torch.tensor([10, 60, 255, 5, 18], dtype=torch.int32, device="cuda")  # 255 + 2: one new key dropped
    kc, vc = k_cache.clone(), v_cache.clone()
    out, lse = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, cache_batch_idx=idx,
                                         cache_leftpad=pad, causal=causal, window_size=window, softcap=softcap,
                                         num_splits=variant.get("splits", 0), return_softmax_lse=True)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i in range(b):
        s, n, p = idx[i].item(), lens[i].item(), pad[i].item()
        if s >= slots:
            assert (out[i] == 0).all() and torch.isneginf(lse[i]).all()
            continue
        kept = min(new, cap - n)
        want_k[s, n:n + kept], want_v[s, n:n + kept] = k_new[i, :kept], v_new[i, :kept]
        if p >= n + kept:
            assert (out[i] == 0).all() and torch.isneginf(lse[i]).all()
            continue
        keys, values = want_k[s, p:n + kept][None], want_v[s, p:n + kept][None]
        check(out[i:i + 1], lse[i:i + 1], q[i:i + 1], keys, values, d ** -0.5, causal=causal, window=window,
              softcap=softcap)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


@needs_gpu
def test_cache_slots_take_zero_new_keys():
    """flash_attn_with_kvcache with cache_batch_idx and k, v of no rows: nothing is appended, and
    the call is the one without them."""
    dtype = torch.bfloat16
    q = randn(2, 1, 8, 128, dtype=dtype)
    kc, vc = randn(3, 64, 2, 128, dtype=dtype), randn(3, 64, 2, 128, dtype=dtype)
    empty = randn(2, 0, 2, 128, dtype=dtype)
    idx = torch.tensor([2, 0], dtype=torch.int32, device="cuda")
    lens = torch.tensor([5, 9], dtype=torch.int32, device="cuda")
    before = kc.clone(), vc.clone()
    out = fa.flash_attn_with_kvcache(q, kc, vc, empty, empty.clone(), cache_seqlens=lens, cache_batch_idx=idx)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
    assert torch.equal(out, fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_batch_idx=idx))


@needs_gpu
def test_cache_slots_are_not_written_by_a_refused_call():
    """flash_attn_with_kvcache with cache_batch_idx appends only once the library takes the call: V
    of a head dim no kernel pairs with q's, or split-KV asked for a head dim it lacks (DeepSeek's
    MLA), raises and leaves both caches as they were."""
    dtype = torch.bfloat16
    idx = torch.tensor([2, 0], dtype=torch.int32, device="cuda")
    lens = torch.tensor([5, 9], dtype=torch.int32, device="cuda")
    for d, d_v, splits, message in ((128, 64, 0, r"^v_cache.shape\[3\] \(d_v\)"), (192, 128, 2, r"d_head")):
        q = randn(2, 1, 8, d, dtype=dtype)
        kc, vc = randn(3, 64, 2, d, dtype=dtype), randn(3, 64, 2, d_v, dtype=dtype)
        k, v = randn(2, 1, 2, d, dtype=dtype), randn(2, 1, 2, d_v, dtype=dtype)
        before = kc.clone(), vc.clone()
        with pytest.raises(ValueError, match=message):
            fa.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, cache_batch_idx=idx, num_splits=splits)
        assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


@needs_gpu
@pytest.mark.parametrize("num_splits", [1, 2, 5, 16])
@pytest.mark.parametrize("page", [None, 16])
@pytest.mark.parametrize("variant", [dict(causal=True, window=(200, 0)), dict(causal=False, softcap=30.0)],
                         ids=["window", "softcap"])
def test_flash_attn_with_kvcache_variants_take_any_num_splits(num_splits, page, variant):
    """A window or a softcap with any num_splits (flash_attn's split-KV hint; such calls run on
    the sm90 variant kernels, which split no keys): decoding and a short chunk, contiguous and
    paged, against float64 attention over each entry's keys."""
    from test_variants import check
    dtype, b, hq, hkv, d, cap = torch.bfloat16, 3, 8, 2, 128, 1024
    window, softcap, causal = variant.get("window", (-1, -1)), variant.get("softcap", 0.0), variant["causal"]
    k_cache, v_cache = randn(b, cap, hkv, d, dtype=dtype), randn(b, cap, hkv, d, dtype=dtype)
    lens = torch.tensor([900, 3, cap - 4], dtype=torch.int32, device="cuda")
    kc, vc, paged = cache_for(k_cache, v_cache, page)
    for seq_q in (1, 4):
        q = randn(b, seq_q, hq, d, dtype=dtype)
        out, lse = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=causal, window_size=window,
                                             softcap=softcap, num_splits=num_splits, return_softmax_lse=True,
                                             **paged)
        for i in range(b):
            n = lens[i].item()
            check(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k_cache[i:i + 1, :n], v_cache[i:i + 1, :n], d ** -0.5,
                  causal=causal, window=window, softcap=softcap)


def test_flash_attn_varlen_func_runs_a_paged_forward_on_grad_inputs_and_refuses_its_backward(monkeypatch):
    """flash_attn runs a paged forward on inputs that require grad (its tests do); pages have no
    backward pass here, so the output's backward raises instead of leaving the inputs without
    gradients. (forward_varlen replaced by a stand-in: no GPU needed.)"""
    if torch is None:
        pytest.skip("needs PyTorch")
    from flash_attention_scratch import _ops
    calls = []

    def stand_in(q, k, v, *args, return_lse=False, **kwargs):
        calls.append((q.requires_grad, k.requires_grad, kwargs["block_table"]))
        out = torch.ones_like(q)
        return (out, torch.zeros(q.shape[1], q.shape[0])) if return_lse else out

    monkeypatch.setattr(_ops, "forward_varlen", stand_in)
    q = torch.zeros(3, 2, 64, requires_grad=True)
    pages = torch.zeros(4, 16, 2, 64, requires_grad=True)
    table = torch.zeros(1, 4, dtype=torch.int32)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    out, lse, probs = fa.flash_attn_varlen_func(q, pages, pages, cu, cu, 3, 64, block_table=table,
                                                return_attn_probs=True)
    assert calls == [(False, False, table)] and probs is None
    assert out.requires_grad and torch.equal(out, torch.ones(3, 2, 64))
    with pytest.raises(NotImplementedError, match="block_table has no backward pass"):
        out.sum().backward()
