"""Context parallelism (flash_attention_scratch.distributed): the zigzag layout, the ring's and
the all-gather variant's algorithms over virtual ranks in one process against attention over the
whole sequence, forward and backward, and the torch.distributed driver over real ranks.

Without a GPU the kernels are the float64 stand-ins of test_autograd_cpu (the algorithm, the
merges and the ring's bookkeeping are the package's own), and the real ranks are CPU processes
over gloo. On a GPU the emulation runs the library's kernels, checked by the FlashAttention
rule against float64 attention over the whole sequence."""

import math
import os
import socket

import pytest

from test_autograd_cpu import standins  # noqa: F401  (the stand-in kernels' fixture)
from test_backward import assert_gradients_match, reference_attention, seeded
from test_forward import assert_matches, needs_gpu

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from flash_attention_scratch import distributed as cp
except ImportError:
    torch = None

pytestmark = pytest.mark.skipif(torch is None, reason="needs PyTorch")

CASES = [  # ranks, causal, heads, heads_kv
    (1, True, 4, 4),
    (2, False, 4, 4),
    (2, True, 4, 2),
    (4, True, 4, 1),
    (8, True, 2, 2),
    (4, False, 4, 2),
]


def shards_of(x, ranks, causal):
    """Each rank's shard: zigzag for causal attention, contiguous chunks otherwise."""
    if causal:
        return [cp.zigzag_shard(x, ranks, r) for r in range(ranks)]
    return list(x.chunk(ranks, 1))


def whole_of(shards, causal):
    return cp.zigzag_unshard(shards) if causal else torch.cat(shards, 1)


def test_zigzag_layout_round_trips_and_balances_causal_work():
    x = torch.arange(16).view(1, 16, 1, 1)
    shards = [cp.zigzag_shard(x, 4, r) for r in range(4)]
    assert [s.flatten().tolist() for s in shards] == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11],
                                                      [6, 7, 8, 9]]
    assert torch.equal(cp.zigzag_unshard(shards), x)
    # Causal pairs (query, key <= query) a rank's rows see: the same for every rank.
    assert len({sum(int(p) + 1 for p in s.flatten()) for s in shards}) == 1
    with pytest.raises(ValueError, match=r"x.shape\[1\]: expected a multiple of 2 x ranks = 8"):
        cp.zigzag_shard(torch.zeros(1, 12, 1, 1), 4, 0)


EMULATED = {"ring": "ring_attention_emulated", "all_gather": "all_gather_attention_emulated"} if torch else {}


@pytest.mark.parametrize("method", ["ring", "all_gather"])
@pytest.mark.parametrize("ranks,causal,heads,heads_kv", CASES)
def test_emulation_matches_whole_sequence_attention(standins, ranks, causal, heads, heads_kv, method):  # noqa: F811
    """float64 through the stand-ins: the ring's merges and gradient bookkeeping against autograd
    over the whole sequence, to the stand-ins' precision (their LSE is fp32, as the kernels')."""
    torch.manual_seed(ranks * 10 + heads_kv)
    seq, d = 16 * ranks, 16
    q = torch.randn(2, seq, heads, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, seq, heads_kv, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, seq, heads_kv, d, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, seq, heads, d, dtype=torch.float64)
    scale = 0.3
    ref, _ = reference_attention(q, k, v, scale, causal)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)

    leaves = [[s.detach().requires_grad_() for s in shards_of(x, ranks, causal)] for x in (q, k, v)]
    outs = getattr(cp, EMULATED[method])(*leaves, causal=causal, softmax_scale=scale)
    torch.testing.assert_close(whole_of(outs, causal), ref, rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(outs, [t for shards in leaves for t in shards], shards_of(dout, ranks, causal))
    for name, i, want in zip(("dq", "dk", "dv"), range(3), ref_grads):
        got = whole_of(list(grads[i * ranks:(i + 1) * ranks]), causal)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)


