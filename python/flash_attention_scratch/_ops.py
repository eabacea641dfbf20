"""PyTorch integration: argument checks, the custom ops and their fake implementations."""

import atexit
import contextlib
import functools
import numbers
import operator
import re
from typing import Optional, Tuple

import torch

from . import _C

_DTYPES = (torch.float16, torch.bfloat16)
# FP8 (e4m3) inputs, which forward() takes with their descales (_forward_fp8); None on a PyTorch
# without the dtype.
_FP8 = getattr(torch, "float8_e4m3fn", None)


try:  # The getter Inductor's generated code calls: the stream's address, no Stream object.
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # a PyTorch without it: the public route
    _raw_stream = None


def _current_stream(device) -> int:
    """The address of `device`'s current CUDA stream, where the library launches. Building a
    torch.cuda.Stream for it (torch.cuda.current_stream()) cost 3-6 µs a call on the H200's
    hosts, the largest single cost of the eager wrapper; the raw getter 0.2 µs (H200,
    2026-11-28, docs/PERF.md)."""
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


@functools.lru_cache(maxsize=256)
def _parse(short_form: str) -> "_C.KernelConfig":
    return _C.KernelConfig.parse(short_form)


# The cache's configs released at exit, before the extension's teardown: held past it, nanobind
# reports them as leaked instances on stderr (every run that passed config=).
atexit.register(_parse.cache_clear)


def _check(name: str, t, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got a tensor on {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (q's device), got {t.device}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}.dtype: expected torch.float16 or torch.bfloat16, got {t.dtype}")


def _requiring_grad(q, k, v, sinks=None, grad_enabled=None, names=("q", "k", "v"), more=()):
    """The name of the first input that requires grad under grad mode (autograd would record
    the call), or None: then the call takes the eager path with no graph. names: q's, k's and
    v's as the caller calls them; more: further (name, tensor or None) pairs."""
    if torch.is_grad_enabled() if grad_enabled is None else grad_enabled:
        for name, t in (*zip(names, (q, k, v)), ("learnable_sink", sinks), *more):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return name
    return None


def _check_dims(name, t):
    """A (batch, seq, heads, d_head) tensor, before its heads are read (the library's own check
    comes later, at the launch)."""
    if t.dim() != 4:
        raise ValueError(f"{name}: expected 4 dimensions (batch, seq, heads, d_head), got {t.dim()}")


def _check_no_grad(q, k, v, grad_enabled=None, sinks=None, entry="forward_varlen", names=("q", "k", "v"),
                   more=()):
    # Entry points without a backward pass: an output without a graph would silently lose
    # the gradients.
    name = _requiring_grad(q, k, v, sinks, grad_enabled, names, more)
    if name is not None:
        raise NotImplementedError(
            f"{name}: expected a tensor that does not require grad ({entry} has no backward pass; "
            "forward(), flash_attn_func() and forward_varlen() without pages have one; call it under "
            "torch.no_grad() or pass detached inputs), got one with requires_grad=True")


def _window(window_size):
    """flash_attn's window_size = (left, right), -1 meaning unbounded on that side. Each side is
    anything integer-like, as flash_attn takes it: an int, a NumPy integer, or a one-element
    integer tensor (flash_attn's own tests pass torch.randint(0, seqlen, (2,)))."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected a (left, right) pair of ints, got {window_size!r}") from None
    sides = []
    for name, side in enumerate((left, right)):  # window_size[0], [1], as the library's errors say
        is_bool = isinstance(side, bool) or (isinstance(side, torch.Tensor) and side.dtype == torch.bool)
        try:
            sides.append(None if is_bool else operator.index(side))
        except TypeError:
            sides.append(None)
        if sides[-1] is None:
            raise TypeError(f"window_size[{name}]: expected an int (-1: unbounded), got {_described(side)}")
    return sides[0], sides[1]


def _described(value):
    """A value's type for an error message, with a tensor's dtype and shape."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _check_sinks(learnable_sink, q, heads):
    """learnable_sink: None, or a contiguous (heads,) float32 tensor on q's device."""
    if learnable_sink is None:
        return
    t = learnable_sink
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"learnable_sink: expected a torch.Tensor of float32, got {type(t).__name__}")
    if t.device != q.device:
        raise ValueError(f"learnable_sink: expected a tensor on {q.device} (q's device), got {t.device}")
    if t.dtype != torch.float32:
        raise TypeError(f"learnable_sink.dtype: expected torch.float32, got {t.dtype}")
    if tuple(t.shape) != (heads,):
        raise ValueError(f"learnable_sink.shape: expected ({heads},) (one per query head), got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"learnable_sink: expected a contiguous tensor, got strides {t.stride()}")


def _sinks(learnable_sink, q, heads):
    """The address of checked attention sinks (_check_sinks); 0 for None. Not for fake
    tensors (torch.compile's tracing): those have no address."""
    _check_sinks(learnable_sink, q, heads)
    return 0 if learnable_sink is None else learnable_sink.data_ptr()


def _check_alibi(alibi_slopes, q, batch=None):
    """alibi_slopes: None, or float32 slopes on q's device, one per query head (q's heads on axis
    -2 whatever q's rank): (heads,) for the whole batch or (batch, heads), flash_attn's forms, batch
    q.shape[0] unless given (a varlen call's: its sequences). Returns them contiguous, as the
    kernels read them (None for None)."""
    if alibi_slopes is None:
        return None
    t = alibi_slopes
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"alibi_slopes: expected a torch.Tensor of float32, got {type(t).__name__}")
    if t.device != q.device:
        raise ValueError(f"alibi_slopes: expected a tensor on {q.device} (q's device), got {t.device}")
    if t.dtype != torch.float32:
        raise TypeError(f"alibi_slopes.dtype: expected torch.float32, got {t.dtype}")
    heads = q.shape[-2]
    batch = q.shape[0] if batch is None else batch
    if tuple(t.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes.shape: expected ({heads},) or ({batch}, {heads}) (one per query head, or "
                         f"per batch entry and query head), got {tuple(t.shape)}")
    return t.contiguous()


def _alibi(alibi_slopes):
    """The binding's ALiBi arguments for _check_alibi's result, which the caller holds through the
    launch: its address (0: none) and the distance between batch entries' slopes (0: (heads,)
    slopes, which the batch shares)."""
    if alibi_slopes is None:
        return dict(alibi_slopes=0, alibi_batch_stride=0)
    # Rows of contiguous (batch, heads) slopes lie `heads` apart; PyTorch calls a tensor with one
    # row contiguous whatever its row stride, and one row needs no stride.
    rows = alibi_slopes.dim() == 2 and alibi_slopes.shape[0] > 1
    return dict(alibi_slopes=alibi_slopes.data_ptr(), alibi_batch_stride=alibi_slopes.shape[1] if rows else 0)


def _variants(window_size, softcap, learnable_sink, alibi_slopes=None):
    """The ops' variant arguments: window_left, window_right, softcap, sinks, alibi_slopes."""
    left, right = _window(window_size)
    for name, side in enumerate((left, right)):
        if not -2**31 <= side < 2**31:  # the kernels' int (flash_attn's functions read larger sides as unbounded)
            raise ValueError(f"window_size[{name}]: expected -1 (unbounded) or a number of keys below 2^31, "
                             f"got {side}")
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):  # NumPy's floats too
        raise TypeError(f"softcap: expected a float (0: off), got {type(softcap).__name__}")
    return left, right, float(softcap), learnable_sink, alibi_slopes


def _out_like(q, v=None):
    # A contiguous tensor of q's shape (its last dimension v's), dtype and device, whatever q's
    # strides: empty_like takes them from q in one call, about 2 µs less than torch.empty's
    # separate arguments (H200, 2026-11-28, docs/PERF.md).
    if v is None or v.shape[-1] == q.shape[-1]:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    return q.new_empty(_out_shape(q, v))


def _out_shape(q, v):
    # The output's shape: q's, with V's head dim (DeepSeek's MLA: d_head 192, d_v 128).
    return (*q.shape[:-1], v.shape[-1])


def _lse_like(q):
    # (batch, heads, seq_q) from q's (batch, seq_q, heads, d_head)
    return torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)


def _variant_kwargs(q, window_left=-1, window_right=-1, softcap=0.0, sinks=None, alibi_slopes=None):
    # sinks: (heads_q,) float32, q's heads on axis -2 whatever q's rank; alibi_slopes: _check_alibi's result
    return dict(window_left=window_left, window_right=window_right, softcap=softcap,
                sinks=_sinks(sinks, q, q.shape[-2]), **_alibi(alibi_slopes))


def _run(q, k, v, out, lse, softmax_scale, causal, config, window_left=-1, window_right=-1, softcap=0.0,
         sinks=None, alibi_slopes=None):
    cfg = None if config is None else _parse(config)
    alibi_slopes = _check_alibi(alibi_slopes, q)  # contiguous, held through the launch
    var = _variant_kwargs(q, window_left, window_right, softcap, sinks, alibi_slopes)
    stream = _current_stream(q.device)
    if q.device.index == torch.cuda.current_device():
        _C.forward(q, k, v, out, softmax_scale, cfg, stream, causal, lse, **var)
    else:  # the library launches on the current device
        with torch.cuda.device(q.device):
            _C.forward(q, k, v, out, softmax_scale, cfg, stream, causal, lse, **var)


# deterministic (the forward ops autograd records): the backward's, recorded with the forward;
# the forward itself ignores it.
@torch.library.custom_op("flash_attention_scratch::forward", mutates_args=(), device_types="cuda")
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float],
                causal: int, config: Optional[str], window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                sinks: Optional[torch.Tensor] = None, alibi_slopes: Optional[torch.Tensor] = None,
                deterministic: bool = False) -> torch.Tensor:
    out = _out_like(q, v)
    _run(q, k, v, out, None, softmax_scale, causal, config, window_left, window_right, softcap, sinks, alibi_slopes)
    return out


