"""flash_attention_scratch as a Hugging Face transformers attention implementation.

    from flash_attention_scratch.integrations import transformers as fas_transformers
    fas_transformers.register()  # once; returns the name, "fa_scratch"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fa_scratch")
    # or model.set_attn_implementation("fa_scratch") on a loaded model

The model's own sliding window, logit softcap and attention sinks (Mistral, Gemma 2/3,
gpt-oss) reach the kernels, and grouped-query attention runs without repeating K and V.

Masks: the name registers transformers' flash-attention mask function, which hands the
attention a 2D (batch, keys) padding mask, or None when nothing is padded. Without padding
the call is one dense forward(), differentiable for plain and causal attention (training).
With padding (left or right: batched generation) the tokens are packed and run through
forward_varlen, and so are padding-free batches of several sequences, given as transformers
gives them: cu_seq_lens_q/k and max_length_q/k (DataCollatorWithFlattening), or position_ids
that restart within a row. forward_varlen has no backward yet: training on such
batches raises NotImplementedError, as do the window, softcap and sinks when an input
requires grad.
Attention dropout other than 0 while training raises ValueError: there is none here.

The name holds no "flash": transformers reads that substring as a request for the
flash-attn package's own code paths.
"""

import flash_attention_scratch as _fa

NAME = "fa_scratch"


def _window(sliding_window):
    # transformers' window of W keeps keys in (q - W, q]: W keys, the query's own included.
    return (sliding_window - 1, 0) if sliding_window else (-1, -1)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention interface: query (batch, heads, seq_q, d), key and value
    (batch, heads_kv, seq_k, d); returns ((batch, seq_q, heads, d), None). attention_mask:
    None or a bool/int (batch, seq_k) padding mask (flash-attention style, 1 = token)."""
    if dropout and module.training:
        raise ValueError(f"dropout: expected 0.0 while training (flash_attention_scratch has no attention dropout), "
                         f"got {dropout!r}; set the model's attention_dropout to 0")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: expected False (the kernels never form the attention matrix), got True")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    options = dict(softmax_scale=scaling, causal=bool(causal), window_size=_window(sliding_window),
                   softcap=float(softcap or 0.0),
                   learnable_sink=None if sinks is None else sinks.float().contiguous())
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attention_mask is None:
        packed = _packed_lengths(q, k, kwargs)
        if packed is None:
            return _fa.forward(q, k, v, **options), None
        cu_q, cu_k, max_q, max_k = packed
        out = _fa.forward_varlen(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                                 v.reshape(-1, *v.shape[2:]), cu_q, cu_k, max_q, max_k, **options)
        return out.view(q.shape[0], -1, *out.shape[1:]), None
    if attention_mask.dim() != 2 or attention_mask.shape != (k.shape[0], k.shape[1]):
        raise ValueError(f"attention_mask: expected None or a (batch, seq_k) = {tuple(k.shape[:2])} padding mask "
                         f"(register() installs the mask function that makes one), got shape "
                         f"{tuple(attention_mask.shape)}")
    return _padded(q, k, v, attention_mask.bool(), options), None


def _packed_lengths(q, k, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of a padding-free batch of
    several sequences, flattened along the tokens, or None for a plain batch. transformers'
    flash-attention kwargs first; else position_ids that restart within a row (as transformers'
    own masks read them), at one host synchronisation."""
    import torch

    if kwargs.get("cu_seq_lens_q") is not None:
        cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
        cu_k = kwargs.get("cu_seq_lens_k", kwargs["cu_seq_lens_q"]).to(torch.int32)
        lengths = [kwargs.get("max_length_q"), kwargs.get("max_length_k")]
        for i, cu in enumerate((cu_q, cu_k)):
            if lengths[i] is None:
                lengths[i] = int((cu[1:] - cu[:-1]).max())
        return cu_q, cu_k, int(lengths[0]), int(lengths[1])
    position_ids = kwargs.get("position_ids")
    if position_ids is None or q.shape[1] != k.shape[1] or q.shape[1] < 2:
        return None
    positions = position_ids.expand(q.shape[0], -1) if position_ids.shape[0] == 1 else position_ids
    if tuple(positions.shape) != tuple(q.shape[:2]):
        return None
    starts = torch.ones_like(positions, dtype=torch.bool)  # where a sequence begins
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    if not bool(starts[:, 1:].any()):  # every row one run of consecutive positions
        return None
    first = starts.reshape(-1).nonzero().view(-1)
    bounds = torch.cat([first, first.new_full((1,), starts.numel())]).to(torch.int32)
    longest = int((bounds[1:] - bounds[:-1]).max())
    return bounds, bounds, longest, longest


def _padded(q, k, v, keys_kept, options):
    """Attention over the kept tokens of each sequence, packed; padded query rows get zeros.
    The query rows are the last seq_q positions of the mask (prefill: all of them; decoding
    with a cache: the new ones)."""
    import torch

    batch, seq_q = q.shape[:2]
    queries_kept = keys_kept[:, -seq_q:]
    q_lengths = queries_kept.sum(1, dtype=torch.int32)
    k_lengths = keys_kept.sum(1, dtype=torch.int32)
    cu_q = torch.nn.functional.pad(q_lengths.cumsum(0, dtype=torch.int32), (1, 0))
    cu_k = torch.nn.functional.pad(k_lengths.cumsum(0, dtype=torch.int32), (1, 0))
    # The grid's size is read on the host: one synchronisation, as transformers' own
    # flash-attention path makes for padded batches.
    max_q, max_k = (int(x) for x in torch.stack([q_lengths.max(), k_lengths.max()]).tolist())
    packed = _fa.forward_varlen(q[queries_kept], k[keys_kept], v[keys_kept], cu_q, cu_k, max_q, max_k, **options)
    out = q.new_zeros(batch, seq_q, q.shape[2], v.shape[3])
    out[queries_kept] = packed
    return out


def register(name=NAME):
    """Registers the attention and its mask function under `name` (transformers'
    AttentionInterface and the mask interface) and returns the name."""
    import transformers

    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
    except ImportError as error:
        raise ImportError(f"transformers: expected a release with AttentionInterface and "
                          f"masking_utils.flash_attention_mask, got {transformers.__version__}") from error

    transformers.AttentionInterface.register(name, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, flash_attention_mask)
    return name
