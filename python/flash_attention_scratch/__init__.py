"""FlashAttention kernels written from scratch in CUDA C++: the forward pass, and its
backward pass for training.

    import flash_attention_scratch as fas
    out = fas.forward(q, k, v)  # (batch, seq, heads, d_head) fp16/bf16 CUDA tensors
    out.backward(dout)          # q.grad, k.grad, v.grad where they require grad

Tensors reach the C++ library through DLPack and the kernels run on PyTorch's current
CUDA stream. `forward` is also the custom op `torch.ops.flash_attention_scratch.forward`
(and `forward_lse`, `forward_out`, `backward`), with fake implementations, so
torch.compile (fullgraph, forward and backward) and CUDA-graph capture work.

PyTorch SDPA's layout is (batch, heads, seq, d_head): pass `q.transpose(1, 2)` (a view,
no copy). `causal=True` aligns the mask at the bottom right (flash_attn's convention),
which differs from SDPA's `is_causal` when seq_q != seq_k; `causal_alignment="top_left"`
gives SDPA's. `flash_attn_func` takes flash_attn's arguments and returns what it returns.

Autograd: where q, k or v require grad under grad mode, forward() records a graph and
the backward pass computes dq, dk, dv (returned contiguous) for plain and causal
attention (either alignment), any lengths and grouped-query attention (dk, dv keep k's
and v's shapes); a gradient through the returned LSE (return_lse=True) is included. deterministic=True
gives bitwise-identical gradients from run to run, a batch row's independent of the rest
of the batch; by default the fastest kernel runs.

The attention variants of today's models take flash_attn's and FlashAttention-4's
arguments on every entry point: `window_size=(left, right)` (sliding window, -1
unbounded, aligned like causal), `softcap=` (Gemma-2's logit softcap, 0 off),
`learnable_sink=` (gpt-oss's attention sinks, float32 (heads,)) and `alibi_slopes=`
(ALiBi: BLOOM's, MPT's linear position bias, float32 (heads,) or (batch, heads)). All four
train, alone or together (the ALiBi slopes get no gradient, as in flash_attn).
forward_varlen and flash_attn_varlen_func (packed sequences) train too. A KV cache is
inference's: forward_kvcache, and forward_varlen with a block_table, have no backward pass; with
an input that requires grad under grad mode they raise NotImplementedError before any work
rather than return an output that silently drops the gradient.
"""

from ._C import DType, Family, KernelConfig
from ._C import __version__
from ._C import configs as _configs
from ._C import device_count, release_cached_memory, reload_tuning_cache

__all__ = [
    "__version__",
    "forward",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "forward_varlen",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "forward_kvcache",
    "flash_attn_with_kvcache",
    "configs",
    "KernelConfig",
    "DType",
    "Family",
    "device_count",
    "reload_tuning_cache",
    "release_cached_memory",
]


def configs():
    """Every kernel config compiled into this build."""
    return list(_configs())


# PyTorch is optional and imported here only if it is installed: the extension module is
# self-contained (no symbol of it is visible to other libraries), so the import order of
# this package and torch does not matter.
try:
    import torch as _torch
except ImportError:  # the package works without PyTorch; forward() needs it
    _torch = None

if _torch is not None:
    from . import _ops  # registers torch.ops.flash_attention_scratch.*


