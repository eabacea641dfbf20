"""FlashAttention forward kernels written from scratch in CUDA C++.

    import flash_attention
    out = flash_attention.forward(q, k, v)  # (batch, seq, heads, d_head) fp16/bf16 CUDA tensors

Tensors reach the C++ library through DLPack and the kernels run on PyTorch's current
CUDA stream. `forward` is also the custom op `torch.ops.flash_attention.forward`, with a
fake implementation, so torch.compile and CUDA-graph capture work.
"""

from ._C import DType, Family, KernelConfig
from ._C import configs as _configs
from ._C import device_count, reload_tuning_cache

__all__ = [
    "forward",
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


try:
    import torch as _torch
except ImportError:  # the package works without PyTorch; forward() needs it
    _torch = None

if _torch is not None:
    from . import _ops  # registers torch.ops.flash_attention.*


def forward(q, k, v, *, softmax_scale=None, causal=False, return_lse=False, config=None, out=None):
    """softmax(q·kᵀ·scale)·v for float16/bfloat16 CUDA tensors: q (batch, seq_q, heads,
    d_head), k and v (batch, seq_k, heads_kv, d_head) with heads a multiple of heads_kv
    (grouped-query attention); any lengths; d_head 64, 128 or 256.

    softmax_scale: default 1/sqrt(d_head). causal: query i sees keys j <= i + seq_k - seq_q
    (aligned at the bottom right); a row that sees no key gets zeros. return_lse: also
    return the log-sum-exp, float32 (batch, heads, seq_q), natural log (-inf for rows that
    see no key). config: a KernelConfig or its short form to run that kernel instead of
    the automatic choice. out: a tensor to write the result into (returned); by default a
    new contiguous tensor. Any batch/seq/head strides work; the head dim must be contiguous.

    Raises ValueError for bad arguments, TypeError for unsupported dtypes and
    RuntimeError for CUDA failures (including no GPU), each with the library's message.
    """
    if _torch is None:
        raise RuntimeError("flash_attention.forward needs PyTorch, which is not installed")
    return _ops.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=return_lse,
                        config=config, out=out)
