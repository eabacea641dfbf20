"""PyTorch integration: argument checks, the custom ops and their fake implementations."""

import functools
from typing import Optional, Tuple

import torch

from . import _C

_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=256)
def _parse(short_form: str) -> "_C.KernelConfig":
    return _C.KernelConfig.parse(short_form)


def _check(name: str, t, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got a tensor on {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (q's device), got {t.device}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}.dtype: expected torch.float16 or torch.bfloat16, got {t.dtype}")


def _check_no_grad(q, k, v, grad_enabled=None):
    # No backward pass yet: an output without a graph would silently lose the gradients.
    if torch.is_grad_enabled() if grad_enabled is None else grad_enabled:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.requires_grad:
                raise NotImplementedError(
                    f"{name}: expected a tensor that does not require grad (flash_attention_scratch "
                    "has no backward pass yet; call it under torch.no_grad() or pass detached "
                    "inputs), got one with requires_grad=True")


def _lse_like(q):
    # (batch, heads, seq_q) from q's (batch, seq_q, heads, d_head)
    return torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)


def _run(q, k, v, out, lse, softmax_scale, causal, config):
    cfg = None if config is None else _parse(config)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    if q.device.index == torch.cuda.current_device():
        _C.forward(q, k, v, out, softmax_scale, cfg, stream, causal, lse)
    else:  # the library launches on the current device
        with torch.cuda.device(q.device):
            _C.forward(q, k, v, out, softmax_scale, cfg, stream, causal, lse)


@torch.library.custom_op("flash_attention_scratch::forward", mutates_args=(), device_types="cuda")
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float],
                causal: bool, config: Optional[str]) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _run(q, k, v, out, None, softmax_scale, causal, config)
    return out


@_forward_op.register_fake
def _(q, k, v, softmax_scale, causal, config):
    return q.new_empty(q.shape)


@torch.library.custom_op("flash_attention_scratch::forward_lse", mutates_args=(), device_types="cuda")
def _forward_lse_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float],
                    causal: bool, config: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _lse_like(q)
    _run(q, k, v, out, lse, softmax_scale, causal, config)
    return out, lse


@_forward_lse_op.register_fake
def _(q, k, v, softmax_scale, causal, config):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("flash_attention_scratch::forward_out", mutates_args=("out", "lse"), device_types="cuda")
def _forward_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: Optional[torch.Tensor], softmax_scale: Optional[float], causal: bool,
                    config: Optional[str]) -> None:
    _run(q, k, v, out, lse, softmax_scale, causal, config)


@_forward_out_op.register_fake
def _(q, k, v, out, lse, softmax_scale, causal, config):
    return None


def _no_backward_setup(ctx, inputs, output):
    # Runs only when autograd records the op (grad mode on, an input requiring grad), and
    # itself under no_grad: grad mode is known to have been on.
    _check_no_grad(*inputs[:3], grad_enabled=True)


def _no_backward(ctx, *grads):
    raise NotImplementedError("flash_attention_scratch has no backward pass yet")


for _op in (_forward_op, _forward_lse_op):
    _op.register_autograd(_no_backward, setup_context=_no_backward_setup)


def forward(q, k, v, *, softmax_scale=None, causal=False, return_lse=False, config=None, out=None):
    _check("q", q)
    _check("k", k, q.device)
    _check("v", v, q.device)
    _check_no_grad(q, k, v)
    if out is not None:
        _check("out", out, q.device)
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    causal = bool(causal)
    if config is not None and not isinstance(config, str):
        if not isinstance(config, _C.KernelConfig):
            raise TypeError(f"config: expected a KernelConfig or its short form, got {type(config).__name__}")
        config = str(config)
    if torch.compiler.is_compiling():
        # Traced: the custom ops, whose fake implementations give torch.compile shapes.
        if out is None:
            if return_lse:
                return torch.ops.flash_attention_scratch.forward_lse(q, k, v, softmax_scale, causal, config)
            return torch.ops.flash_attention_scratch.forward(q, k, v, softmax_scale, causal, config)
        lse = _lse_like(q) if return_lse else None
        torch.ops.flash_attention_scratch.forward_out(q, k, v, out, lse, softmax_scale, causal, config)
        return (out, lse) if return_lse else out
    # Eager: the same work without the dispatcher's tens of microseconds per call.
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _lse_like(q) if return_lse else None
    _run(q, k, v, out, lse, softmax_scale, causal, config)
    return (out, lse) if return_lse else out
