"""Document boundaries inside packed LM windows, for the varlen attention kernel.

A packed window holds the end of one document, EOS, the next document, ... With these
cu_seqlens, flash_attn_varlen_func keeps attention inside each document.
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