@_forward_op.register_fake
def _(q, k, v, softmax_scale, causal, config, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
      alibi_slopes=None, deterministic=False):
    return q.new_empty(_out_shape(q, v))


@torch.library.custom_op("flash_attention_scratch::forward_lse", mutates_args=(), device_types="cuda")
def _forward_lse_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float],
                    causal: int, config: Optional[str], window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                    sinks: Optional[torch.Tensor] = None, alibi_slopes: Optional[torch.Tensor] = None,
                    deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    out = _out_like(q, v)
    lse = _lse_like(q)
    _run(q, k, v, out, lse, softmax_scale, causal, config, window_left, window_right, softcap, sinks, alibi_slopes)
    return out, lse


@_forward_lse_op.register_fake
def _(q, k, v, softmax_scale, causal, config, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
      alibi_slopes=None, deterministic=False):
    return q.new_empty(_out_shape(q, v)), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("flash_attention_scratch::forward_out", mutates_args=("out", "lse"), device_types="cuda")
def _forward_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: Optional[torch.Tensor], softmax_scale: Optional[float], causal: int,
                    config: Optional[str], window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                    sinks: Optional[torch.Tensor] = None, alibi_slopes: Optional[torch.Tensor] = None) -> None:
    _run(q, k, v, out, lse, softmax_scale, causal, config, window_left, window_right, softcap, sinks, alibi_slopes)


@_forward_out_op.register_fake
def _(q, k, v, out, lse, softmax_scale, causal, config, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
      alibi_slopes=None):
    return None


def _kernel_view(t):
    """`t` if the kernels can read it as it is (unit head-dim stride, 16-byte aligned rows),
    else a contiguous copy. The gradients autograd hands a backward can have any layout: the
    gradient of out.sum() is a broadcast view with stride 0 everywhere."""
    if (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(n <= 1 or s % 8 == 0 for n, s in zip(t.shape[:-1], t.stride()[:-1]))):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _run_backward(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, dlse, deterministic, sinks=None,
                  dsinks=None, softcap=0.0, window_left=-1, window_right=-1, alibi_slopes=None):
    dout, q, k, v, out = (_kernel_view(t) for t in (dout, q, k, v, out))
    lse = lse if lse.is_contiguous() else lse.contiguous()
    if dlse is not None and not dlse.is_contiguous():  # e.g. the gradient of lse.sum()
        dlse = dlse.contiguous()
    sinks_address = _sinks(sinks, q, q.shape[2])
    alibi_slopes = _check_alibi(alibi_slopes, q)  # contiguous, held through the launch
    stream = _current_stream(q.device)
    _on_device(q.device, lambda: _C.backward(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal,
                                             stream, dlse, deterministic=deterministic, sinks=sinks_address,
                                             d_sinks=0 if dsinks is None else dsinks.data_ptr(),
                                             softcap=softcap, window_left=window_left,
                                             window_right=window_right, **_alibi(alibi_slopes)))


@torch.library.custom_op("flash_attention_scratch::backward", mutates_args=(), device_types="cuda")
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, softmax_scale: Optional[float], causal: int,
                 dlse: Optional[torch.Tensor] = None, deterministic: bool = False,
                 sinks: Optional[torch.Tensor] = None, softcap: float = 0.0, window_left: int = -1,
                 window_right: int = -1, alibi_slopes: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (contiguous, shaped like q, k, v) and dsinks of the forward that produced
    out and its float32 (batch, heads, seq_q) log-sum-exp lse, given dout = dloss/dout and
    optionally dlse = dloss/dlse (None: zero). With grouped K/V heads, dk and dv are summed
    over the query heads that share a K/V head. sinks: the forward's learnable_sink, whose
    gradient dsinks is float32 (heads,) (empty without sinks); softcap, window_left,
    window_right and alibi_slopes: the forward's (0, -1, -1, None: none; the slopes get no
    gradient, as in flash_attn). The library's automatic choice of backward kernel;
    deterministic=True: one whose gradients are bitwise identical from run to run (dsinks
    always are)."""
    dq, dk, dv = _out_like(q), _out_like(k), _out_like(v)
    dsinks = torch.empty(0 if sinks is None else q.shape[2], dtype=torch.float32, device=q.device)
    _run_backward(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, dlse, deterministic, sinks,
                  None if sinks is None else dsinks, softcap, window_left, window_right, alibi_slopes)
    return dq, dk, dv, dsinks


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, dlse=None, deterministic=False, sinks=None, softcap=0.0,
      window_left=-1, window_right=-1, alibi_slopes=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((0 if sinks is None else q.shape[2],), dtype=torch.float32))


def _no_double_backward(ctx, *grads):
    raise NotImplementedError("flash_attention_scratch::backward is not differentiable (no double backward: "
                              "create_graph=True through attention is not supported)")


_backward_op.register_autograd(_no_double_backward)


# Autograd for the forward ops. forward() records forward_lse whenever an input requires
# grad: the backward pass recomputes P from Q, K and the forward's LSE, so the recorded op
# must produce it. (forward, without the LSE, is differentiable too for callers of the op
# itself: its backward first runs the forward again for the LSE.)

# The forward ops' window_left, window_right, softcap, sinks, alibi_slopes and deterministic.
_VARIANT_DEFAULTS = (-1, -1, 0.0, None, None, False)


def _forward_setup(ctx, inputs, output, saves_output):
    # Runs only when autograd records the op (grad mode on, an input requiring grad), after
    # the forward has run. (PyTorch fills in arguments left at their defaults, 2.4 and 2.15
    # alike; padded all the same, should a version hand them over without.)
    inputs = (*inputs, *_VARIANT_DEFAULTS[len(inputs) - 6:])
    (q, k, v, softmax_scale, causal, config, window_left, window_right, softcap, sinks, alibi_slopes,
     deterministic) = inputs
    ctx.softmax_scale, ctx.causal, ctx.config = softmax_scale, causal, config
    ctx.deterministic = deterministic
    ctx.softcap, ctx.window = softcap, (window_left, window_right)
    # A None gradient for an output that does not reach the loss (the LSE, usually) stays None
    # rather than a tensor of zeros: the backward then reads no dLSE.
    ctx.set_materialize_grads(False)
    saved = (q, k, v, *output) if saves_output else (q, k, v)
    ctx.save_for_backward(*saved, sinks, alibi_slopes)


_SINKS_ARGUMENT = 9  # the forward ops' sinks: after q, k, v, scale, causal, config and the window and softcap


def _incoming(dout, dlse, out):
    """The backward's dout: zeros where only the LSE reaches the loss; None where nothing does."""
    if dout is None and dlse is None:
        return None
    return torch.zeros_like(out) if dout is None else dout


