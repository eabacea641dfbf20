"""Context parallelism: one sequence's attention split over the ranks of a process group.

Each rank holds a shard of the sequence's queries, keys and values, (batch, seq / ranks, heads,
d_head). ``ring_attention`` passes the K/V shards around the ring of ranks (torch.distributed's
point-to-point operations, NCCL on GPUs) and merges each rank's partial outputs by their
log-sum-exp, the next shard in flight while the current one is computed; its backward passes
the K/V shards around again, with their dK and dV accumulating beside them until they reach
their owner. ``all_gather_attention`` gathers every K/V shard instead, for grouped-query shapes
whose K/V are small, and reduce-scatters dK and dV. Causal attention takes the zigzag layout
(``zigzag_shard``): rank r holds chunks r and 2·ranks − 1 − r of the sequence cut in 2·ranks,
so every rank has the same causal work.

``ring_attention_emulated`` and ``all_gather_attention_emulated`` run the same algorithms over
virtual ranks in one process (the shards and the steps in a loop, no communication), for tests
and for checking a layout on one GPU.
"""

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from . import _ops  # noqa: F401  (registers the custom ops this module calls)

_BOTTOM_RIGHT = 1  # the ops' causal argument: a causal mask aligned at the bottom right


def zigzag_shard(x: torch.Tensor, ranks: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s zigzag shard of `x` along `dim`: chunks rank and 2·ranks − 1 − rank of the
    2·ranks equal chunks, concatenated (a view-free copy)."""
    if x.shape[dim] % (2 * ranks) != 0:
        raise ValueError(f"x.shape[{dim}]: expected a multiple of 2 x ranks = {2 * ranks} (zigzag chunks), "
                         f"got {x.shape[dim]}")
    chunks = x.chunk(2 * ranks, dim)
    return torch.cat((chunks[rank], chunks[2 * ranks - 1 - rank]), dim)


def zigzag_unshard(shards: Sequence[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's zigzag shard, in rank order (zigzag_shard's inverse)."""
    ranks = len(shards)
    halves = [s.chunk(2, dim) for s in shards]
    return torch.cat([halves[r][0] for r in range(ranks)] + [halves[r][1] for r in reversed(range(ranks))], dim)


def _merge(out, lse, part_out, part_lse):
    """out, lse (accumulators: (batch, seq, heads, d_head), (batch, heads, seq)) merged in place
    with a partial result over other keys, by their log-sum-exp. Rows that saw no key in either
    (LSE −inf) stay zero."""
    new = torch.logaddexp(lse, part_lse.to(lse.dtype))
    keep = torch.where(torch.isinf(new), 0.0, torch.exp(lse - new))
    take = torch.where(torch.isinf(new), 0.0, torch.exp(part_lse.to(lse.dtype) - new))
    out.mul_(keep.transpose(1, 2)[..., None]).add_(part_out.to(out.dtype) * take.transpose(1, 2)[..., None])
    lse.copy_(new)


def _blocks(causal: bool, step: int, source: int, rank: int, half: int):
    """The work of one ring step at `rank` holding the K/V shard of rank `source`: (query rows,
    key rows, causal) slices, or None. Non-causal: everything. Causal zigzag: the own shard
    causally; a lower rank's first chunk precedes both query chunks (its second follows them
    both); a higher rank's two chunks lie between the query chunks, seen by the second whole."""
    every = slice(None)
    if not causal:
        return every, every, False
    if step == 0:
        return every, every, True
    if source < rank:
        return every, slice(0, half), False
    return slice(half, None), every, False


def _forward_steps(q, k, v, softmax_scale, causal, ranks, rank):
    """One rank's forward as a generator: it yields ("start", tensors) to send its K/V shard to
    the next rank (receiving a token), ("wait", token) for the previous rank's (receiving
    them), and returns (out, lse), the LSE in the accumulators' dtype (fp32 for 16-bit inputs)."""
    accumulate = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(q.shape, dtype=accumulate, device=q.device)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=accumulate, device=q.device)
    half = q.shape[1] // 2
    kv = (k, v)
    for step in range(ranks):
        token = (yield ("start", kv)) if step + 1 < ranks else None
        rows, keys, block_causal = _blocks(causal, step, (rank - step) % ranks, rank, half)
        part_out, part_lse = torch.ops.flash_attention_scratch.forward_lse(
            q[:, rows], kv[0][:, keys], kv[1][:, keys], softmax_scale, _BOTTOM_RIGHT if block_causal else 0, None)
        _merge(out[:, rows], lse[:, :, rows], part_out, part_lse)
        if token is not None:
            kv = yield ("wait", token)
    return out.to(q.dtype), lse


