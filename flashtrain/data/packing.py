"""Document boundaries inside packed LM windows, for the varlen attention kernel.

A packed window holds the end of one document, EOS, the next document, ... With these
cu_seqlens, flash_attn_varlen_func keeps attention inside each document, and position_ids
restart at 0 with every document. All computed on the host, by the data pipeline: the model
never reads them back from the device.
"""

from __future__ import annotations

import torch


def cu_seqlens_from_eos(input_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, int]:
    """Cut every row of input_ids (B, T) after each EOS token into separate sequences.

    Returns cu_seqlens int32 (num_sequences + 1,): prefix sums of the sequence lengths over the
    flattened (B * T,) tokens, rows never joined; and max_seqlen (int).
    """
    batch, length = input_ids.shape
    is_end = input_ids == eos_id  # (B, T): a sequence ends after an EOS ...
    is_end[:, -1] = True  # ... and at the end of every row
    ends = torch.nonzero(is_end.reshape(-1), as_tuple=False).flatten() + 1  # exclusive ends
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), ends]).to(torch.int32)
    max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if batch * length else 0
    return cu_seqlens, max_seqlen


def positions_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """int64 (total,): each token's position inside its sequence (0 at every cu_seqlens start)."""
    starts = cu_seqlens[:-1].to(torch.int64)
    lengths = cu_seqlens[1:].to(torch.int64) - starts
    return torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(starts, lengths)


def document_fields(input_ids: torch.Tensor, eos_id: int) -> dict:
    """What an LM batch adds for document masking: cu_seqlens int32, max_seqlen int and
    position_ids int64 (B, T) restarting after every EOS (and at every row)."""
    cu_seqlens, max_seqlen = cu_seqlens_from_eos(input_ids, eos_id)
    positions = positions_from_cu_seqlens(cu_seqlens, input_ids.numel())
    return {
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
        "position_ids": positions.view(input_ids.shape),
    }