def _gradients(ctx, q, k, v, sinks, alibi_slopes, out, lse, dout, dlse):
    # One per argument autograd saw: q, k, v, softmax_scale, causal, config and those of
    # window_left, window_right, softcap, sinks, alibi_slopes, deterministic that were passed
    # (the slopes get None, as in flash_attn).
    n_inputs = len(ctx.needs_input_grad)
    dout = _incoming(dout, dlse, out)
    if dout is None:
        return (None,) * n_inputs
    need = ctx.needs_input_grad
    # The main kernels need no sinks (the LSE includes them): pass them only for their gradient.
    train_sinks = sinks is not None and need[_SINKS_ARGUMENT]
    dq, dk, dv, dsinks = torch.ops.flash_attention_scratch.backward(dout, q, k, v, out, lse, ctx.softmax_scale,
                                                                    ctx.causal, dlse, ctx.deterministic,
                                                                    sinks if train_sinks else None, ctx.softcap,
                                                                    *ctx.window, alibi_slopes)
    grads = [dq if need[0] else None, dk if need[1] else None, dv if need[2] else None] + [None] * (n_inputs - 3)
    if train_sinks:
        grads[_SINKS_ARGUMENT] = dsinks
    return tuple(grads)


def _forward_lse_backward(ctx, dout, dlse):
    q, k, v, out, lse, sinks, alibi_slopes = ctx.saved_tensors
    return _gradients(ctx, q, k, v, sinks, alibi_slopes, out, lse, dout, dlse)


def _forward_backward(ctx, dout):
    q, k, v, sinks, alibi_slopes = ctx.saved_tensors
    if dout is None:
        return _gradients(ctx, q, k, v, sinks, alibi_slopes, None, None, None, None)
    # The op saved no LSE: run the same forward again for it (and its own output, so that
    # O and the LSE are one computation's).
    out, lse = torch.ops.flash_attention_scratch.forward_lse(q, k, v, ctx.softmax_scale, ctx.causal, ctx.config,
                                                             *ctx.window, ctx.softcap, sinks, alibi_slopes)
    return _gradients(ctx, q, k, v, sinks, alibi_slopes, out, lse, dout, None)


_forward_op.register_autograd(_forward_backward,
                              setup_context=lambda ctx, inputs, output: _forward_setup(ctx, inputs, output, False))
_forward_lse_op.register_autograd(_forward_lse_backward,
                                  setup_context=lambda ctx, inputs, output: _forward_setup(ctx, inputs, output, True))


# The ops take causal masking and the diagonal's alignment as one int: 0 none, 1 causal aligned at
# the bottom right, 2 at the top left, 3 none but the diagonal of a window or of ALiBi at the top
# left (a window or ALiBi without causal masking has a diagonal too).
_ALIGNMENTS = {"bottom_right": 1, "top_left": 2}


def _causal(causal, causal_alignment, window=(-1, -1), alibi_slopes=None):
    if causal_alignment not in _ALIGNMENTS:
        raise ValueError(f"causal_alignment: expected 'bottom_right' or 'top_left', got {causal_alignment!r}")
    if bool(causal):
        return _ALIGNMENTS[causal_alignment]
    diagonal = tuple(window) != (-1, -1) or alibi_slopes is not None
    return 3 if causal_alignment == "top_left" and diagonal else 0


def _masking(causal, causal_alignment, var, alibi_slopes):
    """The kernels' causal code and the variants (_variants) to run: a window of (-1, 0), which
    only states causal masking at its alignment, runs as causal without a window (the plain
    causal kernels: the split-KV decoding kernel, a backward pass, and every GPU family)."""
    if var[0] == -1 and var[1] == 0:
        return _causal(True, causal_alignment), (-1, -1) + tuple(var[2:])
    return _causal(causal, causal_alignment, var[:2], alibi_slopes), var


def _check_descales(q, k, descales):
    """FP8: q_descale, k_descale and v_descale, each a float32 (batch, heads_kv) tensor on q's device
    (flash_attn's layout), contiguous copies of them."""
    batch, heads_kv = q.shape[0], k.shape[2]
    checked = []
    for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
        if d is not None and (not isinstance(d, torch.Tensor) or d.dtype != torch.float32):  # of the wrong type
            raise TypeError(f"{name}: expected a torch.float32 tensor (batch, heads_kv) for torch.float8_e4m3fn "
                            f"inputs, got {_described(d)}")
        if d is None or d.device != q.device or tuple(d.shape) != (batch, heads_kv):
            raise ValueError(f"{name}: expected a torch.float32 tensor of shape (batch, heads_kv) = ({batch}, "
                             f"{heads_kv}) on {q.device} for torch.float8_e4m3fn inputs, got {_described(d)}"
                             + ("" if not isinstance(d, torch.Tensor) else f" on {d.device}"))
        checked.append(d.contiguous())
    return checked


def _run_fp8(q, k, v, out, lse, softmax_scale, causal, config, q_descale, k_descale, v_descale):
    cfg = None if config is None else _parse(str(config))
    stream = _current_stream(q.device)
    with torch.cuda.device(q.device):
        _C.forward(q, k, v, out, None if softmax_scale is None else float(softmax_scale), cfg, stream, causal, lse,
                   q_descale=q_descale.data_ptr(), k_descale=k_descale.data_ptr(), v_descale=v_descale.data_ptr())


def _fp8_out_like(q, v):
    return torch.empty(_out_shape(q, v), dtype=torch.bfloat16, device=q.device)


# FP8 under torch.compile (forward() runs eagerly without it): the output and the LSE, which
# the kernel writes at little cost; forward() drops what was not asked for.
@torch.library.custom_op("flash_attention_scratch::forward_fp8", mutates_args=(), device_types="cuda")
def _forward_fp8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor,
                    k_descale: torch.Tensor, v_descale: torch.Tensor, softmax_scale: Optional[float], causal: int,
                    config: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    out, lse = _fp8_out_like(q, v), _lse_like(q)
    _run_fp8(q, k, v, out, lse, softmax_scale, causal, config, q_descale, k_descale, v_descale)
    return out, lse


@_forward_fp8_op.register_fake
def _(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, config):
    return (q.new_empty(_out_shape(q, v), dtype=torch.bfloat16),
            q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))


def _forward_fp8(q, k, v, softmax_scale, causal, causal_alignment, return_lse, config, out, descales):
    """FP8 attention (torch.float8_e4m3fn q, k and v, bfloat16 output): the C++ forward() with the
    descales, eagerly, or traced as the custom op forward_fp8; no variants, no autograd (FP8 has no
    backward yet)."""
    for name, t in (("k", k), ("v", v)):
        _check_fp8(name, t, q.device)
    q_descale, k_descale, v_descale = _check_descales(q, k, descales)
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16):
        raise TypeError(f"out.dtype: expected torch.bfloat16 for torch.float8_e4m3fn inputs, got {_described(out)}")
    if out is not None and (tuple(out.shape) != _out_shape(q, v) or out.device != q.device):
        # the library's own check, before torch.compile's copy into out could broadcast or move it
        raise ValueError(f"out: expected shape {_out_shape(q, v)} on {q.device}, got {tuple(out.shape)} on "
                         f"{out.device}")
    causal = _causal(causal, causal_alignment)
    config = None if config is None else str(config)
    softmax_scale = None if softmax_scale is None else float(softmax_scale)
    if torch.compiler.is_compiling():
        result, lse = torch.ops.flash_attention_scratch.forward_fp8(q, k, v, q_descale, k_descale, v_descale,
                                                                    softmax_scale, causal, config)
        if out is not None:
            out.copy_(result)
            result = out
        return (result, lse) if return_lse else result
    if out is None:
        out = _fp8_out_like(q, v)
    lse = _lse_like(q) if return_lse else None
    _run_fp8(q, k, v, out, lse, softmax_scale, causal, config, q_descale, k_descale, v_descale)
    return (out, lse) if return_lse else out


