"""FP8 attention from PyTorch: torch.float8_e4m3fn q, k and v with flash_attn's descales (float32,
(batch, heads_kv)), a bfloat16 output. Checked against float64 attention of the dequantised inputs:
FP8 rounds each probability to 3 mantissa bits, so the bound is the FP8 rule's scale (a few percent
of the output), far below what a wrong kernel gives (an all-zero output misses by the output's
size)."""

import random

import pytest

import flash_attention_scratch as fa

try:
    import torch
except ImportError:
    torch = None

fp8 = getattr(torch, "float8_e4m3fn", None) if torch is not None else None
needs_torch_fp8 = pytest.mark.skipif(fp8 is None, reason="needs a PyTorch with torch.float8_e4m3fn")


def fp8_built():
    return any(c.dtype == fa.DType.E4M3 and c.is_supported() for c in fa.configs())


needs_fp8_kernels = pytest.mark.skipif(
    fp8 is None or not torch.cuda.is_available() or fa.device_count() == 0 or not fp8_built(),
    reason="needs a Hopper GPU and a build with FP8 kernels (the default build has them)",
)


def quantised(x, heads_kv):
    """x (batch, seq, heads, d) in float32 as e4m3 with a descale per (batch, K/V head) that maps
    its largest magnitude to 240 (inside e4m3's 448), and the dequantised values."""
    batch, seq, heads, d = x.shape
    group = heads // heads_kv
    amax = x.abs().reshape(batch, seq, heads_kv, group, d).amax(dim=(1, 3, 4)).clamp_min(1e-6)
    descale = (amax / 240).float()
    scale = descale.repeat_interleave(group, dim=1)[:, None, :, None]
    x8 = (x / scale).to(fp8)
    return x8, descale.contiguous(), x8.double() * scale.double()


def spread(x, heads_kv, low, high):
    """x (batch, seq, heads, d) with each (batch, K/V head) group scaled by a factor of its own in
    [low, high), so that the groups' descales differ: a kernel reading another group's shows."""
    batch, heads = x.shape[0], x.shape[2]
    factor = torch.rand(batch, heads_kv, device=x.device) * (high - low) + low
    return x * factor.repeat_interleave(heads // heads_kv, dim=1)[:, None, :, None]


def reference(q, k, v, causal):
    """float64 attention of (batch, seq, heads, d) tensors, K/V heads shared by query groups, causal
    at the bottom right; the output and the LSE (batch, heads, seq_q)."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if causal:
        seq_q, seq_k = q.shape[1], k.shape[1]
        keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # a row that sees no key (causal, more queries than keys) gives 0, as flash_attn's do
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def check_against_reference(shape, causal, config=None):
    """Random inputs of shape (batch, seq_q, seq_k, heads, heads_kv, d) quantised per (batch, K/V
    head); O within 8% of the output's size (FP8's P has 3 mantissa bits) and the LSE within 0.02."""
    batch, seq_q, seq_k, heads, heads_kv, d = shape
    seed = random.randrange(2**31)  # fresh inputs each run, the seed in every message
    torch.manual_seed(seed)
    # Q's and K's groups apart by up to 2x in the scores' scale, V's by up to 4x in O's.
    q8, qs, qd = quantised(spread(torch.randn(batch, seq_q, heads, d, device="cuda"), heads_kv, 0.7, 1.4),
                           heads_kv)
    k8, ks, kd = quantised(spread(torch.randn(batch, seq_k, heads_kv, d, device="cuda"), heads_kv, 0.7, 1.4),
                           heads_kv)
    v8, vs, vd = quantised(spread(torch.randn(batch, seq_k, heads_kv, d, device="cuda"), heads_kv, 0.5, 2.0),
                           heads_kv)
    out, lse = fa.forward(q8, k8, v8, causal=causal, return_lse=True, q_descale=qs, k_descale=ks, v_descale=vs,
                          config=config)
    assert out.dtype == torch.bfloat16 and out.shape == (batch, seq_q, heads, d)
    ref, ref_lse = reference(qd, kd, vd, causal)
    error = (out.double() - ref).abs().max().item()
    assert error <= 0.08 * ref.abs().max().item() + 1e-3, f"{config}: max|out - ref| {error}; seed {seed}"
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), f"seed {seed}"
    assert (lse.double() - ref_lse)[seen].abs().max().item() <= 0.02, f"{config}; seed {seed}"


@needs_fp8_kernels
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2, 128), (1, 129, 2048, 8, 1, 128), (1, 300, 77, 2, 2, 256),
                                   (2, 333, 700, 4, 2, 64)])
def test_fp8_forward_matches_dequantised_reference(shape, causal):
    """The automatic choice: an sm90 FP8 kernel, or at a head dim without one in the build
    the split-KV kernel's e4m3 instances."""
    check_against_reference(shape, causal)


