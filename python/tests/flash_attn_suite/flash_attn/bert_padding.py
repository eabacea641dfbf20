"""flash_attn.bert_padding's unpad_input and pad_input (their contracts, this package's code): the
suite uses them to build packed (varlen) inputs from padding masks and to pad outputs back."""

import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...) and attention_mask (batch, seqlen; nonzero = a token;
    with unused_mask, the tokens allocated but not used count as selected too) to (the selected
    rows (total, ...), their indices in the flattened (batch * seqlen) rows, cu_seqlens (batch + 1,
    int32), the longest sequence (int), and the tokens each sequence uses (batch, int32))."""
    selected = attention_mask.bool() if unused_mask is None else (attention_mask.bool() | unused_mask.bool())
    lengths = selected.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu_seqlens[1:] = torch.cumsum(lengths, dim=0)
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:]).index_select(0, indices)
    return rows, indices, cu_seqlens, int(lengths.max().item()), attention_mask.bool().sum(dim=-1, dtype=torch.int32)


def pad_input(hidden_states, indices, batch, seqlen):
    """unpad_input's rows (total, ...) back to (batch, seqlen, ...), zeros where no row is."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out = out.index_put((indices,), hidden_states)
    return out.view(batch, seqlen, *hidden_states.shape[1:])