def _check_fp8(name, t, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (q's device), got {t.device}")
    if t.dtype != _FP8:
        raise TypeError(f"{name}.dtype: expected torch.float8_e4m3fn (q's), got {t.dtype}")


def forward(q, k, v, *, softmax_scale=None, causal=False, causal_alignment="bottom_right", return_lse=False,
            config=None, out=None, window_size=(-1, -1), softcap=0.0, learnable_sink=None, alibi_slopes=None,
            deterministic=False, q_descale=None, k_descale=None, v_descale=None):
    descales = (q_descale, k_descale, v_descale)
    if _FP8 is not None and isinstance(q, torch.Tensor) and q.dtype == _FP8:
        if q.device.type != "cuda":
            raise ValueError(f"q: expected a CUDA tensor, got a tensor on {q.device}")
        window = _window(window_size)
        if (window not in ((-1, -1), (-1, 0)) or softcap != 0.0 or learnable_sink is not None
                or alibi_slopes is not None):
            raise ValueError("window_size, softcap, learnable_sink, alibi_slopes: expected none with "
                             "torch.float8_e4m3fn inputs (FP8 attention takes no variants yet)")
        causal = causal or window == (-1, 0)  # a window that only states causal masking, as for 16-bit inputs
        _check_no_grad(q, k, v, entry="FP8 attention")
        return _forward_fp8(q, k, v, softmax_scale, causal, causal_alignment, return_lse, config, out, descales)
    for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
        if d is not None:
            raise ValueError(f"{name}: expected None for inputs that are not torch.float8_e4m3fn (descales "
                             f"dequantise FP8 ones), got {_described(d)}")
    var = _variants(window_size, softcap, learnable_sink, alibi_slopes)
    _check("q", q)
    _check("k", k, q.device)
    _check("v", v, q.device)
    requiring = _requiring_grad(q, k, v, learnable_sink)
    _check_dims("q", q)
    if out is not None:
        _check("out", out, q.device)
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    causal, var = _masking(causal, causal_alignment, var, alibi_slopes)
    _check_sinks(learnable_sink, q, q.shape[2])  # its errors before any work
    _check_alibi(alibi_slopes, q)
    if config is not None and not isinstance(config, str):
        if not isinstance(config, _C.KernelConfig):
            raise TypeError(f"config: expected a KernelConfig or its short form, got {type(config).__name__}")
        config = str(config)
    if requiring is not None:
        # Training: the op autograd records (forward_lse, whose LSE the backward reads).
        if out is not None:
            raise RuntimeError(
                f"out: expected None when an input requires grad ({requiring} does): an out= tensor "
                "cannot carry an autograd graph (PyTorch's own out= functions refuse it too); drop "
                "out= to get gradients, or call under torch.no_grad()")
        result = torch.ops.flash_attention_scratch.forward_lse(q, k, v, softmax_scale, causal, config, *var,
                                                               bool(deterministic))
        return result if return_lse else result[0]
    if torch.compiler.is_compiling():
        # Traced: the custom ops, whose fake implementations give torch.compile shapes.
        if out is None:
            if return_lse:
                return torch.ops.flash_attention_scratch.forward_lse(q, k, v, softmax_scale, causal, config, *var)
            return torch.ops.flash_attention_scratch.forward(q, k, v, softmax_scale, causal, config, *var)
        lse = _lse_like(q) if return_lse else None
        torch.ops.flash_attention_scratch.forward_out(q, k, v, out, lse, softmax_scale, causal, config, *var)
        return (out, lse) if return_lse else out
    # Eager without autograd: the same work without the dispatcher's tens of microseconds
    # per call, and no LSE unless asked for.
    if out is None:
        out = _out_like(q, v)
    lse = _lse_like(q) if return_lse else None
    _run(q, k, v, out, lse, softmax_scale, causal, config, *var)
    return (out, lse) if return_lse else out


def _refuse_fp8(entry, q):
    """flash_attn's functions take no descales: FP8 inputs are refused by name before the
    library would ask for descales the caller cannot pass."""
    if _FP8 is not None and isinstance(q, torch.Tensor) and q.dtype == _FP8:
        raise TypeError(f"q.dtype: expected torch.float16 or torch.bfloat16 in {entry} (FP8 attention runs "
                        f"through forward() and forward_kvcache(), which take q_descale, k_descale and "
                        f"v_descale), got {q.dtype}")


def _head_dim_contiguous(*tensors):
    """flash_attn's maybe_contiguous: a tensor whose head dim is strided, copied (the kernels read
    rows of contiguous head dims); anything else as it is, for the library's checks."""
    return [t.contiguous() if isinstance(t, torch.Tensor) and t.dim() > 0 and t.stride(-1) != 1 else t
            for t in tensors]


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _check_flash_attn_extras(dropout_p)
    _refuse_fp8("flash_attn_func", q)
    q, k, v = _head_dim_contiguous(q, k, v)
    seq_k = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else None
    causal, window_size = _flash_attn_mask(window_size, causal, seq_k)
    result = forward(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=return_attn_probs,
                     window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic)
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result


def _unpack(name, t, layout, dim, parts):
    """flash_attn's packed inputs: `parts` tensors stacked along `dim` of `t` (qkv: 3, kv: 2),
    returned as views (the kernels read row-strided inputs; autograd sums the gradients of the
    views into the packed tensor)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(layout) or t.shape[dim] != parts:
        raise ValueError(f"{name}: expected shape ({', '.join(layout)}), got {tuple(t.shape)}")
    return t.unbind(dim)


_QKV = ("batch", "seqlen", "3", "nheads", "headdim")
_KV = ("batch", "seqlen_k", "2", "nheads_k", "headdim")
_VARLEN_QKV = ("total", "3", "nheads", "headdim")
_VARLEN_KV = ("total_k", "2", "nheads_k", "headdim")


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    q, k, v = _unpack("qkv", qkv, _QKV, 2, 3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    k, v = _unpack("kv", kv, _KV, 2, 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


# ---- Serving: packed variable-length batches and KV caches (flash_attn's varlen and
# with_kvcache functions, where their arguments overlap).

def _index(name, t, device, shape):
    """The address of an optional int32 index tensor of `shape` (None: any size there) on
    `device`; 0 for None. Rows must be contiguous; a 2-D table may have a row stride."""
    _check_index(name, t, device, shape)
    return 0 if t is None else t.data_ptr()


def _check_index(name, t, device, shape):
    """_index's checks without the address, which torch.compile cannot trace."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of int32, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (q's device), got {t.device}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name}.dtype: expected torch.int32, got {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name}.shape: expected {want}, got {tuple(t.shape)}")
    if t.stride(-1) != 1 or (t.dim() == 2 and t.shape[0] > 1 and t.stride(0) < t.shape[1]):
        raise ValueError(f"{name}: expected contiguous rows, got strides {t.stride()}")


def _varlen_lse_like(q):
    # (heads, total_q) from q's (total_q, heads, d_head), as flash_attn's varlen functions
    return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _on_device(device, fn):
    if device.index == torch.cuda.current_device():
        fn()
    else:  # the library launches on the current device
        with torch.cuda.device(device):
            fn()


