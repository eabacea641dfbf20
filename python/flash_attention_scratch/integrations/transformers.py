"""flash_attention_scratch as a Hugging Face transformers attention implementation.

    from flash_attention_scratch.integrations import transformers as fas_transformers
    fas_transformers.register()  # once; returns the name, "fa_scratch"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fa_scratch")
    # or model.set_attn_implementation("fa_scratch") on a loaded model

The model's own sliding window (causal, or both sides for bidirectional models), logit
softcap and attention sinks (Mistral, Gemma 2/3, gpt-oss, ModernBERT) reach the kernels, and
grouped-query attention runs without repeating K and V. q and k promoted to float32 under
autocast (fp32 weights, RoPE) are cast back to the autocast dtype, as transformers'
flash-attention path does.

Masks: the name registers a mask function that hands the attention a 2D (batch, keys)
padding mask, or None when nothing is padded. Without padding the call is one dense
forward(), differentiable for plain and causal attention (training). With padding (left or
right: batched generation; an encoder's padded source in cross-attention) the tokens are
packed and run through forward_varlen, and so are padding-free batches of several sequences,
given as transformers gives them: cu_seq_lens_q/k and max_length_q/k
(DataCollatorWithFlattening), or position_ids that restart in a batch of one row (as
transformers' flash-attention path reads them); those train too (forward_varlen's backward).
The window (dropped where it is no shorter than the keys: it masks nothing), the softcap and
the sinks train.
Attention dropout other than 0 while training raises ValueError.

Not supported, with a clear error: static caches (cache_implementation="static": key slots
past the current position), 4D masks (block masks of vision encoders) and chunked attention
(Llama 4). Masks that add rules of their own beyond causal, window and padding (Gemma 3's
bidirectional image tokens) are not seen by this mask function, as by transformers' own
flash-attention path: use such models with "sdpa" or "eager".

The name holds no "flash": transformers reads that substring as a request for the
flash-attn package's own code paths.
"""

import flash_attention_scratch as _fa

NAME = "fa_scratch"


def _window(sliding_window, causal, seq_k):
    """transformers' window of W keeps the W keys up to the query's own, causal (keys in
    (q - W, q]), or within W - 1 either side without a mask; a window at least as long as the
    keys masks nothing and is dropped, so that it costs nothing (and trains)."""
    if not sliding_window or seq_k <= sliding_window:
        return (-1, -1)
    return (sliding_window - 1, 0 if causal else sliding_window - 1)


def _target_dtype(query, module):
    """The 16-bit dtype for float32 q and k (promoted under autocast by RoPE or a norm in
    float32): autocast's, else the module's weights'."""
    import torch

    if query.dtype != torch.float32:
        return None
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    weights = [p.dtype for p in module.parameters() if p.dtype in (torch.float16, torch.bfloat16)]
    return weights[0] if weights else None


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
    if getattr(getattr(module, "config", None), "attention_chunk_size", None):
        raise NotImplementedError("config.attention_chunk_size: expected None (chunked attention, Llama 4, is not "
                                  f"supported), got {module.config.attention_chunk_size}; use 'sdpa'")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    target = _target_dtype(query, module)
    if target is not None:
        query, key, value = (t.to(target) for t in (query, key, value))
    options = dict(softmax_scale=scaling, causal=causal, window_size=_window(sliding_window, causal, key.shape[2]),
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
    return _padded(q, k, v, attention_mask.bool(), options, causal), None


def _packed_lengths(q, k, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of a padding-free batch of
    several sequences, flattened along the tokens, or None for a plain batch. transformers'
    flash-attention kwargs first; else, for a batch of one row as transformers' flash-attention
    path reads them, position_ids that restart, at one host synchronisation (batched training,
    whose rows are sequences of their own, pays none)."""
    import torch

    if kwargs.get("cu_seq_lens_q") is not None:
        cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
        cu_k = kwargs.get("cu_seq_lens_k")
        cu_k = cu_q if cu_k is None else cu_k.to(torch.int32)
        lengths = [kwargs.get("max_length_q"), kwargs.get("max_length_k")]
        for i, cu in enumerate((cu_q, cu_k)):
            if lengths[i] is None:
                lengths[i] = int((cu[1:] - cu[:-1]).max())
        return cu_q, cu_k, int(lengths[0]), int(lengths[1])
    position_ids = kwargs.get("position_ids")
    if position_ids is None or q.shape[0] != 1 or q.shape[1] != k.shape[1] or q.shape[1] < 2:
        return None
    positions = position_ids.reshape(1, -1)
    if positions.shape[1] != q.shape[1]:
        return None
    starts = torch.ones_like(positions, dtype=torch.bool)  # where a sequence begins
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    if not bool(starts[:, 1:].any()):  # every row one run of consecutive positions
        return None
    first = starts.reshape(-1).nonzero().view(-1)
    bounds = torch.cat([first, first.new_full((1,), starts.numel())]).to(torch.int32)
    longest = int((bounds[1:] - bounds[:-1]).max())
    return bounds, bounds, longest, longest


def _padded(q, k, v, keys_kept, options, causal):
    """Attention over the kept tokens of each sequence, packed; padded query rows get zeros.
    Causal (self-attention), the query rows are the mask's last seq_q columns (prefill: all of
    them; decoding with a cache: the new ones). Not causal (an encoder, or cross-attention to an
    encoder's padded output), every query row is kept, as transformers keeps them."""
    import torch

    batch, seq_q = q.shape[:2]
    queries_kept = keys_kept[:, -seq_q:] if causal else keys_kept.new_ones(batch, seq_q)
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


def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """transformers' mask interface for this attention: None, or the 2D (batch, keys) padding
    mask (transformers' flash-attention one). A causal mask over key slots past the last
    query's position (a static cache: those slots hold no keys yet, and no 2D mask says so) is
    refused; cross-attention, whose keys are another sequence, is not that."""
    past_the_queries = kv_offset == 0 and kv_length > q_offset + q_length
    if past_the_queries and mask_function is not None and not _sees(mask_function, q_offset + q_length - 1,
                                                                      kv_length - 1):
        raise NotImplementedError(f"a static cache: expected keys up to the current position ({q_offset + q_length}), "
                                  f"got {kv_length} key slots; use a dynamic cache (the default of generate())")
    return _flash_attention_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                                 mask_function=mask_function, attention_mask=attention_mask, **kwargs)


def _sees(mask_function, q_idx, kv_idx):
    """Whether the model's mask lets query position q_idx see key position kv_idx (batch 0,
    head 0); True where the function cannot be read that way."""
    try:
        return bool(mask_function(0, 0, q_idx, kv_idx))
    except Exception:  # a mask function that only takes tensors: no verdict
        return True


def _flash_attention_mask(*args, **kwargs):
    from transformers.masking_utils import flash_attention_mask

    return flash_attention_mask(*args, **kwargs)


def register(name=NAME):
    """Registers the attention and its mask function (padding_mask) under `name`
    (transformers' AttentionInterface and mask interface) and returns the name."""
    import transformers

    try:
        from transformers import masking_utils
    except ImportError:
        masking_utils = None
    if not hasattr(masking_utils, "flash_attention_mask") or not hasattr(transformers, "AttentionInterface"):
        raise ImportError(f"transformers: expected a release with AttentionInterface and "
                          f"masking_utils.flash_attention_mask, got {transformers.__version__}")
    transformers.AttentionInterface.register(name, attention_forward)
    masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.register(name, padding_mask)
    return name
