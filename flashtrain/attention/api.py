"""The public attention functions (see docs/interfaces.md and ../shared/DESIGN.md)."""

from __future__ import annotations

import math

import torch

from flashtrain.attention import validation
from flashtrain.attention.block_layout import BlockSparseLayout
from flashtrain.attention.ops import attention_forward


def _window(causal: bool, window_size) -> tuple[int, int]:
    """Fold causal into the window: causal means no key to the right of the diagonal."""
    left, right = validation.check_window(window_size)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _last_dim_contiguous(*tensors: torch.Tensor):
    """Kernels take any strides except along head_dim; copy only when that one is not 1."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    window_size: tuple[int, int] = (-1, -1),
    return_lse: bool = False,
):
    """Exact attention without materialising the (seqlen_q, seqlen_k) matrix.

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hkv, D), Hq % Hkv == 0 (MQA/GQA without copying K/V).
    causal with Sq != Sk is aligned bottom-right; window_size=(left, right), -1 = unbounded.
    Returns out (B, Sq, Hq, D), and with return_lse also lse (B, Hq, Sq) float32 (natural log,
    -inf for rows that see no key; lse carries no gradient).
    """
    validation.check_qkv(q, k, v)
    validation.check_scale(softmax_scale)
    validation.check_dropout(dropout_p)
    left, right = _window(causal, window_size)
    q, k, v = _last_dim_contiguous(q, k, v)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse, _ = attention_forward(
        q,
        k,
        v,
        None,
        None,
        q.shape[1],
        k.shape[1],
        float(scale),
        left,
        right,
        float(dropout_p),
        None,
        [],
        0,
    )
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    window_size: tuple[int, int] = (-1, -1),
    return_lse: bool = False,
):
    """Attention over packed sequences: q (total_q, Hq, D), k/v (total_k, Hkv, D).

    Sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1] and attends only within itself.
    Returns out (total_q, Hq, D), and with return_lse also lse (Hq, total_q) float32.
    """
    validation.check_qkv(q, k, v, packed=True)
    validation.check_scale(softmax_scale)
    validation.check_dropout(dropout_p)
    validation.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q, k)
    left, right = _window(causal, window_size)
    q, k, v = _last_dim_contiguous(q, k, v)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse, _ = attention_forward(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        int(max_seqlen_q),
        int(max_seqlen_k),
        float(scale),
        left,
        right,
        float(dropout_p),
        None,
        [],
        0,
    )
    return (out, lse) if return_lse else out


def blocksparse_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: torch.Tensor | BlockSparseLayout,
    *,
    block_size: int = 128,
    causal: bool = False,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
):
    """Attention over the kept blocks only: equal (up to rounding) to dense attention whose
    element mask is block_mask expanded to elements (and intersected with causal).

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hkv, D). block_mask: bool (Hm, ceil(Sq/bs), ceil(Sk/bs)),
    Hm 1 (shared) or Hq, or a BlockSparseLayout from flashtrain.attention.sparsity (whose
    compiled tables are cached across calls; a raw mask is compiled on every call).
    Rows whose blocks are all empty return 0 with lse -inf and pass no gradient.
    """
    validation.check_qkv(q, k, v)
    validation.check_scale(softmax_scale)
    validation.check_dropout(dropout_p)
    layout = validation.check_block_mask(block_mask, block_size, q, k)
    left, right = _window(causal, (-1, -1))
    q, k, v = _last_dim_contiguous(q, k, v)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    tables = layout.tables(seqlen_q, seqlen_k, causal, q.device)
    out, lse, _ = attention_forward(
        q,
        k,
        v,
        None,
        None,
        seqlen_q,
        seqlen_k,
        float(scale),
        left,
        right,
        float(dropout_p),
        layout.block_mask.to(q.device),
        tables.as_list(),
        layout.block_size,
    )
    return (out, lse) if return_lse else out
