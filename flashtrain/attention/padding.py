"""Between padded batches and the packed (varlen) layout, with flash-attn >= 2.6's signatures
(flash_attn.bert_padding), so ported code unpacks the same five values."""

from __future__ import annotations

import torch


def _check_mask(name: str, mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if mask.shape != x.shape[:2]:
        raise ValueError(
            f"{name} shape {tuple(mask.shape)} must equal x's first two dims "
            f"{tuple(x.shape[:2])} (batch, seqlen)"
        )
    return mask.to(torch.bool)


def unpad_input(x: torch.Tensor, attention_mask: torch.Tensor, unused_mask=None):
    """x (B, T, ...), attention_mask (B, T) bool/int, 1/True at real tokens; unused_mask
    (B, T) optional: slots that are allocated but unused, packed too (as flash-attn does).

    Returns (x_packed (total, ...), indices int64 (total,) into the flattened B*T positions,
    cu_seqlens int32 (B + 1,), max_seqlen int, used_seqlens int32 (B,) = real tokens per row).
    A row with no token gives an empty sequence (cu_seqlens repeats a value).
    """
    used = _check_mask("attention_mask", attention_mask, x)
    selected = used if unused_mask is None else used | _check_mask("unused_mask", unused_mask, x)
    seqlens = selected.sum(dim=1, dtype=torch.int32)  # (B,)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.zeros(x.shape[0] + 1, dtype=torch.int32, device=x.device)
    cu_seqlens[1:] = torch.cumsum(seqlens, dim=0, dtype=torch.int32)
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    packed = x.reshape(-1, *x.shape[2:]).index_select(0, indices)
    return packed, indices, cu_seqlens, max_seqlen, used.sum(dim=1, dtype=torch.int32)


def pad_input(x_packed: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int):
    """Inverse of unpad_input: (total, ...) -> (batch, seqlen, ...) with zeros at padding."""
    out = x_packed.new_zeros(batch * seqlen, *x_packed.shape[1:])
    out = out.index_copy(0, indices, x_packed)  # out-of-place so autograd flows to x_packed
    return out.view(batch, seqlen, *x_packed.shape[1:])