def _table_args(block_table, device, batch):
    if block_table is None:
        return 0, 0, 0
    ptr = _index("block_table", block_table, device, (batch, None))
    return ptr, block_table.shape[1], block_table.stride(0)


def _run_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                max_seqlen_q, max_seqlen_k, softmax_scale, causal, num_splits, window_left=-1, window_right=-1,
                softcap=0.0, sinks=None, alibi_slopes=None, check_only=False):
    # check_only: the library's checks and route alone, no launch (what the call would raise).
    if q.dim() != 3:
        raise ValueError(f"q: expected 3 dimensions (total_q, heads, d_head), got {q.dim()}")
    cu_q = _index("cu_seqlens_q", cu_seqlens_q, q.device, (None,))
    batch = cu_seqlens_q.shape[0] - 1
    if batch < 1:
        raise ValueError(f"cu_seqlens_q.shape: expected (batch + 1,) with batch >= 1, got {tuple(cu_seqlens_q.shape)}")
    cu_k = _index("cu_seqlens_k", cu_seqlens_k, q.device, (batch + 1,))
    used = _index("seqused_k", seqused_k, q.device, (batch,))
    table, max_pages, table_stride = _table_args(block_table, q.device, batch)
    paged = block_table is not None
    kd, want = (4, "(num_pages, page_size, heads_kv, d_head)") if paged else (3, "(total_k, heads_kv, d_head)")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != kd:
            raise ValueError(f"{name}: expected {kd} dimensions {want}, got {t.dim()}")
    k4, v4 = (k, v) if paged else (k.unsqueeze(0), v.unsqueeze(0))
    alibi_slopes = _check_alibi(alibi_slopes, q, batch)  # contiguous, held through the launch
    var = _variant_kwargs(q, window_left, window_right, softcap, sinks, alibi_slopes)
    stream = _current_stream(q.device)
    _on_device(q.device, lambda: _C.forward_varlen(
        q.unsqueeze(0), k4, v4, out.unsqueeze(0), cu_q, cu_k, used, table, max_pages, table_stride,
        batch, int(max_seqlen_q), int(max_seqlen_k), softmax_scale, causal, lse, int(num_splits), stream,
        **var, check_only=check_only))


def _run_kvcache(q, k_cache, v_cache, out, lse, k, v, cache_seqlens, block_table, softmax_scale,
                 causal, num_splits, window_left=-1, window_right=-1, softcap=0.0, sinks=None, alibi_slopes=None,
                 q_descale=None, k_descale=None, v_descale=None):
    if q.dim() != 4:
        raise ValueError(f"q: expected 4 dimensions (batch, seq_q, heads, d_head), got {q.dim()}")
    batch = q.shape[0]
    seqlens = _index("cache_seqlens", cache_seqlens, q.device, (batch,))
    table, max_pages, table_stride = _table_args(block_table, q.device, batch)
    alibi_slopes = _check_alibi(alibi_slopes, q)  # contiguous, held through the launch
    var = _variant_kwargs(q, window_left, window_right, softcap, sinks, alibi_slopes)
    stream = _current_stream(q.device)
    fp8 = {} if q_descale is None else dict(q_descale=q_descale.data_ptr(), k_descale=k_descale.data_ptr(),
                                             v_descale=v_descale.data_ptr())
    _on_device(q.device, lambda: _C.forward_kvcache(
        q, k_cache, v_cache, out, seqlens, table, max_pages, table_stride, k, v, softmax_scale,
        causal, lse, int(num_splits), stream, **var, **fp8))


def _kvcache_out_like(q, v_cache):
    # FP8 caches' output is bfloat16.
    return _fp8_out_like(q, v_cache) if _FP8 is not None and q.dtype == _FP8 else _out_like(q, v_cache)


@torch.library.custom_op("flash_attention_scratch::forward_varlen", mutates_args=(), device_types="cuda")
def _varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: Optional[torch.Tensor], seqused_k: Optional[torch.Tensor],
               block_table: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: Optional[float], causal: int, num_splits: int, window_left: int = -1,
               window_right: int = -1, softcap: float = 0.0, sinks: Optional[torch.Tensor] = None,
               alibi_slopes: Optional[torch.Tensor] = None,
               deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    # deterministic: the backward's (autograd records it with the call).
    out = _out_like(q, v)
    lse = _varlen_lse_like(q)
    _run_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q,
                max_seqlen_k, softmax_scale, causal, num_splits, window_left, window_right, softcap, sinks,
                alibi_slopes)
    return out, lse


@_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k,
      softmax_scale, causal, num_splits, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
      alibi_slopes=None, deterministic=False):
    return q.new_empty(_out_shape(q, v)), _varlen_lse_like(q)


def _run_backward_varlen(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                         max_seqlen_k, softmax_scale, causal, dlse, deterministic, sinks, dsinks, softcap, window_left,
                         window_right, alibi_slopes):
    dout, q, k, v, out = (_kernel_view(t) for t in (dout, q, k, v, out))
    lse = lse if lse.is_contiguous() else lse.contiguous()
    if dlse is not None and not dlse.is_contiguous():
        dlse = dlse.contiguous()
    cu_q = _index("cu_seqlens_q", cu_seqlens_q, q.device, (None,))
    batch = cu_seqlens_q.shape[0] - 1
    cu_k = _index("cu_seqlens_k", cu_seqlens_k, q.device, (batch + 1,))
    used = _index("seqused_k", seqused_k, q.device, (batch,))
    sinks_address = _sinks(sinks, q, q.shape[1])
    alibi_slopes = _check_alibi(alibi_slopes, q, batch)  # contiguous, held through the launch
    stream = _current_stream(q.device)
    _on_device(q.device, lambda: _C.backward_varlen(
        dout.unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), out.unsqueeze(0), lse, dq.unsqueeze(0),
        dk.unsqueeze(0), dv.unsqueeze(0), cu_q, cu_k, used, batch, int(max_seqlen_q), int(max_seqlen_k),
        softmax_scale, causal, stream, dlse, deterministic=deterministic, sinks=sinks_address,
        d_sinks=0 if dsinks is None else dsinks.data_ptr(), softcap=softcap, window_left=window_left,
        window_right=window_right, **_alibi(alibi_slopes)))


