"""flash-attn's packed forms: q, k, v (or k, v) stacked in one tensor, as a fused projection
gives them. Each is flash_attn_func / flash_attn_varlen_func on views of the packed tensor (no
copy); the gradient reaches the packed tensor through those views.
"""

from __future__ import annotations

import torch

from flashtrain.attention.api import flash_attn_func, flash_attn_varlen_func


def _unstack(packed: torch.Tensor, name: str, count: int, layout: str):
    """Split dim -3 of `packed` into `count` views after checking the layout."""
    rank = len(layout.split(","))
    if not isinstance(packed, torch.Tensor) or packed.dim() != rank or packed.shape[-3] != count:
        got = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"{name} must have shape ({layout}) with {count} at dim -3, got {got}")
    return packed.unbind(-3)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
):
    """qkv: (B, S, 3, H, D). Options and returns as flash_attn_func."""
    options = locals()  # first statement: the parameters alone, by name
    q, k, v = _unstack(options.pop("qkv"), "qkv", 3, "batch, seqlen, 3, heads, head_dim")
    return flash_attn_func(q, k, v, **options)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
):
    """q: (B, Sq, Hq, D), kv: (B, Sk, 2, Hkv, D). Options and returns as flash_attn_func."""
    options = locals()  # first statement: the parameters alone, by name
    k, v = _unstack(options.pop("kv"), "kv", 2, "batch, seqlen_k, 2, heads_kv, head_dim")
    return flash_attn_func(k=k, v=v, **options)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
):
    """qkv: (total, 3, H, D) with cu_seqlens for queries and keys alike. Options and returns
    as flash_attn_varlen_func."""
    options = locals()  # first statement: the parameters alone, by name
    q, k, v = _unstack(options.pop("qkv"), "qkv", 3, "total, 3, heads, head_dim")
    cu_seqlens, max_seqlen = options.pop("cu_seqlens"), options.pop("max_seqlen")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **options
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
):
    """q: (total_q, Hq, D), kv: (total_k, 2, Hkv, D). Options and returns as
    flash_attn_varlen_func."""
    options = locals()  # first statement: the parameters alone, by name
    k, v = _unstack(options.pop("kv"), "kv", 2, "total_k, 2, heads_kv, head_dim")
    return flash_attn_varlen_func(k=k, v=v, **options)