def _backward_steps(dout, q, k, v, out, lse, softmax_scale, causal, ranks, rank):
    """One rank's backward as a generator (the protocol of _forward_steps): each step's dQ, dK
    and dV from the forward's whole out and LSE; dK and dV accumulate beside the K/V shard they
    belong to and travel with it, one step behind, arriving at their owner after the last.
    Returns (dq, dk, dv)."""
    accumulate = torch.promote_types(q.dtype, torch.float32)
    dq = torch.zeros(q.shape, dtype=accumulate, device=q.device)
    dkv = (torch.zeros(k.shape, dtype=accumulate, device=q.device),
           torch.zeros(v.shape, dtype=accumulate, device=q.device))
    half = q.shape[1] // 2
    kv, dkv_token = (k, v), None
    for step in range(ranks):
        kv_token = (yield ("start", kv)) if step + 1 < ranks else None
        rows, keys, block_causal = _blocks(causal, step, (rank - step) % ranks, rank, half)
        part_dq, part_dk, part_dv, _ = torch.ops.flash_attention_scratch.backward(
            dout[:, rows], q[:, rows], kv[0][:, keys], kv[1][:, keys], out[:, rows],
            lse[:, :, rows].contiguous(), softmax_scale, _BOTTOM_RIGHT if block_causal else 0)
        dq[:, rows] += part_dq
        if dkv_token is not None:  # the accumulators of the shard this step computed with
            dkv = yield ("wait", dkv_token)
        dkv[0][:, keys] += part_dk
        dkv[1][:, keys] += part_dv
        if ranks > 1:
            dkv_token = yield ("start", dkv)
        if kv_token is not None:
            kv = yield ("wait", kv_token)
    if ranks > 1:
        dkv = yield ("wait", dkv_token)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def _sharded(x, ranks, rank, causal):
    """Rank `rank`'s rows of a whole-sequence tensor: its zigzag shard for causal attention,
    else its contiguous chunk (the order a non-causal call's keys may take)."""
    return zigzag_shard(x, ranks, rank) if causal else x.chunk(ranks, 1)[rank]


def _whole(shards, causal):
    return zigzag_unshard(shards) if causal else torch.cat(shards, 1)


def _gathered_blocks(causal, ranks, rank, half):
    """The calls of a rank over the gathered keys: (query rows, keys end, causal). Non-causal:
    one over every key; causal zigzag: each query chunk over the keys up to its own chunk's end,
    causally (aligned at the bottom right)."""
    if not causal:
        return [(slice(None), None, False)]
    return [(slice(0, half), (rank + 1) * half, True), (slice(half, None), (2 * ranks - rank) * half, True)]


