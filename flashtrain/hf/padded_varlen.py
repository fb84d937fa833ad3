"""A padded batch as varlen sequences with static shapes: no nonzero(), no .item(), so a compiled
graph takes a padding mask whole (transformers' unpad reads the mask's values to size its
tensors: one graph break per layer) and nothing waits for the device.

Each row's tokens are reordered real-first (a stable sort keeps their order, so causal and
windowed attention among the real tokens are unchanged) and split into sequences of the varlen
op, per row:
- (real queries, real keys), (padded queries, no key), (no query, padded keys): the padded
  queries see no key and come out 0, as after transformers' unpad -> pad, and no work is spent
  on padding. The queries are the last query_length positions of the mask (decoding against a
  cache), as transformers' own unpad assumes;
- with padded_queries_attend (bidirectional layers without a window): (every query in place,
  real keys), (no query, padded keys): a padded query attends the real keys, which is what eager
  computes for it (its additive mask hides the padded keys from every query row alike). The
  varlen op places a window from each sequence's end, so queries in place against packed keys
  would see it shifted by the row's padding: windowed layers take the first layout.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> out: the varlen call,
# q/k/v (B, T, H, D) in their new order, out (B, Tq, Hq, D) in that order
VarlenRun = Callable[..., torch.Tensor]


def _real_first(real: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> int64 (B, T): each row's positions, its real tokens first, each group in
    its original order."""
    return torch.argsort((~real).to(torch.int32), dim=1, stable=True)


def _take(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return x.take_along_dim(order[:, :, None, None], dim=1)


def _prefix_sums(*lengths: torch.Tensor) -> torch.Tensor:
    """Per-row lengths of each sequence kind, (B,) each -> int32 cu_seqlens (B * kinds + 1,),
    row 0's sequences first."""
    per_row = torch.stack(lengths, dim=1).flatten()
    return F.pad(torch.cumsum(per_row, dim=0, dtype=torch.int32), (1, 0))


def padded_as_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    run: VarlenRun,
    *,
    padded_queries_attend: bool,
) -> torch.Tensor:
    """query (B, Tq, Hq, D), key / value (B, S, Hkv, D), attention_mask (B, S) with 1 / True at
    real tokens -> out (B, Tq, Hq, D)."""
    real_k = attention_mask.bool()
    # a static cache's keys run past the mask: the slots beyond it hold nothing yet
    key, value = key[:, : real_k.shape[1]], value[:, : real_k.shape[1]]
    q_len, kv_len = query.shape[1], key.shape[1]
    n_k = real_k.sum(dim=1, dtype=torch.int32)
    k_order = _real_first(real_k)
    key, value = _take(key, k_order), _take(value, k_order)
    none = torch.zeros_like(n_k)
    if padded_queries_attend:
        every_query = torch.full_like(n_k, q_len)
        cu_q = _prefix_sums(every_query, none)
        cu_k = _prefix_sums(n_k, kv_len - n_k)
        return run(query, key, value, cu_q, cu_k, q_len, kv_len)
    real_q = real_k[:, -q_len:]
    n_q = real_q.sum(dim=1, dtype=torch.int32)
    q_order = _real_first(real_q)
    cu_q = _prefix_sums(n_q, q_len - n_q, none)
    cu_k = _prefix_sums(n_k, none, kv_len - n_k)
    out = run(_take(query, q_order), key, value, cu_q, cu_k, q_len, kv_len)
    return _take(out, torch.argsort(q_order, dim=1))  # back to the rows' own order