def forward(q, k, v, *, softmax_scale=None, causal=False, causal_alignment="bottom_right", return_lse=False,
            config=None, out=None, window_size=(-1, -1), softcap=0.0, learnable_sink=None, alibi_slopes=None,
            deterministic=False, q_descale=None, k_descale=None, v_descale=None):
    """softmax(q·kᵀ·scale)·v for float16/bfloat16 CUDA tensors: q (batch, seq_q, heads,
    d_head), k and v (batch, seq_k, heads_kv, d_head) with heads a multiple of heads_kv
    (grouped-query attention); any lengths; d_head 64, 96, 128, 192 or 256. v's head dim may be
    128 with d_head 192 (DeepSeek's MLA; the output then has 128 columns). Differentiable: see
    "Autograd" below.

    softmax_scale: default 1/sqrt(d_head). causal: query i sees keys j <= i + seq_k - seq_q
    (aligned at the bottom right, unlike SDPA's is_causal), or with
    causal_alignment="top_left" keys j <= i (SDPA's is_causal); a row that sees no key gets
    zeros. return_lse: also return the log-sum-exp, float32 (batch, heads, seq_q), natural
    log (-inf for rows that see no key). config: a KernelConfig or its short form to run
    that kernel instead of the automatic choice (the forward's; a backward takes the
    automatic choice). out: a tensor to write the result into (returned); by default a new
    contiguous tensor. Any batch/seq/head strides work; the head dim must be contiguous.

    window_size=(left, right): a sliding window, query i sees keys j with d - left <= j <= d
    + right where d is i's diagonal position (i + seq_k - seq_q, or i with
    causal_alignment="top_left"); -1 leaves a side unbounded; with causal, right must be -1
    or 0; (-1, 0) is causal masking (here, in forward_varlen and in forward_kvcache). Blocks
    outside the window are skipped. softcap: scores become softcap *
    tanh(scores / softcap) before the softmax (0: off). learnable_sink: float32 (heads,)
    logits, one per query head, that join each row's softmax denominator with no value
    (the LSE includes them; a row that sees no key gets zeros and LSE = its sink).
    alibi_slopes: ALiBi, float32 slopes on q's device, (heads,) for the whole batch or
    (batch, heads): score (i, j) gets -slope * |d - j| added after the scale and the softcap,
    d being i's diagonal position as for the window, with or without causal (the LSE
    includes the bias).

    Autograd: when q, k or v requires grad under grad mode, the call records the custom op
    forward_lse (the backward reads the LSE; it is returned only with return_lse=True) and
    backward() gives dq, dk and dv, contiguous, with k's and v's shapes under grouped-query
    attention (summed over the query heads that share a K/V head). A gradient that reaches
    the returned LSE is included exactly. Plain and causal attention (either alignment),
    window_size, softcap, learnable_sink and alibi_slopes, alone or together (a sink that
    requires grad gets its float32 gradient, summed in a fixed order; the slopes get none, as
    in flash_attn; the backward skips the blocks outside the window as the forward does).
    out= with an input that requires grad raises RuntimeError, as PyTorch's out= functions
    do: an out= tensor cannot carry a graph (use it under torch.no_grad()). Without grad (no_grad,
    inference_mode, or no input requiring it) the call takes the eager path with no graph
    and no LSE unless asked for. deterministic=True makes the backward's gradients bitwise
    identical from run to run (on Hopper an ordered dQ accumulation: 8-37% slower at 2k-8k
    tokens, H100, 2026-12-07); by default the fastest kernel runs, whose dQ may differ in the last
    bits between runs.

    FP8: torch.float8_e4m3fn q, k and v with q_descale, k_descale and v_descale (flash_attn's
    names), float32 (batch, heads_kv) tensors on q's device that dequantise them (real value =
    stored value x descale, a query head taking its K/V head's); the output is bfloat16. Hopper
    only, d_head 64, 128 or 256, no window, softcap,
    sinks or ALiBi, and no autograd; torch.compile traces it (the custom op forward_fp8).

    Raises ValueError for bad arguments, TypeError for unsupported dtypes, and RuntimeError
    for CUDA failures (including no GPU), each with the library's message; the backward
    raises the same way.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.forward needs PyTorch, which is not installed")
    return _ops.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, causal_alignment=causal_alignment,
                        return_lse=return_lse, config=config, out=out, window_size=window_size, softcap=softcap,
                        learnable_sink=learnable_sink, alibi_slopes=alibi_slopes, deterministic=deterministic,
                        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_func's arguments and results, on this library's kernels: q
    (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim),
    float16/bfloat16 CUDA tensors, nheads a multiple of nheads_k; headdim 64, 96, 128, 192 or 256
    (a headdim that is not contiguous is copied first, as flash_attn does). causal aligns the
    mask at the bottom right (query i sees keys j <= i + seqlen_k - seqlen_q). window_size and softcap as flash_attn reads them (a negative side, or one of at
    least seqlen_k keys, is unbounded; causal sets the right side to 0; (-1, 0) is causal).

    Returns out (batch, seqlen_q, nheads, headdim), or with return_attn_probs=True the
    tuple (out, softmax_lse, None): softmax_lse float32 (batch, nheads, seqlen_q), and
    None where flash_attn returns S_dmask, which it fills only with dropout (none here). A
    row that sees no key gets zeros and softmax_lse -inf, the log of its empty sum (flash_attn
    2's kernels without a key split give +inf there).
    Differentiable as forward() is (window_size, softcap and alibi_slopes included,
    grouped-query attention); unlike flash_attn, a gradient that reaches softmax_lse is not
    dropped but included.

    alibi_slopes: float32 (nheads,) or (batch, nheads) on q's device, as flash_attn takes
    them: score (i, j) gets -slope * |i + seqlen_k - seqlen_q - j| added, and softmax_lse
    includes it (flash_attn's causal kernels add slope * j instead: the same output, an LSE
    larger by slope * (i + seqlen_k - seqlen_q)); the slopes get no gradient. dropout_p other
    than 0 raises NotImplementedError (no dropout here), before any work. deterministic=True:
    bitwise-identical gradients from run to run, as in flash_attn. FP8 inputs raise TypeError:
    they run through forward(), which takes their descales. Unlike flash_attn, softmax_scale must
    be positive (flash_attn's 0 gives uniform attention) and seqlen_k 0 raises ValueError
    (flash_attn returns zeros): both name the argument.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.flash_attn_func needs PyTorch, which is not installed")
    return _ops.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_qkvpacked_func: flash_attn_func on qkv (batch, seqlen, 3, nheads,
    headdim), q, k and v stacked along dim 2, read as views (no copy). The gradient reaches qkv
    as one tensor. Other arguments and results as flash_attn_func's.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.flash_attn_qkvpacked_func needs PyTorch, which is not installed")
    return _ops.flash_attn_qkvpacked_func(qkv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                          deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_kvpacked_func: flash_attn_func with kv (batch, seqlen_k, 2,
    nheads_k, headdim), k and v stacked along dim 2 (nheads a multiple of nheads_k), read as
    views. Other arguments and results as flash_attn_func's.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.flash_attn_kvpacked_func needs PyTorch, which is not installed")
    return _ops.flash_attn_kvpacked_func(q, kv, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                         deterministic, return_attn_probs)


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale=None,
                   causal=False, causal_alignment="bottom_right", seqused_k=None, block_table=None, num_splits=0,
                   return_lse=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None, alibi_slopes=None,
                   deterministic=False):
    """Attention over a batch of sequences of different lengths, packed along the token
    axis (flash_attn.flash_attn_varlen_func): q (total_q, heads, d_head), k and v
    (total_k, heads_kv, d_head), cu_seqlens_q / cu_seqlens_k int32 (batch + 1,) offsets
    starting at 0. With block_table (int32 (batch, max_pages)) k and v are the pages of a
    paged cache, (num_pages, page_size, heads_kv, d_head) with page_size a multiple of 16,
    and the key lengths come from seqused_k (int32 (batch,)) or cu_seqlens_k.

    causal aligns each sequence's queries with the end of its keys (bottom right), or with
    causal_alignment="top_left" with their start.
    max_seqlen_q must be at least every query length and at most total_q (it sizes the
    grid; flash_attn_varlen_func takes any larger bound). num_splits: 0
    for the library's choice (long queries run on the sm90 kernels on Hopper, as forward()
    does, paged or not), n >= 1 for the serving kernel with n key ranges per sequence. return_lse: also the log-sum-exp,
    float32 (heads, total_q). Offsets and lengths are not read on the host (no
    synchronisation; CUDA graphs work): a sequence that reaches past its tensor is cut at
    the tensor's end, and a page id outside the cache reads as zeros. window_size, softcap,
    learnable_sink and alibi_slopes as in forward(), per sequence (alibi_slopes (batch, heads):
    one row per sequence); a window, softcap or ALiBi runs on the sm90 kernels (Hopper,
    whatever num_splits says) and raises ValueError elsewhere.

    Autograd (without block_table): with inputs that require grad the call records the op
    forward_varlen and backward() gives dq, dk and dv of the packed tensors (and the sinks'
    gradient), as forward() does; rows no sequence uses get zero gradients, and nothing is
    read on the host. deterministic=True: bitwise-identical gradients from run to run. A
    paged cache is inference's: with inputs that require grad it raises NotImplementedError.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.forward_varlen needs PyTorch, which is not installed")
    return _ops.forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=softmax_scale, causal=causal, causal_alignment=causal_alignment,
                               seqused_k=seqused_k,
                               block_table=block_table, num_splits=num_splits, return_lse=return_lse,
                               window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                               alibi_slopes=alibi_slopes, deterministic=deterministic)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn.flash_attn_varlen_func: forward_varlen with flash_attn's arguments and
    reading of them (causal aligned at the bottom right; a negative window side, or one of at
    least max_seqlen_k keys, is unbounded; max_seqlen_q any upper bound of the query lengths).
    Differentiable as forward_varlen is. With
    return_attn_probs, (out, softmax_lse (heads, total_q), None). alibi_slopes as
    flash_attn_func's, each sequence with its own lengths ((batch, nheads): a row per
    sequence). dropout_p other than 0 raises NotImplementedError before any work. With
    block_table and inputs that require grad the forward runs, as flash_attn's does
    (forward_varlen refuses such inputs), and the output's backward raises
    NotImplementedError: pages have no backward pass.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.flash_attn_varlen_func needs PyTorch, which is not installed")
    return _ops.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                       softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                       return_attn_probs, block_table)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn.flash_attn_varlen_qkvpacked_func: flash_attn_varlen_func on qkv (total, 3,
    nheads, headdim), q, k and v stacked along dim 1 and read as views, with one set of offsets
    (cu_seqlens, max_seqlen) for queries and keys. Other arguments and results as
    flash_attn_varlen_func's.
    """
    if _torch is None:
        raise RuntimeError(
            "flash_attention_scratch.flash_attn_varlen_qkvpacked_func needs PyTorch, which is not installed")
    return _ops.flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal,
                                                 window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_varlen_kvpacked_func: flash_attn_varlen_func with kv (total_k, 2,
    nheads_k, headdim), k and v stacked along dim 1 and read as views. Other arguments and
    results as flash_attn_varlen_func's.
    """
    if _torch is None:
        raise RuntimeError(
            "flash_attention_scratch.flash_attn_varlen_kvpacked_func needs PyTorch, which is not installed")
    return _ops.flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                                deterministic, return_attn_probs)