def _gathered_forward_steps(q, k, v, softmax_scale, causal, ranks, rank):
    """The all-gather variant's forward (the protocol of _forward_steps): every rank's K/V shard
    gathered, then the rank's queries against the whole sequence's keys."""
    shards = yield ("all_gather", (k, v))
    keys, values = (_whole([s[i] for s in shards], causal) for i in range(2))
    out = torch.empty_like(q)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    for rows, end, block_causal in _gathered_blocks(causal, ranks, rank, q.shape[1] // 2):
        out[:, rows], lse[:, :, rows] = torch.ops.flash_attention_scratch.forward_lse(
            q[:, rows], keys[:, :end], values[:, :end], softmax_scale, _BOTTOM_RIGHT if block_causal else 0, None)
    return out, lse


def _gathered_backward_steps(dout, q, k, v, out, lse, softmax_scale, causal, ranks, rank):
    """The all-gather variant's backward: the K/V shards gathered again (not kept from the
    forward), the rank's dQ and its fp32 share of every rank's dK and dV, which a
    reduce-scatter sums onto their owners."""
    shards = yield ("all_gather", (k, v))
    keys, values = (_whole([s[i] for s in shards], causal) for i in range(2))
    accumulate = torch.promote_types(q.dtype, torch.float32)
    dq = torch.empty_like(q)
    dkeys = torch.zeros(keys.shape, dtype=accumulate, device=q.device)
    dvalues = torch.zeros(values.shape, dtype=accumulate, device=q.device)
    for rows, end, block_causal in _gathered_blocks(causal, ranks, rank, q.shape[1] // 2):
        part_dq, part_dk, part_dv, _ = torch.ops.flash_attention_scratch.backward(
            dout[:, rows], q[:, rows], keys[:, :end], values[:, :end], out[:, rows], lse[:, :, rows].contiguous(),
            softmax_scale, _BOTTOM_RIGHT if block_causal else 0)
        dq[:, rows] = part_dq
        dkeys[:, :end] += part_dk
        dvalues[:, :end] += part_dv
    dk, dv = yield ("reduce_scatter", [[_sharded(t, ranks, r, causal) for r in range(ranks)]
                                       for t in (dkeys, dvalues)])
    return dq, dk.to(k.dtype), dv.to(v.dtype)


_METHODS = {"ring": (_forward_steps, _backward_steps), "all_gather": (_gathered_forward_steps, _gathered_backward_steps)}


def _drive_group(steps, group):
    """Runs one rank's generator over torch.distributed: each "start" posts the sends to the
    next rank and the receives from the previous one (batch_isend_irecv), each "wait" completes
    them; "all_gather" and "reduce_scatter" are the collectives of their names."""
    ranks = dist.get_world_size(group)
    rank = dist.get_rank(group)
    members = group if group is not None else dist.group.WORLD
    to_next = dist.get_global_rank(members, (rank + 1) % ranks)
    from_previous = dist.get_global_rank(members, (rank - 1) % ranks)
    try:
        message = next(steps)
    except StopIteration as done:  # one rank: nothing to exchange
        return done.value
    while True:
        kind, payload = message
        if kind == "start":
            sent = [t.contiguous() for t in payload]
            received = [torch.empty_like(t) for t in sent]
            ops = ([dist.P2POp(dist.isend, t, to_next, group) for t in sent]
                   + [dist.P2POp(dist.irecv, t, from_previous, group) for t in received])
            reply = (dist.batch_isend_irecv(ops), sent, received)
        elif kind == "wait":
            requests, _, received = payload
            for request in requests:
                request.wait()
            reply = tuple(received)
        elif kind == "all_gather":
            gathered = []
            for t in payload:
                parts = [torch.empty_like(t) for _ in range(ranks)]
                dist.all_gather(parts, t.contiguous(), group)
                gathered.append(parts)
            reply = list(zip(*gathered))  # a tuple of this message's tensors per rank
        else:  # reduce_scatter: one list of `ranks` pieces a tensor
            reply = []
            for pieces in payload:
                mine = torch.empty_like(pieces[rank])
                dist.reduce_scatter(mine, [p.contiguous() for p in pieces], group=group)
                reply.append(mine)
        try:
            message = steps.send(reply)
        except StopIteration as done:
            return done.value


def _drive_lockstep(all_steps):
    """Runs every virtual rank's generator in one process, a message of each a round: the ranks
    run the same steps, so a round's messages are all of one kind. Rank r receives what rank
    r - 1 sent; a collective sees every rank's contribution."""
    ranks = len(all_steps)
    messages: List = [None] * ranks
    results: List = [None] * ranks
    for r, steps in enumerate(all_steps):
        try:
            messages[r] = next(steps)
        except StopIteration as done:  # one rank: nothing to exchange
            results[r] = done.value
    sent = {}
    exchanges = 0
    while messages[0] is not None:
        kind = messages[0][0]
        payloads = [payload for _, payload in messages]
        if kind == "start":
            for r in range(ranks):
                sent[(r, exchanges)] = tuple(payloads[r])
            replies = [exchanges] * ranks
            exchanges += 1
        elif kind == "wait":
            replies = [sent[((r - 1) % ranks, payloads[r])] for r in range(ranks)]
        elif kind == "all_gather":
            replies = [[tuple(p) for p in payloads]] * ranks
        else:  # reduce_scatter
            replies = [[sum(payloads[i][t][r] for i in range(ranks)) for t in range(len(payloads[r]))]
                       for r in range(ranks)]
        for r, steps in enumerate(all_steps):
            try:
                messages[r] = steps.send(replies[r])
            except StopIteration as done:
                messages[r], results[r] = None, done.value
    return results


def _check_shards(q, k, v, causal, ranks):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a (batch, seq / ranks, heads, d_head) shard, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"k, v: expected shards of q's batch and length {tuple(q.shape[:2])} and d_head "
                         f"{q.shape[3]}, got {tuple(k.shape)} and {tuple(v.shape)}")
    if causal and ranks > 1 and q.shape[1] % 2 != 0:
        raise ValueError(f"q.shape[1]: expected an even shard (two zigzag chunks) for causal attention, "
                         f"got {q.shape[1]}")


class _GroupAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, softmax_scale, causal, method):
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        forward_steps, _ = _METHODS[method]
        out, lse = _drive_group(forward_steps(q, k, v, softmax_scale, causal, ranks, rank), group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.softmax_scale, ctx.causal, ctx.method = group, softmax_scale, causal, method
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ranks, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        _, backward_steps = _METHODS[ctx.method]
        dq, dk, dv = _drive_group(backward_steps(dout.contiguous(), q, k, v, out, lse, ctx.softmax_scale,
                                                 ctx.causal, ranks, rank), ctx.group)
        return dq, dk, dv, None, None, None, None


def _group_attention(q, k, v, group, causal, softmax_scale, method):
    ranks = dist.get_world_size(group)
    _check_shards(q, k, v, causal, ranks)
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    return _GroupAttention.apply(q, k, v, group, softmax_scale, bool(causal), method)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Optional[dist.ProcessGroup] = None,
                   *, causal: bool = False, softmax_scale: Optional[float] = None) -> torch.Tensor:
    """Attention over a sequence sharded across `group`'s ranks (default: the world), each
    calling with its own shards q (batch, seq / ranks, heads, d_head) and k, v (batch,
    seq / ranks, heads_kv, d_head); returns this rank's rows of the output. Causal attention
    needs the zigzag layout (zigzag_shard), non-causal any sharding. Differentiable: the
    backward runs the ring again (every rank must call it, as with the forward). GQA as the
    single-GPU kernels take it; no window, softcap or sinks yet."""
    return _group_attention(q, k, v, group, causal, softmax_scale, "ring")


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         group: Optional[dist.ProcessGroup] = None, *, causal: bool = False,
                         softmax_scale: Optional[float] = None) -> torch.Tensor:
    """ring_attention's contract by another route, for grouped-query shapes whose K/V are small:
    every rank's K/V shard all-gathered (the whole sequence's keys on each rank), one or two
    kernel calls a rank; the backward gathers them again and reduce-scatters dK and dV (fp32)
    onto their owners. Every rank's shards are the same length. Causal: the zigzag layout."""
    return _group_attention(q, k, v, group, causal, softmax_scale, "all_gather")


