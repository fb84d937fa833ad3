"""The public attention functions (contracts in docs/interfaces.md).

flash_attn_func and flash_attn_varlen_func take flash-attn's positional order and names, so
code ported from flash_attn runs unchanged; the keyword forms work too.
"""

from __future__ import annotations

import math

import torch

from flashtrain.attention import attn_probs, validation
from flashtrain.attention.ops import AttentionArgs, attention_forward
from flashtrain.attention.reference import fold_window
from flashtrain.attention.sparsity.layout import BlockSparseLayout


def _last_dim_contiguous(*tensors: torch.Tensor):
    """Kernels take any strides except along head_dim; copy only when that one is not 1."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def _attend(
    q, k, v, *, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
    deterministic, return_attn_probs, return_lse, cu_seqlens_q=None, cu_seqlens_k=None,
    max_seqlen_q=None, max_seqlen_k=None, block_mask=None, block_size=0,
):  # fmt: skip
    """Validate, run the op once, and assemble what the public functions return:
    out; (out, lse) with return_lse; (out, lse, S_dmask) with return_attn_probs."""
    packed = cu_seqlens_q is not None
    validation.check_qkv(q, k, v, packed=packed)
    validation.check_scale(softmax_scale)
    validation.check_dropout(dropout_p)
    validation.check_softcap(softcap)
    if packed:
        cu_seqlens_q, cu_seqlens_k = validation.check_cu_seqlens(
            cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q, k
        )
        batch, heads_q = cu_seqlens_q.numel() - 1, q.shape[1]
        max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    else:
        batch, heads_q = q.shape[0], q.shape[2]
        max_seqlen_q, max_seqlen_k = q.shape[1], k.shape[1]
    slopes = validation.check_alibi_slopes(alibi_slopes, batch, heads_q, q.device)
    left, right = fold_window(validation.check_window(window_size), causal, max_seqlen_k)
    layout = tables = None
    if block_mask is not None:
        layout = validation.check_block_mask(block_mask, block_size, q, k)
        tables = layout.tables(max_seqlen_q, max_seqlen_k, causal, q.device).as_list()
    if return_attn_probs:
        attn_probs.check_size(batch, heads_q, max_seqlen_q, max_seqlen_k)
    q, k, v = _last_dim_contiguous(q, k, v)
    args = AttentionArgs(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=float(
            1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
        ),
        window_left=left,
        window_right=right,
        dropout_p=float(dropout_p),
        softcap=float(softcap),
        alibi_slopes=slopes,
        deterministic=bool(deterministic),
        # Only the PyTorch path (CPU) reads the mask; a copy to a GPU would cost a sync per call.
        block_mask=layout.block_mask if layout is not None and q.device.type == "cpu" else None,
        block_tables=tables or [],
        block_size=layout.block_size if layout is not None else 0,
    )
    out, lse, seed = attention_forward(*args)
    if return_attn_probs:
        mask = layout.block_mask if layout is not None else None
        return out, lse, attn_probs.attention_probs(args, seed, block_mask=mask)
    return (out, lse) if return_lse else out


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    """Exact attention without materialising the (seqlen_q, seqlen_k) matrix.

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hkv, D), Hq % Hkv == 0 (MQA/GQA without copying K/V),
    D any of 1..256; fp16, bf16 or fp32.
    dropout_p: drawn from torch's default generator of q's device (manual_seed replays it).
    softmax_scale: default 1 / sqrt(D).
    causal: with Sq != Sk aligned bottom-right (query i sees keys j <= i + Sk - Sq).
    window_size: (left, right); query i sees keys in [i + Sk - Sq - left, i + Sk - Sq + right];
        -1, or any side >= Sk, is unbounded.
    softcap: > 0 replaces each score s by softcap * tanh(s / softcap); 0 = off.
    alibi_slopes: float32 (Hq,) or (B, Hq): adds -slope * |i + Sk - Sq - j| after the softcap.
    deterministic: the backward is bitwise repeatable (no atomics).
    Returns out (B, Sq, Hq, D); with return_lse also lse (B, Hq, Sq) float32 (natural log, -inf
    for rows that see no key; lse carries no gradient); with return_attn_probs (out, lse,
    S_dmask), S_dmask (B, Hq, Sq, Sk) as flashtrain.attention.attn_probs describes (small
    sizes only).
    Masked entries never contribute: out[i], lse[i] and dq[i] depend only on the keys and values
    row i sees, so a NaN/inf in one it cannot see (causal, window) leaves it untouched; one it
    sees makes out[i] non-finite. Limits: Sq, Sk <= 2^30 - 1; the stride between tokens of q,
    k, v <= 2^23 - 1 elements (any contiguous tensor). docs/attention_semantics.md has the rules.
    """
    return _attend(**locals())  # every parameter, by its own name


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
    """Attention over packed sequences: q (total_q, Hq, D), k/v (total_k, Hkv, D).

    Sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1] and attends only within itself; options
    as flash_attn_func (window sides compared with max_seqlen_k, ALiBi and causal alignment per
    sequence; the same masking rule and limits, max_seqlen <= 2^30 - 1). Returns out (total_q,
    Hq, D), with return_lse also lse (Hq, total_q) float32, with return_attn_probs (out, lse,
    S_dmask (B, Hq, max_seqlen_q, max_seqlen_k)).
    cu_seqlens_q/k: 1-D int32 on q's device, B + 1 entries each, any stride (copied contiguous
    for the kernels): 0, non-decreasing, ending at total_q/total_k; max_seqlen_q/k at least the
    longest sequence. The values are checked on CPU tensors, and on a GPU only with
    FLASHTRAIN_CHECK_INPUTS=1 (reading them costs a host sync).
    """
    return _attend(**locals())  # every parameter, by its own name


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
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    return_lse: bool = False,
):
    """Attention over the kept blocks only: equal (up to rounding) to dense attention whose
    element mask is block_mask expanded to elements (and intersected with causal).

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hkv, D). block_mask: bool (Hm, ceil(Sq/bs), ceil(Sk/bs)),
    Hm 1 (shared) or Hq, or a BlockSparseLayout from flashtrain.attention.sparsity (whose
    compiled tables are cached across calls; it owns a copy of its mask). A raw CPU mask's tables
    are cached by its contents, so an in-place edit, even through numpy or .data, is seen; a raw
    GPU mask compiles its tables on each call (no host sync), so pass a layout there.
    Rows whose blocks are all empty return 0 with lse -inf and pass no gradient; a NaN/inf in a
    block a row's mask drops never reaches it. The other options, rules and return values are
    those of flash_attn_func.
    """
    return _attend(window_size=(-1, -1), **locals())  # every parameter, by its own name
