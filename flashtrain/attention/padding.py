"""Between padded batches and the packed (varlen) layout."""

from __future__ import annotations

import torch


def unpad_input(x: torch.Tensor, attention_mask: torch.Tensor):
    """x (B, T, ...), attention_mask (B, T) with 1/True at real tokens.

    Returns x_packed (total, ...), indices int64 (total,) into the flattened B*T positions,
    cu_seqlens int32 (B + 1,), max_seqlen (int).
    """
    if attention_mask.shape != x.shape[:2]:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} must equal x's first two dims "
            f"{tuple(x.shape[:2])} (batch, seqlen)"
        )
    mask = attention_mask.to(torch.bool)
    seqlens = mask.sum(dim=1, dtype=torch.int32)  # (B,)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.zeros(x.shape[0] + 1, dtype=torch.int32, device=x.device)
    cu_seqlens[1:] = torch.cumsum(seqlens, dim=0, dtype=torch.int32)
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    packed = x.reshape(-1, *x.shape[2:]).index_select(0, indices)
    return packed, indices, cu_seqlens, max_seqlen


def pad_input(x_packed: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int):
    """Inverse of unpad_input: (total, ...) -> (batch, seqlen, ...) with zeros at padding."""
    out = x_packed.new_zeros(batch * seqlen, *x_packed.shape[1:])
    out = out.index_copy(0, indices, x_packed)  # out-of-place so autograd flows to x_packed
    return out.view(batch, seqlen, *x_packed.shape[1:])
