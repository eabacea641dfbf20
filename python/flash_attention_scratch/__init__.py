"""FlashAttention forward kernels written from scratch in CUDA C++.

    import flash_attention_scratch as fas
    out = fas.forward(q, k, v)  # (batch, seq, heads, d_head) fp16/bf16 CUDA tensors

Tensors reach the C++ library through DLPack and the kernels run on PyTorch's current
CUDA stream. `forward` is also the custom op `torch.ops.flash_attention_scratch.forward`,
with a fake implementation, so torch.compile and CUDA-graph capture work.

PyTorch SDPA's layout is (batch, heads, seq, d_head): pass `q.transpose(1, 2)` (a view,
no copy). `causal=True` aligns the mask at the bottom right (flash_attn's convention),
which differs from SDPA's `is_causal` when seq_q != seq_k; `causal_alignment="top_left"`
gives SDPA's.

The attention variants of today's models take flash_attn's and FlashAttention-4's
arguments on every entry point: `window_size=(left, right)` (sliding window, -1
unbounded, aligned like causal), `softcap=` (Gemma-2's logit softcap, 0 off) and
`learnable_sink=` (gpt-oss's attention sinks, float32 (heads,)).

Forward only: inputs that require grad under grad mode raise NotImplementedError rather
than return an output that silently drops the gradient.
"""

from ._C import DType, Family, KernelConfig
from ._C import __version__
from ._C import configs as _configs
from ._C import device_count, reload_tuning_cache

__all__ = [
    "__version__",
    "forward",
    "forward_varlen",
    "forward_kvcache",
    "configs",
    "KernelConfig",
    "DType",
    "Family",
    "device_count",
    "reload_tuning_cache",
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
            config=None, out=None, window_size=(-1, -1), softcap=0.0, learnable_sink=None):
    """softmax(q·kᵀ·scale)·v for float16/bfloat16 CUDA tensors: q (batch, seq_q, heads,
    d_head), k and v (batch, seq_k, heads_kv, d_head) with heads a multiple of heads_kv
    (grouped-query attention); any lengths; d_head 64, 128 or 256.

    softmax_scale: default 1/sqrt(d_head). causal: query i sees keys j <= i + seq_k - seq_q
    (aligned at the bottom right, unlike SDPA's is_causal), or with
    causal_alignment="top_left" keys j <= i (SDPA's is_causal); a row that sees no key gets
    zeros. return_lse: also return the log-sum-exp, float32 (batch, heads, seq_q), natural
    log (-inf for rows that see no key). config: a KernelConfig or its short form to run
    that kernel instead of the automatic choice. out: a tensor to write the result into
    (returned); by default a new contiguous tensor. Any batch/seq/head strides work; the
    head dim must be contiguous.

    window_size=(left, right): a sliding window, query i sees keys j with d - left <= j <= d
    + right where d is i's diagonal position (i + seq_k - seq_q, or i with
    causal_alignment="top_left"); -1 leaves a side unbounded; with causal, right must be -1
    or 0. Blocks outside the window are skipped. softcap: scores become softcap *
    tanh(scores / softcap) before the softmax (0: off). learnable_sink: float32 (heads,)
    logits, one per query head, that join each row's softmax denominator with no value
    (the LSE includes them; a row that sees no key gets zeros and LSE = its sink).

    Raises ValueError for bad arguments, TypeError for unsupported dtypes,
    NotImplementedError for inputs that require grad under grad mode (no backward pass
    yet) and RuntimeError for CUDA failures (including no GPU), each with the library's
    message.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.forward needs PyTorch, which is not installed")
    return _ops.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, causal_alignment=causal_alignment,
                        return_lse=return_lse, config=config, out=out, window_size=window_size, softcap=softcap,
                        learnable_sink=learnable_sink)


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale=None,
                   causal=False, causal_alignment="bottom_right", seqused_k=None, block_table=None, num_splits=0,
                   return_lse=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None):
    """Attention over a batch of sequences of different lengths, packed along the token
    axis (flash_attn.flash_attn_varlen_func): q (total_q, heads, d_head), k and v
    (total_k, heads_kv, d_head), cu_seqlens_q / cu_seqlens_k int32 (batch + 1,) offsets
    starting at 0. With block_table (int32 (batch, max_pages)) k and v are the pages of a
    paged cache, (num_pages, page_size, heads_kv, d_head) with page_size a multiple of 16,
    and the key lengths come from seqused_k (int32 (batch,)) or cu_seqlens_k.

    causal aligns each sequence's queries with the end of its keys (bottom right), or with
    causal_alignment="top_left" with their start.
    max_seqlen_q must be at least every query length (it sizes the grid). num_splits: 0
    for the library's choice (long queries run on the sm90 kernels on Hopper, as forward()
    does, paged or not), n >= 1 for the serving kernel with n key ranges per sequence. return_lse: also the log-sum-exp,
    float32 (heads, total_q). Offsets and lengths are not read on the host (no
    synchronisation; CUDA graphs work): a sequence that reaches past its tensor is cut at
    the tensor's end, and a page id outside the cache reads as zeros. window_size, softcap
    and learnable_sink as in forward(), per sequence; a window or softcap runs on the sm90
    kernels (Hopper, num_splits 0) and raises ValueError elsewhere.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.forward_varlen needs PyTorch, which is not installed")
    return _ops.forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=softmax_scale, causal=causal, causal_alignment=causal_alignment,
                               seqused_k=seqused_k,
                               block_table=block_table, num_splits=num_splits, return_lse=return_lse,
                               window_size=window_size, softcap=softcap, learnable_sink=learnable_sink)


def forward_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                    softmax_scale=None, causal=False, causal_alignment="bottom_right", num_splits=0,
                    return_lse=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None):
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
    (batch, heads, seq_q). window_size, softcap and learnable_sink as in forward(); a
    window or softcap runs on the sm90 kernels (Hopper, num_splits 0, no key split) and
    raises ValueError elsewhere; sinks run on every path.
    """
    if _torch is None:
        raise RuntimeError("flash_attention_scratch.forward_kvcache needs PyTorch, which is not installed")
    return _ops.forward_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                block_table=block_table, softmax_scale=softmax_scale, causal=causal,
                                causal_alignment=causal_alignment, num_splits=num_splits,
                                return_lse=return_lse, window_size=window_size, softcap=softcap,
                                learnable_sink=learnable_sink)
