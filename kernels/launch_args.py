"""Host-side argument preparation shared by the forward and backward launchers: views, checks,
score parameters and block-sparse tables. No device work and no host synchronisation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashtrain.kernels.common import LOG2E, MAX_HEAD_DIM, table_strides


@dataclass(frozen=True)
class CallShapes:
    """The shapes of one call's tensors, as the kernels address them. Dense: q (B, Sq, Hq, D), lse (B, Hq, Sq). Packed
    (varlen): q (total_q, Hq, D), lse (Hq, total_q), cu_seqlens int32 (B + 1,); the kernels see
    packed tensors as a batch of one, (1, total, H, D)."""

    is_varlen: bool
    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    lse_strides: tuple[int, int]  # (batch, head) strides of lse and delta

    def views(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """(B, S, H, D) views of q-, k- or out-shaped tensors."""
        return [t.unsqueeze(0) if self.is_varlen else t for t in tensors]


def check_index_table(name: str, table: torch.Tensor) -> None:
    """The kernels read integer tables (cu_seqlens, block-sparse tables) with stride 1 along
    their last dim: a strided view would be read wrong, so it is refused (the API copies)."""
    if table.dtype != torch.int32 or (table.stride(-1) != 1 and table.numel() > 1):
        raise ValueError(
            f"{name} must be int32 with its last dim contiguous (stride 1), got {table.dtype} "
            f"shape {tuple(table.shape)} strides {table.stride()}"
        )


def call_shapes(q, k, lse, cu_seqlens_q, cu_seqlens_k, *head_dim_last) -> CallShapes:
    """Check what the kernels assume (the op layer validates user input) and describe the call.
    head_dim_last: every tensor whose head_dim the kernels address with stride 1."""
    is_varlen = cu_seqlens_q is not None
    if is_varlen != (cu_seqlens_k is not None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (varlen) or not at all")
    if is_varlen:
        check_index_table("cu_seqlens_q", cu_seqlens_q)
        check_index_table("cu_seqlens_k", cu_seqlens_k)
    head_dim = q.shape[-1]
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is not supported by the kernels: allowed 1..{MAX_HEAD_DIM}")
    for t in (q, k, *head_dim_last):
        if t.stride(-1) != 1 and t.numel() > 0:  # an empty tensor's strides address nothing
            raise ValueError(
                f"the kernels need head_dim contiguous (stride 1), got a tensor of shape "
                f"{tuple(t.shape)} with strides {t.stride()}"
            )
    if is_varlen:
        batch, lse_strides = cu_seqlens_q.numel() - 1, (0, lse.stride(0))
    else:
        batch, lse_strides = q.shape[0], (lse.stride(0), lse.stride(1))
    return CallShapes(is_varlen, batch, q.shape[-2], k.shape[-2], head_dim, lse_strides)


def score_args(softmax_scale: float, softcap: float, alibi_slopes, shapes: CallShapes, device,
               placeholder: torch.Tensor):
    """Kernel arguments: the ALIBI_SLOPES pointer, the scalars
        (scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah)
    and the constexpr flags {SOFTCAP, ALIBI}; see flashtrain.kernels.scores."""
    if not (math.isfinite(softcap) and softcap >= 0.0):
        raise ValueError(f"softcap must be a finite number >= 0 (0 = off), got {softcap}")
    scale_log2 = softmax_scale * LOG2E.value
    has_softcap = softcap > 0.0
    cap = (softmax_scale / softcap, softcap * LOG2E.value) if has_softcap else (0.0, 0.0)
    if alibi_slopes is None:
        slopes, slope_strides = placeholder, (0, 0)
    else:
        want = (shapes.batch, shapes.heads_q)
        if (
            not isinstance(alibi_slopes, torch.Tensor)
            or tuple(alibi_slopes.shape) != want
            or alibi_slopes.dtype != torch.float32
            or alibi_slopes.device != device
        ):
            got = (
                f"{alibi_slopes.dtype} {tuple(alibi_slopes.shape)} on {alibi_slopes.device}"
                if isinstance(alibi_slopes, torch.Tensor)
                else type(alibi_slopes).__name__
            )
            raise ValueError(
                f"alibi_slopes must be None or a float32 (batch, heads_q) = {want} tensor on "
                f"{device}, got {got}"
            )
        slopes, slope_strides = alibi_slopes, alibi_slopes.stride()
    flags = dict(SOFTCAP=has_softcap, ALIBI=alibi_slopes is not None)
    return slopes, (scale_log2, *cap, *slope_strides), flags


def sparse_args(tables: list[torch.Tensor] | None, placeholder: torch.Tensor):
    """Kernel arguments of one table direction (4 tensors): the tensors (PARTIAL_COUNT,
    PARTIAL_INDEX, FULL_COUNT, FULL_INDEX) and their strides (count head, index head, index
    row); placeholders for a dense call."""
    if not tables:
        return (placeholder,) * 4, (0, 0, 0)
    for name, table in zip(("partial_count", "partial_index", "full_count", "full_index"), tables):
        check_index_table(f"block-sparse table {name}", table)
    partial_count, partial_index = tables[0], tables[1]
    return tuple(tables), table_strides(partial_count, partial_index, partial_count.shape[0] == 1)


def cleaned_values(v4: torch.Tensor, batch: int, max_seqlen_k: int, cu_seqlens_k=None):
    """For the warp-specialized forward, whose loop cannot clean V itself (kernels/flash_fwd.py
    _forward_one_loop): (V with its non-finite entries zeroed, contiguous; the key-NaN table;
    its (rows, columns, row stride)). The table holds, per sequence, kv head and key, 0 or NaN
    where that key's value has a non-finite entry: added to the scores, it makes the rows that
    see the key NaN and, masked to -inf, leaves the others untouched
    (docs/attention_semantics.md). Row b * Hkv + h, column = the key's position in its sequence
    (packed sequences are spread out, so a tile's columns start at a multiple of BLOCK_N, the
    16-byte offset a descriptor load takes); the row stride is padded to 16 bytes. On device,
    no host synchronisation; costs a pass over V and a copy of it."""
    finite = torch.isfinite(v4)  # (B, Sk, Hkv, D); packed: (1, total_k, Hkv, D)
    clean = torch.where(finite, v4, torch.zeros((), dtype=v4.dtype, device=v4.device))
    nan = torch.where(finite.all(dim=-1), 0.0, float("nan"))  # (B or 1, Sk or total_k, Hkv)
    heads = nan.shape[-1]
    # one spare column past max_seqlen_k: where a packed key lies past it (max_seqlen_k too
    # small, which nothing checks without a host sync) it lands there, outside the
    # descriptor's columns, instead of faulting
    width = -(-(max_seqlen_k + 1) // 4) * 4
    table = torch.zeros(batch, heads, width, dtype=torch.float32, device=v4.device)
    if cu_seqlens_k is None:
        table[:, :, : nan.shape[1]] = nan.permute(0, 2, 1)
    else:
        keys = torch.arange(nan.shape[1], device=v4.device)
        sequence = torch.searchsorted(cu_seqlens_k[1:], keys, right=True)  # of each packed key
        position = (keys - cu_seqlens_k[sequence]).clamp_(max=width - 1)
        table[sequence, :, position] = nan[0]
    table = table.view(batch * heads, -1)
    return clean.contiguous(), table, (batch * heads, max_seqlen_k, table.stride(0))