@needs_fp8_kernels
def test_every_built_fp8_config():
    """Each FP8 kernel by name (config=), causal and not, over several tiles of odd lengths."""
    configs = [c for c in fa.configs() if c.dtype == fa.DType.E4M3 and c.is_supported()]
    for c in configs:
        for causal in (False, True):
            check_against_reference((1, 333, 517, 4, 2, c.d_head), causal, config=c)


@needs_fp8_kernels
def test_fp8_under_torch_compile():
    """fullgraph torch.compile traces FP8 attention (the custom op forward_fp8): the same kernel's
    output as eager, bit for bit, with the LSE and with out=."""
    q8, qs, _ = quantised(torch.randn(2, 300, 4, 128, device="cuda"), 2)
    k8, ks, _ = quantised(torch.randn(2, 500, 2, 128, device="cuda"), 2)
    v8, vs, _ = quantised(torch.randn(2, 500, 2, 128, device="cuda"), 2)

    def attend(q, k, v, out=None):
        return fa.forward(q, k, v, causal=True, return_lse=True, q_descale=qs, k_descale=ks, v_descale=vs, out=out)

    eager, eager_lse = attend(q8, k8, v8)
    compiled, compiled_lse = torch.compile(attend, fullgraph=True)(q8, k8, v8)
    assert torch.equal(compiled, eager) and torch.equal(compiled_lse, eager_lse)
    out = torch.full_like(eager, float("nan"))
    written, _ = torch.compile(attend, fullgraph=True)(q8, k8, v8, out)
    assert torch.equal(out, eager) and torch.equal(written, eager)


@needs_torch_fp8
def test_descales_of_the_wrong_type_are_type_errors():
    """A descale that is no float32 tensor is a TypeError (the package's rule for types), one of the
    wrong shape or missing a ValueError; both name it."""
    from flash_attention_scratch import _ops
    q, ones = torch.zeros(1, 4, 2, 64), torch.ones(1, 2)
    with pytest.raises(TypeError, match="^k_descale: expected a torch.float32 tensor .* got a torch.float64 tensor"):
        _ops._check_descales(q, q, (ones, ones.double(), ones))
    with pytest.raises(TypeError, match="^v_descale: .* got float"):
        _ops._check_descales(q, q, (ones, ones, 0.5))
    with pytest.raises(ValueError, match=r"^q_descale: expected .* shape \(batch, heads_kv\) = \(1, 2\)"):
        _ops._check_descales(q, q, (torch.ones(2, 1), ones, ones))
    with pytest.raises(ValueError, match="^q_descale: expected .* got NoneType"):
        _ops._check_descales(q, q, (None, ones, ones))
    assert all(d.is_contiguous() for d in _ops._check_descales(q, q, (ones, ones.t().t(), ones)))


@needs_fp8_kernels
def test_fp8_window_that_states_causal_is_causal():
    """window_size=(-1, 0) states causal masking, as for 16-bit inputs: the causal answer, bit for bit
    (forward and the KV cache)."""
    torch.manual_seed(random.randrange(2**31))
    q8, qs, _ = quantised(torch.randn(1, 200, 4, 128, device="cuda"), 2)
    k8, ks, _ = quantised(torch.randn(1, 300, 2, 128, device="cuda"), 2)
    v8, vs, _ = quantised(torch.randn(1, 300, 2, 128, device="cuda"), 2)
    descales = dict(q_descale=qs, k_descale=ks, v_descale=vs)
    causal = fa.forward(q8, k8, v8, causal=True, **descales)
    assert torch.equal(fa.forward(q8, k8, v8, window_size=(-1, 0), **descales), causal)
    lengths = torch.tensor([300], dtype=torch.int32, device="cuda")
    causal = fa.forward_kvcache(q8, k8, v8, cache_seqlens=lengths, causal=True, **descales)
    assert torch.equal(fa.forward_kvcache(q8, k8, v8, cache_seqlens=lengths, window_size=(-1, 0), **descales),
                       causal)