@torch.library.custom_op("flash_attention_scratch::backward_varlen", mutates_args=(), device_types="cuda")
def _backward_varlen_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                        seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                        softmax_scale: Optional[float], causal: int, dlse: Optional[torch.Tensor] = None,
                        deterministic: bool = False, sinks: Optional[torch.Tensor] = None, softcap: float = 0.0,
                        window_left: int = -1, window_right: int = -1, alibi_slopes: Optional[torch.Tensor] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (contiguous, shaped like the packed q, k, v) and dsinks of forward_varlen's
    call that produced out and its float32 (heads, total_q) LSE; the rest as backward's. Rows
    no sequence uses get zeros."""
    dq, dk, dv = _out_like(q), _out_like(k), _out_like(v)
    dsinks = torch.empty(0 if sinks is None else q.shape[1], dtype=torch.float32, device=q.device)
    _run_backward_varlen(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                         max_seqlen_k, softmax_scale, causal, dlse, deterministic, sinks,
                         None if sinks is None else dsinks, softcap, window_left, window_right, alibi_slopes)
    return dq, dk, dv, dsinks


@_backward_varlen_op.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      causal, dlse=None, deterministic=False, sinks=None, softcap=0.0, window_left=-1, window_right=-1,
      alibi_slopes=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((0 if sinks is None else q.shape[1],), dtype=torch.float32))


_backward_varlen_op.register_autograd(_no_double_backward)

# forward_varlen's window_left, window_right, softcap, sinks, alibi_slopes and deterministic.
_VARLEN_VARIANT_DEFAULTS = (-1, -1, 0.0, None, None, False)
_VARLEN_SINKS_ARGUMENT = 15


def _varlen_setup(ctx, inputs, output):
    # Runs only when autograd records the op (grad mode on, an input requiring grad).
    inputs = (*inputs, *_VARLEN_VARIANT_DEFAULTS[len(inputs) - 12:])
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
     num_splits, window_left, window_right, softcap, sinks, alibi_slopes, deterministic) = inputs
    if block_table is not None:
        _check_no_grad(q, k, v, grad_enabled=True, sinks=sinks, entry="forward_varlen with a paged cache")
    ctx.scalars = (max_seqlen_q, max_seqlen_k, softmax_scale, causal)
    ctx.variants = (softcap, window_left, window_right)
    ctx.deterministic = deterministic
    ctx.has_sinks = sinks is not None
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, *output, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, alibi_slopes)


def _varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, alibi_slopes = ctx.saved_tensors
    n_inputs = len(ctx.needs_input_grad)
    dout = _incoming(dout, dlse, out)
    if dout is None:
        return (None,) * n_inputs
    need = ctx.needs_input_grad
    train_sinks = ctx.has_sinks and need[_VARLEN_SINKS_ARGUMENT]
    softcap, window_left, window_right = ctx.variants
    dq, dk, dv, dsinks = torch.ops.flash_attention_scratch.backward_varlen(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, *ctx.scalars, dlse, ctx.deterministic,
        sinks if train_sinks else None, softcap, window_left, window_right, alibi_slopes)
    # None for the rest, the slopes among them (as in flash_attn).
    grads = [dq if need[0] else None, dk if need[1] else None, dv if need[2] else None] + [None] * (n_inputs - 3)
    if train_sinks:
        grads[_VARLEN_SINKS_ARGUMENT] = dsinks
    return tuple(grads)


# The caches are written when k and v are given (KV append); declared mutated either way.
@torch.library.custom_op("flash_attention_scratch::forward_kvcache", mutates_args=("k_cache", "v_cache"),
                         device_types="cuda")
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                v: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor],
                block_table: Optional[torch.Tensor], softmax_scale: Optional[float], causal: int,
                num_splits: int, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                sinks: Optional[torch.Tensor] = None, alibi_slopes: Optional[torch.Tensor] = None,
                q_descale: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
                v_descale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    out = _kvcache_out_like(q, v_cache)
    lse = _lse_like(q)
    _run_kvcache(q, k_cache, v_cache, out, lse, k, v, cache_seqlens, block_table, softmax_scale,
                 causal, num_splits, window_left, window_right, softcap, sinks, alibi_slopes,
                 q_descale, k_descale, v_descale)
    return out, lse


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, num_splits, window_left=-1,
      window_right=-1, softcap=0.0, sinks=None, alibi_slopes=None, q_descale=None, k_descale=None, v_descale=None):
    out_dtype = torch.bfloat16 if _FP8 is not None and q.dtype == _FP8 else q.dtype
    return (q.new_empty(_out_shape(q, v_cache), dtype=out_dtype),
            q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))


# (An op that mutates its inputs takes no autograd formula: forward_kvcache refuses inputs
# that require grad before it reaches the op.)
_varlen_op.register_autograd(_varlen_backward, setup_context=_varlen_setup)


def _scale_and_splits(softmax_scale, num_splits):
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits: expected an int, got {type(num_splits).__name__}")
    return softmax_scale, num_splits


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale=None,
                   causal=False, causal_alignment="bottom_right", seqused_k=None, block_table=None, num_splits=0,
                   return_lse=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None, alibi_slopes=None,
                   deterministic=False):
    var = _variants(window_size, softcap, learnable_sink, alibi_slopes)
    _check("q", q)
    _check("k", k, q.device)
    _check("v", v, q.device)
    if block_table is not None:  # a paged cache is inference's: it has no backward
        _check_no_grad(q, k, v, sinks=learnable_sink, entry="forward_varlen with a paged cache")
    requiring = _requiring_grad(q, k, v, learnable_sink)
    softmax_scale, num_splits = _scale_and_splits(softmax_scale, num_splits)
    _check_sinks(learnable_sink, q, q.shape[-2])  # its errors before any work
    if isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dim() == 1:  # else _run_varlen names cu_seqlens_q
        _check_alibi(alibi_slopes, q, cu_seqlens_q.shape[0] - 1)  # the batch entries are the sequences
    causal, var = _masking(causal, causal_alignment, var, alibi_slopes)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, int(max_seqlen_q), int(max_seqlen_k),
            softmax_scale, causal, num_splits, *var)
    if requiring is not None:
        # Training: the op autograd records (its LSE is what the backward reads).
        out, lse = torch.ops.flash_attention_scratch.forward_varlen(*args, bool(deterministic))
    elif torch.compiler.is_compiling():
        out, lse = torch.ops.flash_attention_scratch.forward_varlen(*args)
    else:
        out = _out_like(q, v)
        lse = _varlen_lse_like(q) if return_lse else None
        _run_varlen(q, k, v, out, lse, *args[3:])
    return (out, lse) if return_lse else out


def _flash_attn_mask(window_size, causal, seq_k):
    """flash_attn's reading of causal and a window, as (causal, (left, right)): a negative side or
    one of at least seq_k keys is unbounded, causal sets the right side to 0, and (-1, 0) is
    causal masking (ours then runs the plain causal kernels, whose backward exists)."""
    left, right = (-1 if side < 0 or (seq_k is not None and side >= seq_k) else side
                   for side in _window(window_size))
    if causal:
        right = 0
    if left < 0 and right == 0:
        return True, (-1, -1)
    return causal, (left, right)


def _check_flash_attn_extras(dropout_p):
    if dropout_p:
        raise NotImplementedError(
            f"dropout_p: expected 0.0 (flash_attention_scratch has no attention dropout yet), got {dropout_p!r}")


class _PagedWithoutBackward(torch.autograd.Function):
    """flash_attn_varlen_func over a paged cache with inputs that require grad: flash_attn runs such
    a forward (its tests do, and take no gradient). There is no backward pass for pages, so the
    output's grad_fn raises rather than leave the inputs without gradients."""

    @staticmethod
    def forward(ctx, q, k, v, run):
        return run()

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("flash_attn_varlen_func with block_table has no backward pass (a paged cache is "
                                  "inference's); run it under torch.no_grad() or pass detached inputs")


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    _check_flash_attn_extras(dropout_p)
    q, k, v = _head_dim_contiguous(q, k, v)
    if block_table is not None and _requiring_grad(q, k, v) is not None:
        def run():
            return flash_attn_varlen_func(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k,
                                          max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                          softcap, alibi_slopes, deterministic, True, block_table)[:2]
        out, lse = _PagedWithoutBackward.apply(q, k, v, run)
        return (out, lse, None) if return_attn_probs else out
    causal, window_size = _flash_attn_mask(window_size, causal, int(max_seqlen_k))
    # flash_attn takes any upper bound of the query lengths; forward_varlen one of at most the
    # packed rows, which bound every length too.
    if isinstance(q, torch.Tensor) and q.dim() == 3:
        max_seqlen_q = min(max_seqlen_q, q.shape[0])
    result = forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            softmax_scale=softmax_scale, causal=causal, block_table=block_table,
                            return_lse=return_attn_probs, window_size=window_size, softcap=softcap,
                            alibi_slopes=alibi_slopes, deterministic=deterministic)
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    q, k, v = _unpack("qkv", qkv, _VARLEN_QKV, 1, 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    k, v = _unpack("kv", kv, _VARLEN_KV, 1, 2)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def _lengths(cache_seqlens, q):
    """cache_seqlens as the kernels read it: an int becomes a (batch,) int32 tensor on q's
    device; anything else is returned as it is (the caller checks it)."""
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    return cache_seqlens


def forward_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                    softmax_scale=None, causal=False, causal_alignment="bottom_right", num_splits=0,
                    return_lse=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None, alibi_slopes=None,
                    q_descale=None, k_descale=None, v_descale=None):
    descales = (q_descale, k_descale, v_descale)
    fp8 = _FP8 is not None and isinstance(q, torch.Tensor) and q.dtype == _FP8
    var = _variants(window_size, softcap, learnable_sink, alibi_slopes)
    if fp8:
        if q.device.type != "cuda":
            raise ValueError(f"q: expected a CUDA tensor, got a tensor on {q.device}")
        if (var[:2] not in ((-1, -1), (-1, 0)) or var[2] != 0.0 or learnable_sink is not None
                or alibi_slopes is not None):  # (-1, 0): causal (_masking)
            raise ValueError("window_size, softcap, learnable_sink, alibi_slopes: expected none with "
                             "torch.float8_e4m3fn inputs (FP8 attention takes no variants yet)")
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
            if t is not None or name.endswith("cache"):
                _check_fp8(name, t, q.device)
        descales = _check_descales(q, k_cache, descales)
    else:
        for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
            if d is not None:
                raise ValueError(f"{name}: expected None for inputs that are not torch.float8_e4m3fn (descales "
                                 f"dequantise FP8 ones), got {_described(d)}")
        descales = ()
        _check("q", q)
        _check("k_cache", k_cache, q.device)
        _check("v_cache", v_cache, q.device)
        for name, t in (("k", k), ("v", v)):
            if t is not None:
                _check(name, t, q.device)
    _check_no_grad(q, k_cache, v_cache, sinks=learnable_sink, entry="forward_kvcache",
                   names=("q", "k_cache", "v_cache"), more=(("k", k), ("v", v)))
    _check_dims("q", q)
    softmax_scale, num_splits = _scale_and_splits(softmax_scale, num_splits)
    _check_sinks(learnable_sink, q, q.shape[2])  # its errors before any work
    _check_alibi(alibi_slopes, q)
    cache_seqlens = _lengths(cache_seqlens, q)
    causal, var = _masking(causal, causal_alignment, var, alibi_slopes)
    args = (q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, num_splits, *var,
            *descales)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flash_attention_scratch.forward_kvcache(*args)
    else:
        out = _kvcache_out_like(q, v_cache)
        lse = _lse_like(q) if return_lse else None
        _run_kvcache(q, k_cache, v_cache, out, lse, *args[3:])
    return (out, lse) if return_lse else out


