"""Input checks for the public attention functions: every bad input is a ValueError that says
what is wrong and what is allowed, before any kernel sees it."""

from __future__ import annotations

import math
import os

import torch

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The kernels' int32 limits (offsets that can pass 2^31 are int64: batch, head, a tile's first
# row, the dropout counter). Within a tile of up to 256 rows the offsets stay int32, so the seq
# axis' stride must keep 256 rows under 2^31 elements (any contiguous tensor does: H * D < 2^23);
# positions along a sequence plus the "unbounded" window sentinel (2^30) must stay under 2^31.
MAX_ROW_STRIDE = 2**23 - 1
MAX_SEQLEN = 2**30 - 1


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, packed: bool = False) -> None:
    """q: (B, Sq, Hq, D) and k, v: (B, Sk, Hkv, D); packed (varlen): (total, H, D)."""
    rank = 3 if packed else 4
    layout = "(total, heads, head_dim)" if packed else "(batch, seqlen, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dims {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"{name} has dtype {t.dtype}; allowed: float16, bfloat16, float32 "
                "(float64 only through flashtrain.attention.reference)"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if not packed and q.shape[0] != k.shape[0]:
        raise ValueError(f"batch of q ({q.shape[0]}) and k/v ({k.shape[0]}) differ")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and k/v ({k.shape[-1]}) differ")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim={head_dim} is not supported: it must be between 1 and {MAX_HEAD_DIM}"
        )
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(
            f"heads_q={heads_q} must be a multiple of heads_kv={heads_kv} (MHA, GQA or MQA)"
        )
    check_int32_limits(q, k, v, packed=packed)


def check_split_sequence(q: torch.Tensor, k: torch.Tensor, what: str) -> None:
    """Context-parallel ops (ring, Ulysses) take this rank's tokens of one sequence for q, k, v
    alike: seqlen_q must equal seqlen_k. what: the op, for the message."""
    if q.shape[1] != k.shape[1]:
        raise ValueError(
            f"q has {q.shape[1]} tokens and k/v {k.shape[1]}: {what} takes this rank's tokens "
            "of one sequence, so seqlen_q must equal seqlen_k"
        )


def check_int32_limits(q, k, v, *, packed: bool) -> None:
    """Sizes and strides the kernels' int32 arithmetic covers (MAX_SEQLEN, MAX_ROW_STRIDE);
    reads shapes and strides only, so meta tensors are checked too."""
    seq_dim = 0 if packed else 1
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[seq_dim] > MAX_SEQLEN and not packed:
            raise ValueError(
                f"{name} has seqlen {t.shape[seq_dim]}; the kernels allow up to {MAX_SEQLEN} "
                "(2^30 - 1) tokens per sequence"
            )
        if t.stride(seq_dim) > MAX_ROW_STRIDE and t.shape[seq_dim] > 1:
            raise ValueError(
                f"{name} has a stride of {t.stride(seq_dim)} elements between tokens; the kernels "
                f"allow up to {MAX_ROW_STRIDE} (2^23 - 1: 256 rows of a tile within int32 "
                "offsets). Pass .contiguous() (any contiguous layout qualifies)"
            )


def check_scale(softmax_scale: float | None) -> None:
    if softmax_scale is not None and not (float(softmax_scale) > 0.0):
        raise ValueError(f"softmax_scale must be a positive number or None, got {softmax_scale}")


def check_dropout(dropout_p: float) -> None:
    if not (0.0 <= float(dropout_p) < 1.0):
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")


def check_softcap(softcap: float) -> None:
    if not (math.isfinite(float(softcap)) and float(softcap) >= 0.0):
        raise ValueError(f"softcap must be a finite number >= 0 (0 = off), got {softcap}")


def check_alibi_slopes(alibi_slopes, batch: int, heads_q: int, device) -> torch.Tensor | None:
    """None, or float32 (Hq,) / (B, Hq) on q's device -> contiguous float32 (B, Hq)."""
    if alibi_slopes is None:
        return None
    allowed = f"a float32 tensor of shape ({heads_q},) or ({batch}, {heads_q}) (heads_q or batch, heads_q)"
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
        got = (
            alibi_slopes.dtype
            if isinstance(alibi_slopes, torch.Tensor)
            else type(alibi_slopes).__name__
        )
        raise ValueError(f"alibi_slopes must be {allowed}, got {got}")
    if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
        raise ValueError(f"alibi_slopes must be {allowed}, got shape {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {device}")
    return alibi_slopes.expand(batch, heads_q).contiguous()


def check_window(window_size) -> tuple[int, int]:
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise ValueError(
            f"window_size must be a pair (left, right) of ints, got {window_size!r}"
        ) from None
    if left < -1 or right < -1:
        raise ValueError(
            f"window_size={window_size!r}: each side must be >= 0, or -1 for unbounded"
        )
    return left, right