class _EmulatedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, softmax_scale, causal, method, ranks, *shards):
        qs, ks, vs = shards[:ranks], shards[ranks:2 * ranks], shards[2 * ranks:]
        forward_steps, _ = _METHODS[method]
        results = _drive_lockstep([forward_steps(qs[r], ks[r], vs[r], softmax_scale, causal, ranks, r)
                                   for r in range(ranks)])
        outs = [o for o, _ in results]
        ctx.save_for_backward(*shards, *outs, *(lse for _, lse in results))
        ctx.softmax_scale, ctx.causal, ctx.method, ctx.ranks = softmax_scale, causal, method, ranks
        return tuple(outs)

    @staticmethod
    def backward(ctx, *douts):
        ranks = ctx.ranks
        saved = ctx.saved_tensors
        qs, ks, vs = saved[:ranks], saved[ranks:2 * ranks], saved[2 * ranks:3 * ranks]
        outs, lses = saved[3 * ranks:4 * ranks], saved[4 * ranks:]
        _, backward_steps = _METHODS[ctx.method]
        grads = _drive_lockstep([
            backward_steps(douts[r].contiguous(), qs[r], ks[r], vs[r], outs[r], lses[r], ctx.softmax_scale,
                           ctx.causal, ranks, r) for r in range(ranks)])
        return (None, None, None, None, *(g[0] for g in grads), *(g[1] for g in grads), *(g[2] for g in grads))


def _emulated(qs, ks, vs, causal, softmax_scale, method):
    ranks = len(qs)
    if ranks < 1 or len(ks) != ranks or len(vs) != ranks:
        raise ValueError(f"qs, ks, vs: expected one shard a rank each, got {len(qs)}, {len(ks)}, {len(vs)}")
    for q, k, v in zip(qs, ks, vs):
        _check_shards(q, k, v, causal, ranks)
        if q.shape != qs[0].shape or k.shape != ks[0].shape:
            raise ValueError(f"qs, ks: expected every rank's shards of one shape, got {tuple(q.shape)} and "
                             f"{tuple(k.shape)} beside rank 0's {tuple(qs[0].shape)} and {tuple(ks[0].shape)}")
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    return list(_EmulatedAttention.apply(softmax_scale, bool(causal), method, ranks, *qs, *ks, *vs))


def ring_attention_emulated(qs: Sequence[torch.Tensor], ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor],
                            *, causal: bool = False, softmax_scale: Optional[float] = None) -> List[torch.Tensor]:
    """ring_attention's algorithm over len(qs) virtual ranks in one process: qs[r], ks[r], vs[r]
    are rank r's shards; returns every rank's output rows. Differentiable, as ring_attention."""
    return _emulated(qs, ks, vs, causal, softmax_scale, "ring")


def all_gather_attention_emulated(qs: Sequence[torch.Tensor], ks: Sequence[torch.Tensor],
                                  vs: Sequence[torch.Tensor], *, causal: bool = False,
                                  softmax_scale: Optional[float] = None) -> List[torch.Tensor]:
    """all_gather_attention's algorithm over virtual ranks in one process, as
    ring_attention_emulated."""
    return _emulated(qs, ks, vs, causal, softmax_scale, "all_gather")
