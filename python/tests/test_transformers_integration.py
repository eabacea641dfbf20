"""flash_attention_scratch.integrations.transformers without a GPU: what the attention hook
hands the kernels. forward() and forward_varlen() are stood in for by recorders on CPU
tensors, so these tests check the adapter's own work (layout, the model's window, softcap and
sinks, packing a padded batch and unpacking the result, the refusals); the kernels'
agreement with transformers' eager attention is test_models', on a GPU."""

import pytest

import flash_attention_scratch as fa

try:
    import torch
except ImportError:
    torch = None
try:
    import transformers
except ImportError:
    transformers = None

pytestmark = pytest.mark.skipif(torch is None, reason="needs PyTorch")

if torch is not None:
    from flash_attention_scratch.integrations import transformers as adapter


class Module(torch.nn.Module if torch is not None else object):
    def __init__(self, is_causal=True, sinks=None, weights_dtype=None, config=None):
        super().__init__()
        self.is_causal = is_causal
        self.sinks = sinks
        self.config = config
        if weights_dtype is not None:
            self.proj = torch.nn.Linear(2, 2, dtype=weights_dtype)


def hf_tensors(batch=2, heads=4, heads_kv=2, seq_q=6, seq_k=6, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, d, generator=g)
    k = torch.randn(batch, heads_kv, seq_k, d, generator=g)
    v = torch.randn(batch, heads_kv, seq_k, d, generator=g)
    return q, k, v


@pytest.fixture
def recorder(monkeypatch):
    calls = []

    def forward(q, k, v, **options):
        calls.append(("forward", q, k, v, options))
        return q * 2

    def forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options):
        calls.append(("forward_varlen", q, k, v, dict(options, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k)))
        return q * 2

    monkeypatch.setattr(fa, "forward", forward)
    monkeypatch.setattr(fa, "forward_varlen", forward_varlen)
    return calls


def test_dense_call_carries_the_models_variants(recorder):
    q, k, v = hf_tensors()
    sinks = torch.randn(4, dtype=torch.bfloat16)
    out, weights = adapter.attention_forward(Module(sinks=sinks), q, k, v, None, scaling=0.3, sliding_window=4,
                                             softcap=30.0)  # 6 keys: the window of 4 masks some
    assert weights is None
    (name, fq, fk, fv, options), = recorder
    assert name == "forward"
    # (batch, heads, seq, d) in; the kernels take (batch, seq, heads, d), GQA's K/V not repeated.
    assert fq.shape == (2, 6, 4, 8) and fk.shape == (2, 6, 2, 8) and torch.equal(fv, v.transpose(1, 2))
    # A window of 4 keys keeps the query's own and the 3 before it.
    assert options["window_size"] == (3, 0) and options["causal"] is True
    assert options["softmax_scale"] == 0.3 and options["softcap"] == 30.0
    assert options["learnable_sink"].dtype == torch.float32 and torch.equal(options["learnable_sink"], sinks.float())
    assert torch.equal(out, 2 * q.transpose(1, 2))


def test_no_variants_and_explicit_arguments(recorder):
    q, k, v = hf_tensors()
    sink = torch.randn(4)
    adapter.attention_forward(Module(is_causal=True), q, k, v, None, is_causal=False, s_aux=sink)
    options = recorder[0][4]
    assert options["causal"] is False, "is_causal passed by the model overrides the module's"
    assert options["window_size"] == (-1, -1) and options["softcap"] == 0.0
    assert torch.equal(options["learnable_sink"], sink), "s_aux (gpt-oss's name) is the sink"


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_is_packed_and_unpacked(recorder, side):
    q, k, v = hf_tensors(batch=3, seq_q=5, seq_k=5)
    lengths = [5, 2, 0]  # a full row, a padded one, an empty one
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if side == "left":
            mask[b, 5 - n:] = True
        else:
            mask[b, :n] = True
    out, _ = adapter.attention_forward(Module(), q, k, v, mask.int(), sliding_window=2)
    (name, pq, pk, pv, options), = recorder
    assert name == "forward_varlen"
    assert options["cu_q"].tolist() == [0, 5, 7, 7] and options["cu_k"].tolist() == [0, 5, 7, 7]
    assert options["cu_q"].dtype == torch.int32
    assert (options["max_q"], options["max_k"]) == (5, 5)
    assert options["window_size"] == (1, 0) and options["causal"] is True
    qs = q.transpose(1, 2)
    assert torch.equal(pq, qs[mask]) and torch.equal(pk, k.transpose(1, 2)[mask])
    assert torch.equal(out[mask], 2 * qs[mask])
    assert not out[~mask].any(), "padded query rows are zeros"


def test_decoding_with_a_cache_takes_the_last_mask_columns_as_queries(recorder):
    q, k, v = hf_tensors(batch=2, seq_q=1, seq_k=6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)  # left-padded cache
    out, _ = adapter.attention_forward(Module(), q, k, v, mask)
    options = recorder[0][4]
    assert options["cu_q"].tolist() == [0, 1, 2] and options["cu_k"].tolist() == [0, 4, 10]
    assert (options["max_q"], options["max_k"]) == (1, 6)
    assert out.shape == (2, 1, 4, 8)


