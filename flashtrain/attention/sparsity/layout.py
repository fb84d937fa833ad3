"""The block-sparse layout type: which (query block, key block) pairs attention computes.

A layout is a bool block mask (heads_mask, n_query_blocks, n_key_blocks) at `block_size`
granularity, heads_mask 1 (shared) or heads_q. For the kernels it is compiled, once per
(seqlen_q, seqlen_k, causal, device) and cached, into FlexAttention-style tables:

  per query block: count + indices of its kept key blocks   (forward and dQ passes)
  per key block:   count + indices of its query blocks      (dK/dV pass)

each split into *full* blocks (every element allowed: no element mask needed) and *partial*
ones (crossed by the causal diagonal or a sequence end). Blocks that causal masking empties
entirely are dropped, so the kernels never visit them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

SUPPORTED_BLOCK_SIZES = (64, 128)


@dataclass(frozen=True)
class BlockTables:
    """int32 tables, padded with 0 past each count. Shapes: counts (Hm, nq) / (Hm, nk);
    indices (Hm, nq, nk) / (Hm, nk, nq)."""

    kv_partial_count: torch.Tensor
    kv_partial_index: torch.Tensor
    kv_full_count: torch.Tensor
    kv_full_index: torch.Tensor
    q_partial_count: torch.Tensor
    q_partial_index: torch.Tensor
    q_full_count: torch.Tensor
    q_full_index: torch.Tensor

    def as_list(self) -> list[torch.Tensor]:
        return [
            self.kv_partial_count, self.kv_partial_index, self.kv_full_count, self.kv_full_index,
            self.q_partial_count, self.q_partial_index, self.q_full_count, self.q_full_index,
        ]  # fmt: skip

    def blocks_visited(self) -> int:
        """(query block, key block) pairs the forward computes, summed over mask heads."""
        return int(self.kv_partial_count.sum()) + int(self.kv_full_count.sum())


def _compact(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool (..., n) -> counts (...,) and ascending indices (..., n) of the True entries."""
    n = selected.shape[-1]
    ar = torch.arange(n, device=selected.device)
    key = torch.where(selected, ar, ar + n)  # kept entries sort first, in order
    order = key.sort(dim=-1).values
    index = torch.where(order < n, order, torch.zeros_like(order))
    return selected.sum(-1).to(torch.int32), index.to(torch.int32).contiguous()


def build_tables(block_mask, block_size, seqlen_q, seqlen_k, causal) -> BlockTables:
    """Compile a bool block mask into the kernels' tables (see the module docstring)."""
    device = block_mask.device
    nq, nk = block_mask.shape[-2:]
    diag = seqlen_k - seqlen_q
    rows_first = torch.arange(nq, device=device) * block_size
    rows_last = torch.clamp(rows_first + block_size, max=seqlen_q) - 1
    cols_first = torch.arange(nk, device=device) * block_size
    cols_last = torch.clamp(cols_first + block_size, max=seqlen_k) - 1
    visible = block_mask.to(torch.bool).clone()
    full = visible & ((rows_first + block_size) <= seqlen_q)[:, None]
    full &= ((cols_first + block_size) <= seqlen_k)[None, :]
    if causal:
        # Query row r may see keys up to r + diag: a block is visited if its last row sees its
        # first key, and full if its first row sees its last key.
        visible &= cols_first[None, :] <= rows_last[:, None] + diag
        full &= cols_last[None, :] <= rows_first[:, None] + diag
    full &= visible
    partial = visible & ~full
    kv_pc, kv_pi = _compact(partial)
    kv_fc, kv_fi = _compact(full)
    q_pc, q_pi = _compact(partial.transpose(-1, -2))
    q_fc, q_fi = _compact(full.transpose(-1, -2))
    return BlockTables(kv_pc, kv_pi, kv_fc, kv_fi, q_pc, q_pi, q_fc, q_fi)


class BlockSparseLayout:
    """A block mask plus the tables compiled from it, cached per (seqlens, causal, device).

    The layout owns a copy of the mask it is given: it is immutable once built."""

    def __init__(self, block_mask: torch.Tensor, block_size: int = 128, name: str = "custom"):
        if block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(
                f"block_size={block_size} is not supported; allowed: {SUPPORTED_BLOCK_SIZES}"
            )
        if not isinstance(block_mask, torch.Tensor) or block_mask.dim() != 3:
            raise ValueError(
                "block_mask must be a bool tensor (heads_mask, n_query_blocks, n_key_blocks), got "
                f"{tuple(block_mask.shape) if isinstance(block_mask, torch.Tensor) else type(block_mask).__name__}"
            )
        # A copy: editing the tensor it was built from must not leave the cached tables stale.
        self.block_mask = block_mask.to(torch.bool, copy=True)
        self.block_size = block_size
        self.name = name
        self._tables: dict[tuple, BlockTables] = {}

    @property
    def heads(self) -> int:
        return self.block_mask.shape[0]

    @property
    def density(self) -> float:
        """Fraction of blocks kept (before any causal masking)."""
        return float(self.block_mask.float().mean())

    def tables(self, seqlen_q: int, seqlen_k: int, causal: bool, device) -> BlockTables:
        key = (seqlen_q, seqlen_k, causal, str(device))
        if key not in self._tables:
            mask = self.block_mask.to(device)
            self._tables[key] = build_tables(mask, self.block_size, seqlen_q, seqlen_k, causal)
        return self._tables[key]

    def __repr__(self) -> str:
        h, nq, nk = self.block_mask.shape
        return (
            f"BlockSparseLayout({self.name}, heads={h}, blocks={nq}x{nk}, "
            f"block_size={self.block_size}, density={self.density:.3f})"
        )


# Raw block masks passed call after call (a model holding a mask tensor) compile once. The cache
# keys on the mask's contents, not on the tensor: a mask edited where torch cannot see it (through
# numpy after torch.from_numpy, or through .data) bumps no version counter, and a stale layout
# would be a silent wrong answer. The key holds the mask's bytes (one per block: small), so
# comparing it is exact; the least recently used entries are dropped past _CACHED_MASKS.
_CACHED_MASKS = 64
_LAYOUTS_OF_MASKS: OrderedDict[tuple, BlockSparseLayout] = OrderedDict()


def layout_for_mask(block_mask: torch.Tensor, block_size: int) -> BlockSparseLayout:
    """The layout of a raw bool block mask: on the CPU, cached by contents (its tables are then
    cached per device and sequence lengths, so repeated calls make no new tables); elsewhere a
    fresh layout per call, since reading a GPU mask's contents would cost a host sync (building
    the tables is a few small kernels on the device; a BlockSparseLayout compiles them once)."""
    if block_mask.device.type != "cpu":
        return BlockSparseLayout(block_mask, block_size)
    contents = block_mask.detach().numpy().tobytes()  # C order, whatever the strides
    key = (block_size, tuple(block_mask.shape), contents)
    layout = _LAYOUTS_OF_MASKS.get(key)
    if layout is None:
        layout = BlockSparseLayout(block_mask, block_size)
        _LAYOUTS_OF_MASKS[key] = layout
        if len(_LAYOUTS_OF_MASKS) > _CACHED_MASKS:
            _LAYOUTS_OF_MASKS.popitem(last=False)
    _LAYOUTS_OF_MASKS.move_to_end(key)
    return layout
