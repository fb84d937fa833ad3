"""The public attention functions (see docs/interfaces.md and ../shared/DESIGN.md)."""

from __future__ import annotations

import math

import torch

from flashtrain.attention import validation
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
        q, k, v, None, None, q.shape[1], k.shape[1], float(scale), left, right, float(dropout_p)
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
    )
    return (out, lse) if return_lse else out