def test_packed_sequences_from_position_ids_run_per_sequence(recorder):
    """A padding-free row holding three sequences (position_ids restart): each its own causal
    attention, never across a boundary."""
    q, k, v = hf_tensors(batch=1, seq_q=9, seq_k=9)
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 2]])
    out, _ = adapter.attention_forward(Module(), q, k, v, None, position_ids=position_ids)
    (name, pq, pk, _, options), = recorder
    assert name == "forward_varlen"
    assert options["cu_q"].tolist() == [0, 4, 6, 9] and options["cu_k"].tolist() == [0, 4, 6, 9]
    assert options["cu_q"].dtype == torch.int32 and (options["max_q"], options["max_k"]) == (4, 4)
    assert pq.shape == (9, 4, 8) and torch.equal(pk, k.transpose(1, 2)[0])
    assert out.shape == (1, 9, 4, 8) and torch.equal(out, 2 * q.transpose(1, 2))


def test_flash_attention_kwargs_and_plain_positions(recorder):
    q, k, v = hf_tensors(batch=1, seq_q=7, seq_k=7)
    cu = torch.tensor([0, 3, 7])
    adapter.attention_forward(Module(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=4,
                              max_length_k=4)
    assert recorder[-1][0] == "forward_varlen" and recorder[-1][4]["cu_k"].tolist() == [0, 3, 7]
    # One sequence (positions run on, from any offset), or several rows: one dense call.
    adapter.attention_forward(Module(), q, k, v, None, position_ids=torch.arange(5, 12)[None])
    assert recorder[-1][0] == "forward"
    q2, k2, v2 = hf_tensors(batch=2, seq_q=4, seq_k=4)
    adapter.attention_forward(Module(), q2, k2, v2, None, position_ids=torch.arange(4)[None])  # not expanded
    assert recorder[-1][0] == "forward"
    # Several rows: each its own sequence, read without a synchronisation (transformers' flash
    # path reads packing from a batch of one row only; its collator packs into one row).
    adapter.attention_forward(Module(), q2, k2, v2, None, position_ids=torch.tensor([[0, 1, 0, 1], [0, 1, 2, 3]]))
    assert recorder[-1][0] == "forward"


def test_windows_both_sides_without_a_mask_and_dropped_when_they_mask_nothing(recorder):
    q, k, v = hf_tensors(seq_q=6, seq_k=6)
    adapter.attention_forward(Module(is_causal=False), q, k, v, None, sliding_window=3)
    assert recorder[-1][4]["window_size"] == (2, 2), "bidirectional (ModernBERT, EmbeddingGemma): W - 1 each side"
    adapter.attention_forward(Module(), q, k, v, None, sliding_window=6)
    assert recorder[-1][4]["window_size"] == (-1, -1), "a window as long as the keys masks nothing"


def test_cross_attention_keeps_every_query_row(recorder):
    """Decoder queries against a right-padded encoder output: the mask is the keys' only."""
    q, k, v = hf_tensors(batch=2, seq_q=3, seq_k=5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    out, _ = adapter.attention_forward(Module(is_causal=False), q, k, v, mask)
    options = recorder[-1][4]
    assert options["cu_q"].tolist() == [0, 3, 6] and options["cu_k"].tolist() == [0, 3, 8]
    assert options["causal"] is False
    assert torch.equal(out, 2 * q.transpose(1, 2)), "no query row dropped"


def test_float32_queries_under_autocast_are_cast_back(recorder):
    q, k, v = hf_tensors()
    v = v.bfloat16()
    adapter.attention_forward(Module(weights_dtype=torch.bfloat16), q, k, v, None)
    _, fq, fk, fv, _ = recorder[-1]
    assert fq.dtype == fk.dtype == fv.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.float16):
        adapter.attention_forward(Module(weights_dtype=torch.bfloat16), q, k, v, None)
    assert recorder[-1][1].dtype == torch.float16, "autocast's dtype first"


@pytest.mark.skipif(transformers is None, reason="needs transformers")
def test_the_mask_function_refuses_static_caches_only():
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    padding = torch.ones(2, 8, dtype=torch.bool)
    padding[0, :3] = False
    # A dynamic cache: keys up to the current position; the padding mask passes through.
    assert torch.equal(adapter.padding_mask(2, 2, 8, q_offset=6, mask_function=causal_mask_function,
                                            attention_mask=padding), padding)
    assert adapter.padding_mask(2, 8, 8, mask_function=causal_mask_function, attention_mask=None) is None
    # Cross-attention: 5 decoder queries, 8 encoder keys.
    adapter.padding_mask(2, 5, 8, mask_function=bidirectional_mask_function, attention_mask=None)
    with pytest.raises(NotImplementedError, match="static cache"):
        adapter.padding_mask(2, 2, 32, q_offset=6, mask_function=causal_mask_function, attention_mask=None)


def test_chunked_attention_is_refused(recorder):
    q, k, v = hf_tensors()

    class Config:
        attention_chunk_size = 8192

    with pytest.raises(NotImplementedError, match="attention_chunk_size"):
        adapter.attention_forward(Module(config=Config()), q, k, v, None)


def test_refusals(recorder):
    q, k, v = hf_tensors()
    training = Module()
    training.train()
    with pytest.raises(ValueError, match="dropout"):
        adapter.attention_forward(training, q, k, v, None, dropout=0.1)
    adapter.attention_forward(Module().eval(), q, k, v, None, dropout=0.1)  # no dropout outside training
    with pytest.raises(ValueError, match="attention_mask"):
        adapter.attention_forward(Module(), q, k, v, torch.zeros(2, 1, 6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="output_attentions"):
        adapter.attention_forward(Module(), q, k, v, None, output_attentions=True)
    assert len(recorder) == 1


@pytest.mark.skipif(transformers is None, reason="needs transformers")
def test_register_installs_the_attention_and_its_mask():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    name = adapter.register()
    assert name == adapter.NAME and "flash" not in name
    assert transformers.AttentionInterface._global_mapping[name] is adapter.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[name] is adapter.padding_mask