def values_checked(device: torch.device) -> bool:
    """Whether checks that read tensor values run: on CPU tensors, or anywhere with
    FLASHTRAIN_CHECK_INPUTS=1 (on a GPU they cost a host sync per call); never while compiling."""
    if torch.compiler.is_compiling():
        return False
    return device.type == "cpu" or os.environ.get("FLASHTRAIN_CHECK_INPUTS", "0") == "1"


def index_table(t, name: str, device: torch.device, what: str, *, dims: int = 1) -> torch.Tensor:
    """An int32 table of `dims` dims the kernels index themselves (cu_seqlens, cache lengths,
    batch indices, block tables): checked for type, dtype, rank and device, and returned
    contiguous: the kernels read entry b at `table + b` (a row of a 2-D table likewise), so a
    strided view (`cu[::2]`) would read the entries in between. Copying a few integers costs
    nothing; refusing it would only move the copy into the user's code."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a {dims}-D int32 tensor of {what}, got {got}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    return t.contiguous()


def check_cu_seqlens(cu_q, cu_k, max_seqlen_q, max_seqlen_k, q, k):
    """Prefix sums: int32, 1-D, on q's device, same length, start at 0, non-decreasing, end at
    total, and the declared maxima cover every sequence (the kernels size their grid from them).
    Returns (cu_q, cu_k) contiguous (index_table). The value checks read the tensors, so they
    run only where values_checked says."""
    cu_q = index_table(cu_q, "cu_seqlens_q", q.device, "prefix sums")
    cu_k = index_table(cu_k, "cu_seqlens_k", q.device, "prefix sums")
    for name, cu, total, max_len in (
        ("cu_seqlens_q", cu_q, q.shape[0], max_seqlen_q),
        ("cu_seqlens_k", cu_k, k.shape[0], max_seqlen_k),
    ):
        if cu.numel() < 2:
            raise ValueError(f"{name} needs at least 2 entries (batch + 1), got {cu.numel()}")
        name_max = "max_seqlen_q" if name.endswith("q") else "max_seqlen_k"
        if int(max_len) > MAX_SEQLEN:
            raise ValueError(
                f"{name_max}={max_len} is over the kernels' {MAX_SEQLEN} (2^30 - 1) per sequence"
            )
        if not values_checked(cu.device):
            continue
        values = cu.cpu()
        if int(values[0]) != 0:
            raise ValueError(f"{name}[0] must be 0, got {int(values[0])}")
        lengths = values[1:] - values[:-1]
        if bool((lengths < 0).any()):
            raise ValueError(f"{name} must be non-decreasing, got {values.tolist()}")
        if int(values[-1]) != total:
            raise ValueError(f"{name}[-1]={int(values[-1])} must equal the packed length {total}")
        longest = int(lengths.max()) if lengths.numel() else 0
        if int(max_len) < longest:
            raise ValueError(
                f"{name_max}={max_len} is smaller than the longest sequence ({longest})"
            )
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            f"cu_seqlens_q has {cu_q.numel()} entries and cu_seqlens_k {cu_k.numel()}: one per sequence + 1"
        )
    return cu_q, cu_k


def check_block_mask(block_mask, block_size: int, q: torch.Tensor, k: torch.Tensor):
    """A bool (Hm, ceil(Sq/bs), ceil(Sk/bs)) mask or a BlockSparseLayout -> the layout."""
    from flashtrain.attention.sparsity.layout import (
        SUPPORTED_BLOCK_SIZES,
        BlockSparseLayout,
        layout_for_mask,
    )

    if isinstance(block_mask, BlockSparseLayout):
        layout = block_mask
        if block_size not in (128, layout.block_size):
            raise ValueError(
                f"block_size={block_size} but the layout was built with block_size="
                f"{layout.block_size}; pass block_size={layout.block_size} or omit it"
            )
    elif isinstance(block_mask, torch.Tensor):
        if block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(
                f"block_size={block_size} is not supported; allowed: {SUPPORTED_BLOCK_SIZES}"
            )
        if block_mask.dtype != torch.bool:
            raise ValueError(f"block_mask must be a bool tensor, got {block_mask.dtype}")
        layout = layout_for_mask(block_mask, block_size)
    else:
        raise ValueError(
            "block_mask must be a bool tensor or a flashtrain.attention.sparsity layout, got "
            f"{type(block_mask).__name__}"
        )
    heads_q, bs = q.shape[2], layout.block_size
    expected = (-(-q.shape[1] // bs), -(-k.shape[1] // bs))
    hm, nq, nk = layout.block_mask.shape
    if hm not in (1, heads_q) or (nq, nk) != expected:
        raise ValueError(
            f"block_mask has shape {(hm, nq, nk)}; for seqlen_q={q.shape[1]}, seqlen_k={k.shape[1]}, "
            f"block_size={bs} and {heads_q} query heads it must be (1 or {heads_q}, {expected[0]}, {expected[1]})"
        )
    return layout