@needs_fp8_kernels
def test_fp8_errors_name_the_argument():
    q8 = torch.randn(1, 64, 2, 128, device="cuda").to(fp8)
    ones = torch.ones(1, 2, device="cuda")
    with pytest.raises(ValueError, match="v_descale: expected a torch.float32 tensor of shape"):
        fa.forward(q8, q8, q8, q_descale=ones, k_descale=ones)
    with pytest.raises(ValueError, match=r"k_descale: expected .*\(1, 2\)"):
        fa.forward(q8, q8, q8, q_descale=ones, k_descale=torch.ones(2, 1, device="cuda"), v_descale=ones)
    with pytest.raises(TypeError, match="k.dtype: expected torch.float8_e4m3fn"):
        fa.forward(q8, q8.to(torch.bfloat16), q8, q_descale=ones, k_descale=ones, v_descale=ones)
    with pytest.raises(TypeError, match="out.dtype: expected torch.bfloat16"):
        fa.forward(q8, q8, q8, q_descale=ones, k_descale=ones, v_descale=ones,
                   out=torch.empty(1, 64, 2, 128, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out: expected shape \(1, 64, 2, 128\)"):
        fa.forward(q8, q8, q8, q_descale=ones, k_descale=ones, v_descale=ones,
                   out=torch.empty(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="expected none with torch.float8_e4m3fn inputs"):
        fa.forward(q8, q8, q8, q_descale=ones, k_descale=ones, v_descale=ones, softcap=30.0)


@needs_fp8_kernels
def test_fp8_inputs_that_require_grad_are_refused():
    """FP8 attention has no backward pass: an output without a graph would lose the gradients."""
    q8 = torch.randn(1, 64, 2, 128, device="cuda").to(fp8)
    ones = torch.ones(1, 2, device="cuda")
    for name in ("q", "k", "v"):
        args = dict(q=q8, k=q8.clone(), v=q8.clone())
        args[name] = args[name].clone().requires_grad_()
        with pytest.raises(NotImplementedError, match=f"^{name}: expected a tensor that does not require grad"):
            fa.forward(**args, q_descale=ones, k_descale=ones, v_descale=ones)
    with torch.no_grad():
        fa.forward(q8.clone().requires_grad_(), q8, q8, q_descale=ones, k_descale=ones, v_descale=ones)


@needs_torch_fp8
def test_fp8_checks_before_any_device_work():
    """Runs without a GPU: FP8 inputs off CUDA, and descales with 16-bit inputs, are refused first."""
    q8 = torch.zeros(1, 4, 2, 128).to(fp8)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        fa.forward(q8, q8, q8)
    q16 = torch.zeros(1, 4, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q_descale: expected None for inputs that are not torch.float8_e4m3fn"):
        fa.forward(q16, q16, q16, q_descale=torch.ones(1, 2))


needs_hopper_fp8 = pytest.mark.skipif(
    fp8 is None or not torch.cuda.is_available() or fa.device_count() == 0
    or torch.cuda.get_device_capability()[0] < 9,
    reason="needs a Hopper GPU and a PyTorch with torch.float8_e4m3fn (FP8 caches run on every build)",
)


@needs_hopper_fp8
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("seq_q,d", [(1, 128), (16, 128), (1, 256), (200, 128), (1, 64), (16, 64)])
def test_fp8_kvcache_matches_dequantised_reference(paged, seq_q, d):
    """An FP8 cache (contiguous, or 16-row pages in a shuffled order) with new rows appended:
    decoding, speculative decoding and chunked prefill on the split-KV kernel, causal, GQA 4,
    against float64 attention of each sequence's dequantised keys. The kernel computes in fp16 on
    the exact e4m3 values, so its error is the 16-bit kernels' (bound: 1% of the output)."""
    torch.manual_seed(seq_q * 31 + d + paged)
    batch, heads, heads_kv, capacity, seq_new = 3, 8, 2, 1024, 2
    lengths = torch.tensor([0, 517, capacity - seq_new], dtype=torch.int32, device="cuda")
    q8, qs, qd = quantised(torch.randn(batch, seq_q, heads, d, device="cuda"), heads_kv)
    k8, ks, kd = quantised(torch.randn(batch, capacity, heads_kv, d, device="cuda"), heads_kv)
    v8, vs, vd = quantised(torch.randn(batch, capacity, heads_kv, d, device="cuda"), heads_kv)
    # The new rows in the caches' e4m3 scale: their real values are the stored ones x descale.
    kn8 = torch.randn(batch, seq_new, heads_kv, d, device="cuda").to(fp8)
    vn8 = torch.randn(batch, seq_new, heads_kv, d, device="cuda").to(fp8)
    k_cache, v_cache, table = k8.clone(), v8.clone(), None
    if paged:
        page, pages = 16, batch * capacity // 16
        order = torch.randperm(pages, device="cuda")
        table = order.reshape(batch, capacity // page).to(torch.int32)
        k_cache = torch.empty(pages, page, heads_kv, d, device="cuda", dtype=fp8)
        v_cache = torch.empty_like(k_cache)
        k_cache.view(torch.uint8)[order] = k8.view(torch.uint8).reshape(pages, page, heads_kv, d)
        v_cache.view(torch.uint8)[order] = v8.view(torch.uint8).reshape(pages, page, heads_kv, d)
    out, lse = fa.forward_kvcache(q8, k_cache, v_cache, kn8, vn8, cache_seqlens=lengths, block_table=table,
                                  causal=True, return_lse=True, q_descale=qs, k_descale=ks, v_descale=vs)
    assert out.dtype == torch.bfloat16 and out.shape == (batch, seq_q, heads, d)
    for b in range(batch):
        n = int(lengths[b])
        scale_k, scale_v = ks[b][None, :, None].double(), vs[b][None, :, None].double()
        keys = torch.cat([kd[b, :n], kn8[b].double() * scale_k])[None]
        values = torch.cat([vd[b, :n], vn8[b].double() * scale_v])[None]
        ref, ref_lse = reference(qd[b:b + 1], keys, values, True)
        error = (out[b:b + 1].double() - ref).abs().max().item()
        assert error <= 0.01 * ref.abs().max().item() + 1e-3, f"sequence {b}: max|out - ref| {error}"
        # Rows that see no key (sequence 0's first queries: 2 keys under 16 or 200 causal rows)
        # have LSE -inf, as in the reference.
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[b:b + 1]), seen), f"sequence {b}: rows without keys"
        if seen.any():
            assert (lse[b:b + 1].double() - ref_lse)[seen].abs().max().item() <= 1e-3
    # The appended rows are in both caches, byte for byte as given, and every other row as it was.
    for cache, before, new, name in ((k_cache, k8, kn8, "k_cache"), (v_cache, v8, vn8, "v_cache")):
        rows = cache.view(torch.uint8)
        if paged:
            rows = rows[table.long()].reshape(batch, capacity, heads_kv, d)
        expected = before.view(torch.uint8).clone()
        for b in range(batch):
            n = int(lengths[b])
            expected[b, n:n + seq_new] = new.view(torch.uint8)[b]
        assert torch.equal(rows, expected), f"{name}: appended or untouched rows differ"


@needs_hopper_fp8
def test_fp8_kvcache_under_torch_compile():
    """fullgraph torch.compile traces an FP8 decode step (the custom op forward_kvcache with its
    descales): the eager call's output, bit for bit."""
    q8, qs, _ = quantised(torch.randn(4, 1, 8, 128, device="cuda"), 2)
    k8, ks, _ = quantised(torch.randn(4, 2048, 2, 128, device="cuda"), 2)
    v8, vs, _ = quantised(torch.randn(4, 2048, 2, 128, device="cuda"), 2)

    def step(q, k, v):
        return fa.forward_kvcache(q, k, v, q_descale=qs, k_descale=ks, v_descale=vs)

    eager = step(q8, k8, v8)
    assert torch.equal(torch.compile(step, fullgraph=True)(q8, k8, v8), eager)


@needs_torch_fp8
def test_fp8_kvcache_errors_name_the_argument():
    """Descales with a 16-bit cache, variants with an FP8 one, and a 16-bit cache under FP8 q are
    refused with the argument named (before any device work where the host can tell)."""
    q16 = torch.zeros(1, 1, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q_descale: expected None for inputs that are not torch.float8_e4m3fn"):
        fa.forward_kvcache(q16, q16, q16, q_descale=torch.ones(1, 2))
    if not torch.cuda.is_available():
        return
    q8 = torch.zeros(1, 1, 2, 128, device="cuda").to(fp8)
    ones = torch.ones(1, 2, device="cuda")
    with pytest.raises(ValueError, match="expected none with torch.float8_e4m3fn inputs"):
        fa.forward_kvcache(q8, q8, q8, q_descale=ones, k_descale=ones, v_descale=ones, softcap=30.0)
    with pytest.raises(TypeError, match="v_cache.dtype: expected torch.float8_e4m3fn"):
        fa.forward_kvcache(q8, q8, q8.to(torch.bfloat16), q_descale=ones, k_descale=ones, v_descale=ones)
    with pytest.raises(ValueError, match="k_descale: expected a torch.float32 tensor of shape"):
        fa.forward_kvcache(q8, q8, q8, q_descale=ones, v_descale=ones)