def test_emulation_refuses_mismatched_shards():
    q = torch.zeros(1, 4, 2, 16)
    with pytest.raises(ValueError, match="qs, ks, vs: expected one shard a rank each"):
        cp.ring_attention_emulated([q, q], [q], [q, q])
    with pytest.raises(ValueError, match="k, v: expected shards of q's batch and length"):
        cp.ring_attention_emulated([q], [torch.zeros(1, 6, 2, 16)], [torch.zeros(1, 6, 2, 16)])
    with pytest.raises(ValueError, match=r"q.shape\[1\]: expected an even shard"):
        odd = torch.zeros(1, 3, 2, 16)
        cp.ring_attention_emulated([odd, odd], [odd, odd], [odd, odd], causal=True)
    with pytest.raises(ValueError, match="qs, ks: expected every rank's shards of one shape"):
        short = torch.zeros(1, 2, 2, 16)
        cp.all_gather_attention_emulated([q, short], [q, short], [q, short])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_worker(rank, ranks, port, causal, method, results):
    """One gloo rank: the stand-in kernels registered in this process, its shards of seeded
    inputs, ring_attention or all_gather_attention forward and backward; its rows and gradients
    into `results`."""
    import test_autograd_cpu as standin
    lib = torch.library.Library("flash_attention_scratch", "FRAGMENT")
    lib.impl("forward_lse", standin._standin_forward_lse, "CPU")
    lib.impl("backward", standin._standin_backward, "CPU")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        generator = torch.Generator().manual_seed(7)
        q, k, v, dout = (torch.randn(1, 8 * ranks, 2, 16, dtype=torch.float64, generator=generator)
                         for _ in range(4))
        local = [(cp.zigzag_shard(x, ranks, rank) if causal else x.chunk(ranks, 1)[rank]).requires_grad_()
                 for x in (q, k, v)]
        out = getattr(cp, f"{method}_attention")(*local, causal=causal, softmax_scale=0.25)
        dout_local = cp.zigzag_shard(dout, ranks, rank) if causal else dout.chunk(ranks, 1)[rank]
        grads = torch.autograd.grad(out, local, dout_local)
        results[rank] = [t.detach().clone() for t in (out, *grads)]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("method", ["ring", "all_gather"])
@pytest.mark.parametrize("causal", [False, True])
def test_group_attention_over_gloo_ranks_matches_the_emulation(standins, causal, method):  # noqa: F811
    """Real ranks (CPU processes over gloo: point-to-point operations, all-gather and
    reduce-scatter) through the torch.distributed driver: the same rows and gradients as the
    emulation of the same shards."""
    ranks = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_group_worker, args=(ranks, _free_port(), causal, method, results), nprocs=ranks, join=True)
        results = dict(results)
    generator = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(1, 8 * ranks, 2, 16, dtype=torch.float64, generator=generator) for _ in range(4))
    leaves = [[s.detach().requires_grad_() for s in shards_of(x, ranks, causal)] for x in (q, k, v)]
    outs = getattr(cp, EMULATED[method])(*leaves, causal=causal, softmax_scale=0.25)
    grads = torch.autograd.grad(outs, [t for shards in leaves for t in shards], shards_of(dout, ranks, causal))
    for r in range(ranks):
        want = [outs[r], grads[r], grads[ranks + r], grads[2 * ranks + r]]
        for name, got, w in zip(("out", "dq", "dk", "dv"), results[r], want):
            torch.testing.assert_close(got, w.detach(), rtol=1e-12, atol=1e-12, msg=f"rank {r} {name}")


@needs_gpu
@pytest.mark.parametrize("method", ["ring", "all_gather"])
@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [8, 2])
def test_emulation_on_the_kernels_follows_the_flashattention_rule(ranks, causal, heads_kv, method):
    """The library's kernels under the ring (bf16, d_head 128, GQA or not): the whole output and
    the gradients against float64 attention over the whole sequence, by the FlashAttention rule."""
    seed = seeded()
    dtype, seq, heads, d = torch.bfloat16, 256 * ranks, 8, 128
    q = torch.randn(2, seq, heads, d, dtype=dtype, device="cuda")
    k = torch.randn(2, seq, heads_kv, d, dtype=dtype, device="cuda")
    v = torch.randn(2, seq, heads_kv, d, dtype=dtype, device="cuda")
    dout = torch.randn_like(q)
    leaves = [[s.detach().requires_grad_() for s in shards_of(x, ranks, causal)] for x in (q, k, v)]
    outs = getattr(cp, EMULATED[method])(*leaves, causal=causal)
    assert_matches(whole_of(outs, causal), None, q, k, v, d ** -0.5, causal)
    grads = torch.autograd.grad(outs, [t for shards in leaves for t in shards], shards_of(dout, ranks, causal))
    ours = [whole_of(list(grads[i * ranks:(i + 1) * ranks]), causal) for i in range(3)]
    assert_gradients_match(ours, q, k, v, dout, scale=1 / math.sqrt(d), causal=causal,
                           note=f"({method}, ranks {ranks}, seed {seed})")
