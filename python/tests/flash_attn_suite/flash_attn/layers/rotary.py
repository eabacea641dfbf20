"""flash_attn.layers.rotary.apply_rotary_emb (its contract, this package's code), the suite's
reference for the rotary embedding flash_attn_with_kvcache applies."""

import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (batch, seqlen, heads, d_head) with its first 2 * cos.shape[-1] columns rotated by the
    (seqlen_ro, rotary_dim / 2) tables at positions seqlen_offsets + 0, 1, ... (an int or one
    per batch entry): column pairs (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2);
    in fp32, rounded to x's dtype. Packed inputs (cu_seqlens) are not used by the suite."""
    if cu_seqlens is not None:
        raise NotImplementedError("cu_seqlens: the suite's reference rotary takes batched inputs only")
    batch, seqlen = x.shape[:2]
    half = cos.shape[-1]
    offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1, 1).expand(batch, 1)
    positions = offsets + torch.arange(seqlen, device=x.device)
    c = cos[positions].float()[:, :, None]  # (batch, seqlen, 1, half)
    s = sin[positions].float()[:, :, None]
    r = x[..., :2 * half].float()
    if interleaved:  # each pair a complex number, turned by cos + i sin
        turned = torch.view_as_complex(r.unflatten(-1, (half, 2)).contiguous()) * torch.complex(c, s)
        r = torch.view_as_real(turned).flatten(-2)
    else:  # x cos + rotate_half(x) sin, rotate_half(x1, x2) = (-x2, x1)
        r = r * torch.cat((c, c), -1) + torch.cat((-r[..., half:], r[..., :half]), -1) * torch.cat((s, s), -1)
    out = torch.cat((r.to(x.dtype), x[..., 2 * half:]), dim=-1)
    if inplace:
        x.copy_(out)
        return x
    return out