def _packed_rows(name, cache, rows):
    """A (slots, capacity, heads_kv, d_head) cache as one packed (total, heads_kv, d_head) tensor
    of the same memory, slot s's row r at packed row s * rows + r."""
    slots, capacity = cache.shape[:2]
    if cache.stride(1) <= 0 or (slots > 1 and cache.stride(0) != rows * cache.stride(1)):
        raise ValueError(f"{name}.stride(): expected slots a whole number of rows apart, the same for k_cache and "
                         f"v_cache (with cache_batch_idx or cache_leftpad the caches are read as one packed "
                         f"tensor), got {cache.stride()}")
    return cache.as_strided(((slots - 1) * rows + capacity, *cache.shape[2:]), cache.stride()[1:])


def _append_to_slots(k_cache, v_cache, k, v, slot, lengths):
    """k and v (batch, new, heads_kv, d_head) written into cache slot slot[b] from row lengths[b]
    on, as flash_attn_with_kvcache appends, with one index_put_ a cache and no host
    synchronisation. Keys past a slot's capacity, or of an entry whose slot is outside the cache,
    are dropped: their writes repeat the first kept write (its place and value), or with none
    kept rewrite one row with its own value, so that every write to a row carries one value."""
    batch, new = k.shape[:2]
    slots, capacity = k_cache.shape[:2]
    slot = slot.long()[:, None].expand(batch, new)
    row = lengths.long()[:, None] + torch.arange(new, device=k.device)
    kept = (slot >= 0) & (slot < slots) & (row >= 0) & (row < capacity)
    # A one-element index tensor, never a 0-d one: PyTorch reads a 0-d index back to the host
    # (a synchronisation, which a CUDA graph's capture and torch.compile refuse).
    first = kept.flatten().to(torch.int32).argmax().view(1)

    def at_first(t):
        return t.flatten(0, 1).index_select(0, first)

    slot = torch.where(kept, slot, at_first(slot)).clamp(0, slots - 1)
    row = torch.where(kept, row, at_first(row)).clamp(0, capacity - 1)
    first_kept = at_first(kept)
    for cache, x in ((k_cache, k), (v_cache, v)):
        repeat = torch.where(first_kept[:, None, None], at_first(x), cache[at_first(slot), at_first(row)])
        cache.index_put_((slot, row), torch.where(kept[..., None, None], x, repeat))


@contextlib.contextmanager
def _named_as_caches():
    """Cache slots run forward_varlen over the caches' rows, which its errors call k and v: they
    name the caller's k_cache and v_cache instead (the same head-dim axis, shape[3])."""
    try:
        yield
    except (TypeError, ValueError) as e:
        renamed = re.sub(r"(?<![\w.])([kv])(?=\.(?:shape|stride|dtype|device)\b)", r"\1_cache", str(e))
        if renamed == str(e):
            raise
        raise type(e)(renamed) from e


