"""Block-sparsity patterns. Each takes the sequence length (square attention) and returns a
BlockSparseLayout; a block is `block_size` tokens on each axis. Deterministic patterns share
one mask across heads; bigbird draws its random blocks per head from `seed`."""

from __future__ import annotations

import torch

from flashtrain.attention.sparsity.layout import BlockSparseLayout


def _num_blocks(seqlen: int, block_size: int) -> int:
    if seqlen <= 0:
        raise ValueError(f"seqlen must be positive, got {seqlen}")
    return -(-seqlen // block_size)


def _grid(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query-block and key-block indices, (n, 1) and (1, n)."""
    idx = torch.arange(n)
    return idx[:, None], idx[None, :]


def _band(n: int, window_blocks: int) -> torch.Tensor:
    if window_blocks < 0:
        raise ValueError(f"window_blocks must be >= 0, got {window_blocks}")
    i, j = _grid(n)
    return (i - j).abs() <= window_blocks


def _global(n: int, num_global: int) -> torch.Tensor:
    """The first num_global query blocks see everything; every query sees the first key blocks."""
    if num_global < 0:
        raise ValueError(f"num_global must be >= 0, got {num_global}")
    i, j = _grid(n)
    return (i < num_global) | (j < num_global)


def local(seqlen: int, *, block_size: int = 128, heads: int = 1, window_blocks: int = 1):
    """A band: query block i keeps key blocks j with |i - j| <= window_blocks."""
    n = _num_blocks(seqlen, block_size)
    return BlockSparseLayout(_band(n, window_blocks)[None], block_size, f"local(w={window_blocks})")


def butterfly(
    seqlen: int,
    *,
    block_size: int = 128,
    heads: int = 1,
    diag_blocks: int = 1,
    max_stride: int | None = None,
    num_global: int = 0,
):
    """The flat butterfly of Pixelated Butterfly (Chen et al., 2021), as the FlashAttention paper
    used it: block-diagonal (blocks of diag_blocks x diag_blocks) plus every butterfly factor,
    i.e. key block j kept for query block i when i XOR j is a power of two <= max_stride
    (default: all strides, so any two blocks connect in log2(n) hops), plus num_global global
    rows and columns. Density ~ (diag_blocks + log2 n) / n."""
    n = _num_blocks(seqlen, block_size)
    if diag_blocks < 1:
        raise ValueError(f"diag_blocks must be >= 1, got {diag_blocks}")
    max_stride = n if max_stride is None else max_stride
    i, j = _grid(n)
    xor = i ^ j
    is_power_of_two = (xor > 0) & ((xor & (xor - 1)) == 0)
    mask = (i // diag_blocks == j // diag_blocks) | (is_power_of_two & (xor <= max_stride))
    mask |= _global(n, num_global)
    return BlockSparseLayout(mask[None], block_size, f"butterfly(diag={diag_blocks})")


def global_local(
    seqlen: int,
    *,
    block_size: int = 128,
    heads: int = 1,
    num_global: int = 1,
    window_blocks: int = 1,
):
    """Longformer-style: num_global global rows and columns plus a band of window_blocks."""
    n = _num_blocks(seqlen, block_size)
    mask = _band(n, window_blocks) | _global(n, num_global)
    return BlockSparseLayout(
        mask[None], block_size, f"global_local(g={num_global},w={window_blocks})"
    )


def bigbird(
    seqlen: int,
    *,
    block_size: int = 128,
    heads: int = 1,
    num_global: int = 1,
    window_blocks: int = 1,
    num_random: int = 2,
    seed: int = 0,
):
    """BigBird: global + band + num_random random key blocks per query block and head, drawn
    from seed among the blocks not already kept (the same seed gives the same layout)."""
    n = _num_blocks(seqlen, block_size)
    base = _band(n, window_blocks) | _global(n, num_global)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(heads, n, n, generator=gen).masked_fill(base, -1.0)  # never re-pick kept
    k = min(num_random, n)
    picks = scores.topk(k, dim=-1).indices if k > 0 else torch.empty(heads, n, 0, dtype=torch.long)
    mask = base.expand(heads, n, n).clone()
    fresh = scores.gather(-1, picks) >= 0  # a full row (a global one) has nothing left to draw
    mask.scatter_(-1, picks, fresh)
    mask |= base
    return BlockSparseLayout(
        mask, block_size, f"bigbird(g={num_global},w={window_blocks},r={num_random})"
    )


def strided(seqlen: int, *, block_size: int = 128, heads: int = 1, stride: int = 4):
    """Sparse Transformer's strided pattern at block level: the stride-1 local blocks plus
    every key block whose distance from the query block is a multiple of `stride`."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    n = _num_blocks(seqlen, block_size)
    i, j = _grid(n)
    mask = ((i - j).abs() < stride) | ((i - j) % stride == 0)
    return BlockSparseLayout(mask[None], block_size, f"strided(s={stride})")


def from_dense_mask(mask: torch.Tensor, *, block_size: int = 128):
    """Any bool element mask (Sq, Sk) or (H, Sq, Sk), reduced to blocks: a block is kept when
    any of its elements is. Attention with the layout then covers (at least) the mask."""
    if mask.dim() == 2:
        mask = mask[None]
    if mask.dim() != 3:
        raise ValueError(f"mask must be (Sq, Sk) or (H, Sq, Sk), got {tuple(mask.shape)}")
    h, sq, sk = mask.shape
    nq, nk = _num_blocks(sq, block_size), _num_blocks(sk, block_size)
    padded = torch.zeros(h, nq * block_size, nk * block_size, dtype=torch.bool, device=mask.device)
    padded[:, :sq, :sk] = mask.to(torch.bool)
    blocks = padded.view(h, nq, block_size, nk, block_size).any(dim=4).any(dim=2)
    return BlockSparseLayout(blocks, block_size, "from_dense_mask")


PATTERNS = {
    "butterfly": butterfly,
    "local": local,
    "global_local": global_local,
    "bigbird": bigbird,
    "strided": strided,
}
