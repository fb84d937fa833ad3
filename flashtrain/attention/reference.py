"""Plain PyTorch attention math that materialises the full score matrix.

For tests (in float64) and for debugging (`attention=reference`). Every element-level rule of the
public API lives here in its most literal form: bottom-right causal alignment, sliding windows,
block masks expanded to elements, varlen sequences, rows that see no key.
"""

from __future__ import annotations

import math

import torch


def allowed_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Bool (seqlen_q, seqlen_k): True where query i may attend key j.

    Query i sits at position i + seqlen_k - seqlen_q of the key axis (bottom-right alignment).
    """
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    left, right = window_size
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    return keep


def expand_block_mask(block_mask: torch.Tensor, block_size: int, seqlen_q: int, seqlen_k: int):
    """(H, nq, nk) bool block mask -> (H, seqlen_q, seqlen_k) element mask."""
    m = block_mask.repeat_interleave(block_size, dim=-2).repeat_interleave(block_size, dim=-1)
    return m[..., :seqlen_q, :seqlen_k]


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    element_mask: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention by the definition. Returns (out like q, lse (B, Hq, Sq) float32/64).

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hkv, D) with Hq % Hkv == 0.
    element_mask: bool broadcastable to (B, Hq, Sq, Sk), True = may attend.
    dropout_mask: bool (B, Hq, Sq, Sk), True = kept; kept probabilities are scaled by 1/(1-p).
    Rows that see no key give out = 0 and lse = -inf.
    upcast=True computes in float32 (or float64 if the inputs are), as a reference should;
    upcast=False computes in the inputs' dtype, to measure what low precision costs.
    """
    dtype_out = q.dtype
    if upcast and q.dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    group = heads_q // heads_kv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (B, H, Sq, Sk)
    keep = allowed_mask(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=q.device)
    if element_mask is not None:
        keep = keep & element_mask.to(torch.bool)
    keep = keep.expand_as(scores)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores.float() if scores.dtype != torch.float64 else scores, dim=-1)
    row_empty = ~keep.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1).masked_fill(row_empty, 0.0)
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    return out.to(dtype_out), lse
