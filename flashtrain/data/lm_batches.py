"""Next-token LM batches cut from windows of seq_len + 1 token ids.

Shared by both LM data modules: the token-cache one (lm.py) and the streaming one
(lm_stream.py). It sits apart so that each imports these helpers from below instead of from the
other, and lm.py can pick lm_stream.py's class without an import circle.
"""

from __future__ import annotations

import numpy as np
import torch

from flashtrain.data.module import EvalBatches, eval_items
from flashtrain.data.packing import document_fields


def lm_batch(rows: np.ndarray, eos_id: int | None = None) -> dict:
    """rows (B, T + 1) token ids -> input_ids (B, T) and labels (B, T) = the next tokens; with
    eos_id (document masking), also the documents' cu_seqlens, max_seqlen and position_ids."""
    rows = torch.from_numpy(rows.astype(np.int64))
    # clones, not .contiguous(): a one-row slice is already contiguous, and input_ids and labels
    # would then share memory (an in-place edit of the labels would change the inputs)
    batch = {"input_ids": rows[:, :-1].clone(), "labels": rows[:, 1:].clone()}
    if eos_id is not None:
        batch.update(document_fields(batch["input_ids"], eos_id))
    return batch


def gather_windows(tokens: np.ndarray, starts: np.ndarray, window: int) -> np.ndarray:
    """(len(starts), window) copies of tokens[start : start + window]."""
    if len(starts) == 0:
        return np.empty((0, window), dtype=tokens.dtype)
    return np.stack([tokens[s : s + window] for s in starts.tolist()])


def fixed_windows(
    tokens,
    window: int,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    max_batches: int | None,
    check_ids=lambda rows: rows,
    eos_id: int | None = None,
) -> EvalBatches:
    """Finite, re-iterable LM batches over the disjoint windows from the start of `tokens`,
    dealt to ranks (same count each); max_batches caps the batches per rank; check_ids(rows)
    vets each batch's ids (TokenFile.check_ids); eos_id: document masking (lm_batch)."""
    if len(tokens) // window < world_size:
        raise ValueError(
            f"the validation split has {len(tokens)} tokens: too few for {world_size} rank(s) "
            f"x one window of seq_len + 1 = {window}"
        )
    mine = eval_items(len(tokens) // window, rank, world_size, "validation windows")
    return EvalBatches(
        lambda items: lm_batch(check_ids(gather_windows(tokens, items * window, window)), eos_id),
        mine,
        micro_batch_size,
        max_batches,
    )