def forward_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                    softmax_scale=None, causal=False, causal_alignment="bottom_right", num_splits=0,
                    return_lse=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None, alibi_slopes=None,
                    q_descale=None, k_descale=None, v_descale=None):
    """Attention against a KV cache (flash_attn.flash_attn_with_kvcache): q (batch, seq_q,
    heads, d_head); k_cache, v_cache (batch_cache, seq_cache, heads_kv, d_head), or with
    block_table (int32 (batch, max_pages)) a paged cache (num_pages, page_size, heads_kv,
    d_head), page_size a multiple of 16. cache_seqlens: int or int32 (batch,) keys already
    in the cache (None: all of a contiguous cache). k, v (batch, seq_new, heads_kv, d_head):
    appended to the cache at cache_seqlens before attention (in place), which then sees
    cache_seqlens + seq_new keys.

    Decoding splits the keys across CTAs and merges the parts by their log-sum-exp; how a
    row's keys are split depends on its own length and the call's shape, never on the
    rest of the batch. causal: the queries end with the keys (bottom right), or with
    causal_alignment="top_left" start with them. return_lse: also the log-sum-exp, float32
    (batch, heads, seq_q). window_size, softcap, learnable_sink and alibi_slopes as in
    forward(), each entry against its own keys; a window, softcap or ALiBi runs on the sm90
    kernels (Hopper, no key split, whatever num_splits says) and raises ValueError elsewhere;
    sinks run on every path.

    FP8 caches: torch.float8_e4m3fn q, caches (and k, v) with q_descale, k_descale and v_descale
    as in forward(), (batch, heads_kv) float32; the output is bfloat16. d_head 64, 128 or 256, no
    variants; Hopper. They run on the split-KV kernel, which reads the e4m3 bytes (half a 16-bit
    cache's) and computes in fp16 on the exactly converted values.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.forward_kvcache needs PyTorch, which is not installed")
    return _ops.forward_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                block_table=block_table, softmax_scale=softmax_scale, causal=causal,
                                causal_alignment=causal_alignment, num_splits=num_splits,
                                return_lse=return_lse, window_size=window_size, softcap=softcap,
                                learnable_sink=learnable_sink, alibi_slopes=alibi_slopes,
                                q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flash_attn.flash_attn_with_kvcache: forward_kvcache with flash_attn's arguments, in its
    order, and its reading of them (causal aligned at the bottom right; a negative window side,
    or one of at least the cache's capacity in keys, is unbounded; (-1, 0) is causal). Returns
    out, or with return_softmax_lse (out, softmax_lse (batch, nheads, seqlen_q) float32). k and
    v are appended to the cache in place at cache_seqlens, as in flash_attn.

    rotary_cos / rotary_sin ((seqlen_ro, rotary_dim / 2), q's dtype) rotate q and the new
    keys as flash_attn does (k is then required): the keys at positions cache_seqlens,
    cache_seqlens + 1, ..., the queries there too when causal or windowed, else all at
    cache_seqlens; pairs (2i, 2i + 1) with rotary_interleaved, else (i, i + rotary_dim / 2).
    The rotation is a separate pass over q and k in fp32 (flash_attn fuses it into its kernel).

    cache_batch_idx ((batch,) int32: entry b uses cache slot cache_batch_idx[b]) and
    cache_leftpad ((batch,) int32: entry b's keys start at that row) work on caches that are not
    paged, as in flash_attn: entry b sees keys [cache_leftpad[b], cache_seqlens[b] + new) of its
    slot, causal aligned at their end, and k and v are appended to its slot. They run as
    forward_varlen over the cache read as one packed tensor. Indices are not checked on the host
    (no synchronisation): an entry whose slot lies outside the cache, or whose leftpad lies
    outside [0, capacity], sees no keys (zeros, LSE -inf) and appends nothing; with repeated
    slots, which entry's new keys a slot keeps is unspecified, as in flash_attn.
    alibi_slopes as flash_attn_func's: float32 (nheads,) or (batch, nheads), entry b's slopes
    row b (with cache_batch_idx too, as in flash_attn), the distances counted within the keys
    the entry sees (from cache_leftpad on). FP8 caches raise TypeError: they run through
    forward_kvcache(), which takes their descales.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.flash_attn_with_kvcache needs PyTorch, which is not installed")
    return _ops.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                        cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                                        window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                                        return_softmax_lse)