def _kvcache_slots(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, num_splits, return_lse):
    """flash_attn_with_kvcache with cache_batch_idx or cache_leftpad: entry b reads (and with k
    and v appends to) cache slot cache_batch_idx[b] (b without), keys cache_leftpad[b] (0 without)
    up to cache_seqlens[b] plus the new keys, causal alignment and ALiBi's diagonal at their end.
    The caches are read as one packed tensor of rows and the call is forward_varlen over it:
    sequence b starts at row slot * rows + leftpad and uses cache_seqlens + new - leftpad keys,
    offsets and lengths made on the device; (batch, heads) ALiBi slopes stay indexed by entry, as
    in flash_attn (sequence b is entry b). An entry whose slot is outside the cache, or whose
    leftpad is outside [0, capacity], sees no keys (zeros, LSE -inf) and appends nothing: the
    host cannot check device values without a synchronisation."""
    _check("q", q)
    _check("k_cache", k_cache, q.device)
    _check("v_cache", v_cache, q.device)
    _check_no_grad(q, k_cache, v_cache, entry="flash_attn_with_kvcache", names=("q", "k_cache", "v_cache"),
                   more=(("k", k), ("v", v)))
    if q.dim() != 4 or k_cache.dim() != 4:
        raise ValueError(f"q, k_cache: expected 4 dimensions (batch, seq, heads, d_head) with cache_batch_idx or "
                         f"cache_leftpad, got {q.dim()} and {k_cache.dim()}")
    _check_alibi(alibi_slopes, q)  # its errors before the append
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype: expected q's {q.dtype}, got {t.dtype}")
    if v_cache.dim() != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache: expected k_cache's (slots, capacity, heads_kv) {tuple(k_cache.shape[:3])}, "
                         f"got {tuple(v_cache.shape)}")
    batch, seq_q, heads, d_head = q.shape
    slots, capacity = k_cache.shape[:2]
    rows = k_cache.stride(0) // k_cache.stride(1) if slots > 1 and k_cache.stride(1) > 0 else capacity
    k_rows, v_rows = _packed_rows("k_cache", k_cache, rows), _packed_rows("v_cache", v_cache, rows)
    if (slots - 1) * rows + capacity > 2**31 - 1:
        raise ValueError(f"k_cache.shape: expected fewer than 2^31 rows in all, got {slots} slots of {rows}")
    new = 0
    if (k is None) != (v is None):
        raise ValueError("k, v: expected both new keys and values, or neither, got one")
    if k is not None:
        for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
            _check(name, t, q.device)
            new_rows = k.shape[1] if k.dim() == 4 else "new"  # k checked first
            if t.dtype != cache.dtype:
                raise TypeError(f"{name}.dtype: expected the cache's {cache.dtype}, got {t.dtype}")
            if t.dim() != 4 or t.shape[0] != batch or t.shape[1] != k.shape[1] or t.shape[2:] != cache.shape[2:]:
                raise ValueError(f"{name}: expected ({batch}, {new_rows}, {cache.shape[2]}, {cache.shape[3]}) "
                                 f"{cache.dtype}, got {tuple(t.shape)} {t.dtype}")
        new = k.shape[1]
    lengths = _lengths(cache_seqlens, q)
    if lengths is None:
        if k is not None:  # as forward_kvcache: where the new keys go
            raise ValueError("cache_seqlens: expected an int32 tensor of batch lengths (needed with k and v, "
                             "where the new keys go), got None")
        lengths = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    _check_index("cache_seqlens", lengths, q.device, (batch,))
    _check_index("cache_batch_idx", cache_batch_idx, q.device, (batch,))
    _check_index("cache_leftpad", cache_leftpad, q.device, (batch,))
    slot = cache_batch_idx if cache_batch_idx is not None else torch.arange(batch, dtype=torch.int32,
                                                                             device=q.device)
    pad = cache_leftpad.long() if cache_leftpad is not None else torch.zeros(batch, dtype=torch.long,
                                                                              device=q.device)
    end = (lengths.long() + new).clamp(0, capacity)
    sees = (slot >= 0) & (slot < slots) & (pad >= 0) & (pad <= capacity)
    start = torch.where(sees, slot.long() * rows + pad, k_rows.shape[0])
    used = torch.where(sees, end - pad, 0).clamp(min=0).to(torch.int32)
    cu_k = torch.cat((start, start.new_zeros(1))).to(torch.int32)
    cu_q = torch.arange(0, (batch + 1) * seq_q, seq_q, dtype=torch.int32, device=q.device)
    q_rows = q.reshape(batch * seq_q, heads, d_head)
    var = _variants(window_size, softcap, None, alibi_slopes)
    scale, splits = _scale_and_splits(softmax_scale, num_splits)
    args = (cu_q, cu_k, used, None, seq_q, capacity, scale, _causal(causal, "bottom_right", var[:2], alibi_slopes),
            splits, *var)
    with _named_as_caches():
        if k is not None:
            # A call the library refuses (V's head dim, the route) leaves the caches as they were;
            # under torch.compile, which cannot trace that check, forward_varlen's op refuses it
            # after the append.
            if not torch.compiler.is_compiling():
                _run_varlen(q_rows, k_rows, v_rows, _out_like(q_rows, v_rows), None, *args, check_only=True)
            if k.shape[1] > 0:  # (no new keys: nothing to append)
                _append_to_slots(k_cache, v_cache, k, v, slot, lengths)
        out, lse = forward_varlen(q_rows, k_rows, v_rows, cu_q, cu_k, seq_q, capacity,
                                  softmax_scale=softmax_scale, causal=causal, seqused_k=used,
                                  num_splits=num_splits, return_lse=True, window_size=window_size,
                                  softcap=softcap, alibi_slopes=alibi_slopes)
    out = out.view(batch, seq_q, heads, v_cache.shape[3])
    return (out, lse.view(heads, batch, seq_q).permute(1, 0, 2).contiguous()) if return_lse else out


def _rotated(x, cos, sin, positions, interleaved):
    """flash_attn's rotary embedding of x (batch, seq, heads, d_head) at positions (batch, seq):
    its first 2 * cos.shape[1] columns turned by the tables' rows at those positions, column
    pairs (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2) (GPT-NeoX's), in fp32 and
    rounded to x's dtype as flash_attn's kernel computes them; the other columns as they are.
    Positions past the tables read their last row: only rows past the cache's capacity have
    them, and KV append drops those (no host synchronisation checks device lengths)."""
    half = cos.shape[1]
    rows = positions.clamp(0, cos.shape[0] - 1).reshape(-1)
    c = cos.index_select(0, rows).view(*positions.shape, 1, half).float()
    s = sin.index_select(0, rows).view(*positions.shape, 1, half).float()
    r = x[..., :2 * half].float()
    if interleaved:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        r = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = r[..., :half], r[..., half:]
        r = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((r.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _rotary_inputs(q, k, rotary_cos, rotary_sin, cache_seqlens, interleaved, per_token_q, capacity):
    """q and k rotated as flash_attn_with_kvcache rotates them: the new keys at positions
    cache_seqlens, cache_seqlens + 1, ...; the queries there too when causal or windowed
    (per_token_q), else every query at cache_seqlens. Every check before any work."""
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor with the other rotary table, got {type(t).__name__}")
    if not isinstance(k, torch.Tensor):
        raise ValueError("k: expected new keys with rotary_cos and rotary_sin (flash_attn rotates the keys it "
                         "appends), got None")
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or k.dim() != 4:
        raise ValueError("q, k: expected (batch, seq, heads, d_head) tensors with rotary_cos and rotary_sin")
    d_head = q.shape[3]
    if rotary_sin.shape != rotary_cos.shape:
        raise ValueError(f"rotary_sin.shape: expected rotary_cos's {tuple(rotary_cos.shape)}, "
                         f"got {tuple(rotary_sin.shape)}")
    if rotary_cos.dim() != 2 or 2 * rotary_cos.shape[1] > d_head or (2 * rotary_cos.shape[1]) % 16 != 0:
        raise ValueError(f"rotary_cos.shape: expected (seqlen_ro, rotary_dim / 2) with rotary_dim a multiple of 16 "
                         f"of at most d_head {d_head}, got {tuple(rotary_cos.shape)}")
    if capacity is not None and rotary_cos.shape[0] < capacity:
        raise ValueError(f"rotary_cos.shape[0]: expected at least the cache's capacity of {capacity} positions, "
                         f"got {rotary_cos.shape[0]}")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype: expected q's {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected a tensor on q's device {q.device}, got {t.device}")
    batch = q.shape[0]
    lengths = _lengths(cache_seqlens, q)
    if not (isinstance(lengths, torch.Tensor) and lengths.shape == (batch,) and lengths.dtype == torch.int32
            and lengths.device == q.device):
        got = (f"{cache_seqlens.dtype} of shape {tuple(cache_seqlens.shape)} on {cache_seqlens.device}"
               if isinstance(cache_seqlens, torch.Tensor) else type(cache_seqlens).__name__)
        raise ValueError(f"cache_seqlens: expected the caches' lengths with rotary_cos and rotary_sin, an int or a "
                         f"({batch},) int32 tensor on q's device, got {got}")
    base = lengths.long()[:, None]
    k_positions = base + torch.arange(k.shape[1], device=q.device)
    q_positions = base + torch.arange(q.shape[1], device=q.device) if per_token_q else base.expand(-1, q.shape[1])
    return (_rotated(q, rotary_cos, rotary_sin, q_positions, interleaved),
            _rotated(k, rotary_cos, rotary_sin, k_positions, interleaved))


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    _refuse_fp8("flash_attn_with_kvcache", q)
    slots = cache_batch_idx is not None or cache_leftpad is not None
    if slots and block_table is not None:
        raise ValueError("cache_batch_idx, cache_leftpad: expected None with block_table (flash_attn takes them "
                         "only for caches that are not paged), got a value")
    # flash_attn's reading of the window, against the cache's capacity in keys.
    seq_k = None
    if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4:
        seq_k = k_cache.shape[1] * (block_table.shape[1] if isinstance(block_table, torch.Tensor) else 1)
    causal, window_size = _flash_attn_mask(window_size, causal, seq_k)
    if rotary_cos is not None or rotary_sin is not None:
        # The rotation as its own small pass over q and the new keys: the kernels stay as they are.
        per_token_q = causal or tuple(window_size) != (-1, -1)
        q, k = _rotary_inputs(q, k, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved, per_token_q, seq_k)
    if slots:
        return _kvcache_slots(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                              softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits,
                              return_softmax_lse)
    return forward_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
                           softmax_scale=softmax_scale, causal=causal, num_splits=num_splits,
                           return_lse=return_softmax_lse, window_size=window_size, softcap=softcap,
                           alibi_slopes=alibi_slopes)
