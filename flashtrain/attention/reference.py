"""Plain PyTorch attention math that materialises the full score matrix.

For tests (in float64) and for debugging (`attention=reference`). Every element-level rule of the
public API lives here in its most literal form: bottom-right causal alignment, sliding windows
(a side >= seqlen_k is unbounded), soft-capping, ALiBi, block masks expanded to elements,
rows that see no key.
"""

from __future__ import annotations

import math

import torch


def fold_window(window_size: tuple[int, int], causal: bool, seqlen_k: int) -> tuple[int, int]:
    """The (left, right) window a call means, -1 = unbounded.

    A side >= seqlen_k is unbounded, as in flash-attn (so huge values never reach the kernels'
    int32 arithmetic); causal caps the right side at 0 (no key to the right of the diagonal).
    """
    left, right = (-1 if side >= seqlen_k else side for side in window_size)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def positions(sel: slice | torch.Tensor | None, length: int, device) -> torch.Tensor:
    """The int64 positions a selection of an axis of `length` names: all of it (None), a slice's
    range, or a 1-D tensor of positions as given."""
    if isinstance(sel, torch.Tensor):
        return sel.to(device)
    sel = sel or slice(0, length)
    return torch.arange(sel.start, sel.stop, device=device)


def allowed_mask(
    seqlen_q: int,
    seqlen_k: int,
    window: tuple[int, int],
    *,
    rows: slice | None = None,
    cols: slice | torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Bool (rows, cols): True where query i may attend key j; all of (seqlen_q, seqlen_k) by
    default, or only the block rows x cols (so a chunk of queries never builds the full matrix);
    cols may also be a 1-D tensor of key positions.

    window: (left, right) as fold_window returns it, -1 = unbounded, each side taken literally.
    Query i sits at position i + seqlen_k - seqlen_q of the key axis (bottom-right alignment).
    """
    i = positions(rows, seqlen_q, device)[:, None] + (seqlen_k - seqlen_q)
    j = positions(cols, seqlen_k, device)[None, :]
    keep = torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=device)
    left, right = window
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    return keep


def alibi_distance(
    seqlen_q: int,
    seqlen_k: int,
    *,
    rows: slice | None = None,
    cols: slice | torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Float32 (rows, cols): |i + seqlen_k - seqlen_q - j|, which ALiBi scales by -slope;
    cols a slice or a 1-D tensor of key positions."""
    i = positions(rows, seqlen_q, device)[:, None] + (seqlen_k - seqlen_q)
    j = positions(cols, seqlen_k, device)[None, :]
    return (i - j).abs().to(torch.float32)


def expand_block_mask(block_mask: torch.Tensor, block_size: int, seqlen_q: int, seqlen_k: int):
    """(H, nq, nk) bool block mask -> (H, seqlen_q, seqlen_k) element mask."""
    m = block_mask.repeat_interleave(block_size, dim=-2).repeat_interleave(block_size, dim=-1)
    return m[..., :seqlen_q, :seqlen_k]


def attention_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    element_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (B, Hq, Sq, Sk) in q's dtype with disallowed entries at -inf, and the bool mask of
    allowed entries (broadcast to the same shape).

    scores = q k^T * scale; softcap > 0: softcap * tanh(scores / softcap); then
    - slope[b, h] * |i + Sk - Sq - j| (alibi_slopes float32 (Hq,) or (B, Hq)); then the masks.
    """
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    window = fold_window(window_size, causal, seqlen_k)
    keep = allowed_mask(seqlen_q, seqlen_k, window, device=q.device)
    if element_mask is not None:
        # a layout's mask is built on the CPU; the inputs may be on a GPU
        keep = keep & element_mask.to(device=keep.device, dtype=torch.bool)
    keep = keep.expand(batch, heads_q, seqlen_q, seqlen_k)
    k = k.repeat_interleave(heads_q // heads_kv, dim=2)
    scores = _seen_scores(q, k, keep) * scale  # (B, H, Sq, Sk)
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.expand(batch, heads_q)[:, :, None, None]  # (B, H, 1, 1)
        distance = alibi_distance(seqlen_q, seqlen_k, device=q.device)  # (Sq, Sk), exact integers
        scores = scores - slopes.to(scores.dtype) * distance.to(scores.dtype)
    return scores.masked_fill(~keep, float("-inf")), keep


# Masked entries never contribute (docs/attention_semantics.md). A plain einsum would multiply a
# NaN or inf of K or V by 0 for the rows that cannot see it and make them NaN (in the output, or
# in q's gradient), so with such a value the (row, key) products are formed one by one with the
# key zeroed where the row cannot see it: (B, H, Sq, Sk, D) in memory, fine for test sizes.


def _zeroed_where_unseen(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x (B, Sk, H, D), keep (B, H, Sq, Sk) -> (B, H, Sq, Sk, D), 0 where keep is False."""
    return torch.where(keep[..., None], x.permute(0, 2, 1, 3)[:, :, None], 0.0)


def _seen_scores(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """q k^T (B, H, Sq, Sk) with q (B, Sq, H, D), k (B, Sk, H, D)."""
    if bool(torch.isfinite(k).all()):
        return torch.einsum("bqhd,bkhd->bhqk", q, k)
    return (q.permute(0, 2, 1, 3)[:, :, :, None] * _zeroed_where_unseen(k, keep)).sum(-1)


def _seen_values(probs: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """probs @ V (B, Sq, H, D) with probs (B, H, Sq, Sk), v (B, Sk, H, D)."""
    if bool(torch.isfinite(v).all()):
        return torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return (probs[..., None] * _zeroed_where_unseen(v, keep)).sum(-2).permute(0, 2, 1, 3)


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
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
    scores, keep = attention_scores(
        q,
        k,
        causal=causal,
        softmax_scale=softmax_scale,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        element_mask=element_mask,
    )
    lse = torch.logsumexp(scores.float() if scores.dtype != torch.float64 else scores, dim=-1)
    row_empty = ~keep.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1).masked_fill(row_empty, 0.0)
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    out = _seen_values(probs.to(v.dtype), v, keep)
    return out.to(dtype_out), lse
