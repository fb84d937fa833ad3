"""Constants, sequence bounds and the loads/stores of a program's held tiles, shared by every
kernel, and the host-side stride helpers of the launchers.

Tensors reach the kernels as (batch, seq, head, head_dim) views with head_dim contiguous; a
packed (varlen) tensor is a batch of one whose sequences start at their cu_seqlens offsets.
"""

import math

import torch
import triton
import triton.language as tl

# @triton.jit code may read module globals only when they are tl.constexpr; the host reads .value.
LOG2E = tl.constexpr(math.log2(math.e))
LN2 = tl.constexpr(math.log(2.0))

# Stands for "no limit" on a window side: large enough that no index reaches it, small enough
# that i + diag + UNBOUNDED stays inside int32.
UNBOUNDED = 1 << 30

MAX_HEAD_DIM = 256


@triton.jit
def sequence_bounds(CU_SEQLENS, b, fixed_len, IS_VARLEN: tl.constexpr):
    """(start, length) of sequence b: from cu_seqlens when packed, else (0, fixed_len)."""
    if IS_VARLEN:
        start = tl.load(CU_SEQLENS + b)
        length = tl.load(CU_SEQLENS + b + 1) - start
    else:
        start = 0
        length = fixed_len
    return start, length


@triton.jit
def grid_position(heads, HEAVY_FIRST: tl.constexpr):
    """(tile, b, head) of this program in a grid of tile_grid. Grids are (tiles, heads, batch),
    or with HEAVY_FIRST (batch * heads, tiles) walked from the last tile: causal query tiles
    grow heavier with their index, and the GPU starts blocks in grid order, so the heaviest
    tiles of every head go first and the light ones fill the tail."""
    if HEAVY_FIRST:
        pid_bh = tl.program_id(0)
        tile = tl.num_programs(1) - 1 - tl.program_id(1)
        b = pid_bh // heads
        h = pid_bh % heads
    else:
        tile = tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2)
    return tile, b, h


@triton.jit
def queue_position(item, tiles, heads, batch, HEAVY_FIRST: tl.constexpr):
    """(tile, b, head) of work item `item` of a persistent program's queue (tiles * heads *
    batch items, each program taking every num_programs-th). HEAVY_FIRST: all heads' heaviest
    tile first, then the next heaviest (FA3's longest-processing-time-first order), so the
    programs' static shares even out; otherwise the tiles of a head together (their K/V stay
    in L2)."""
    if HEAVY_FIRST:
        per_rank = heads * batch
        tile = tiles - 1 - item // per_rank
        bh = item % per_rank
        b = bh // heads
        h = bh % heads
    else:
        tile = item % tiles
        bh = item // tiles
        h = bh % heads
        b = bh // heads
    return tile, b, h


@triton.jit
def locate_program(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads,
                   IS_VARLEN: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    """Where this program works: (tile, b, head, q_start, seqlen_q, k_start, seqlen_k), its
    place in the grid from grid_position."""
    tile, b, h = grid_position(heads, HEAVY_FIRST)
    q_start, seqlen_q, k_start, seqlen_k = pair_bounds(
        CU_SEQLENS_Q, CU_SEQLENS_K, b, seqlen_q_fixed, seqlen_k_fixed, IS_VARLEN)
    # the head stays int32 (scores, seeds, tables); offsets cast it to int64 where they form
    return tile, b, h, q_start, seqlen_q, k_start, seqlen_k


@triton.jit
def pair_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, b, seqlen_q_fixed, seqlen_k_fixed,
                IS_VARLEN: tl.constexpr):
    """(q_start, seqlen_q, k_start, seqlen_k) of sequence b's queries and keys."""
    q_start, seqlen_q = sequence_bounds(CU_SEQLENS_Q, b, seqlen_q_fixed, IS_VARLEN)
    k_start, seqlen_k = sequence_bounds(CU_SEQLENS_K, b, seqlen_k_fixed, IS_VARLEN)
    return q_start, seqlen_q, k_start, seqlen_k


def heavy_first(window_left: int, window_right: int) -> bool:
    """Causal-like bands (unbounded left, bounded right): later query tiles see more keys."""
    return window_left >= UNBOUNDED and window_right < UNBOUNDED


GRID_X_MAX, GRID_YZ_MAX = 2**31 - 1, 65_535  # CUDA's limits on a launch grid's axes


def check_grid(grid: tuple[int, ...], what: str) -> tuple[int, ...]:
    """`grid`, or a ValueError naming the axis past CUDA's limits (a launch would fail with an
    opaque 'invalid argument'); `what` names each axis for the message."""
    limits = (GRID_X_MAX, GRID_YZ_MAX, GRID_YZ_MAX)
    for axis, (size, limit) in enumerate(zip(grid, limits)):
        if size > limit:
            raise ValueError(
                f"this call needs a launch grid of {grid} ({what}); axis {'xyz'[axis]} = "
                f"{size:,} is past CUDA's limit of {limit:,}: split the call (fewer sequences "
                "or heads per call, or shorter sequences)"
            )
    return grid


def tile_grid(tiles: int, batch: int, heads: int, heavy: bool) -> tuple[int, int, int]:
    """The launch grid locate_program expects (HEAVY_FIRST=heavy). (tiles, heads, batch) starts
    blocks in the order (tiles, batch * heads) would, tiles of a head together (their K/V stay
    in L2), but keeps every axis under 65,536 until a call has that many sequences or heads: a
    packed batch of many short documents passed it on the y axis before."""
    if heavy:
        return check_grid((batch * heads, tiles, 1), "batch x heads, tiles")
    return check_grid((tiles, heads, batch), "tiles, heads, batch or sequences")


@triton.jit
def rows_source(base, stride_row, n_rows, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """An (n_rows, HEAD_DIM) matrix (rows stride_row apart, head_dim contiguous) read or written
    BLOCK_R rows at a time: (handle, stride_row, n_rows), the handle a tensor descriptor when TMA
    (Hopper's bulk copies; the hardware zero-fills reads and drops writes outside the matrix)
    or the base pointer (masked loads). The launcher decides TMA (flashtrain.kernels.tma)."""
    if TMA:
        # a descriptor's dimensions must be >= 1; an empty sequence's loop issues no load anyway
        handle = tl.make_tensor_descriptor(base, shape=[tl.maximum(n_rows, 1), HEAD_DIM],
                                           strides=[stride_row, 1], block_shape=[BLOCK_R, BLOCK_D])
    else:
        handle = base
    return handle, stride_row, n_rows


@triton.jit
def tile_pointers(base, start, stride_row, BLOCK_R: tl.constexpr, cols):
    """Pointers (BLOCK_R, BLOCK_D) to rows [start, start + BLOCK_R) of a rows_source: the
    tile's first row in int64 (start * stride_row passes 2^31 in a long sequence), the offsets
    within the tile in int32 (BLOCK_R * stride_row < 2^31: the API's MAX_ROW_STRIDE)."""
    first = base + start.to(tl.int64) * stride_row
    return first + tl.arange(0, BLOCK_R)[:, None] * stride_row + cols[None, :]


@triton.jit
def load_rows(src, start, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + BLOCK_R) of a rows_source as a (BLOCK_R, BLOCK_D) tile, zero past
    n_rows and HEAD_DIM. MASKED=False promises every row exists (the unmasked middle of a visit
    plan): no row mask. When HEAD_DIM is a power of two (= BLOCK_D, "even d") no column mask
    is evaluated either, so those loads are plain vector loads."""
    handle, stride_row, n_rows = src
    if TMA:
        tile = handle.load([start, 0])
    else:
        rows = start + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_D)
        ptrs = tile_pointers(handle, start, stride_row, BLOCK_R, cols)
        EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
        if MASKED:
            if EVEN_D:
                tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
            else:
                mask = (rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM)
                tile = tl.load(ptrs, mask=mask, other=0.0)
        elif EVEN_D:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=cols[None, :] < HEAD_DIM, other=0.0)
    return tile


@triton.jit
def store_rows(src, start, tile, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
               BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """Store a float32 (BLOCK_R, BLOCK_D) tile into rows [start, start + BLOCK_R) of a
    rows_source, in its dtype; rows past n_rows and columns past HEAD_DIM are not written."""
    handle, stride_row, n_rows = src
    if TMA:
        handle.store([start, 0], tile.to(handle.dtype))
    else:
        rows = start + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_D)
        mask = rows[:, None] < n_rows
        if HEAD_DIM != BLOCK_D:
            mask = mask & (cols[None, :] < HEAD_DIM)
        tl.store(tile_pointers(handle, start, stride_row, BLOCK_R, cols),
                 tile.to(handle.dtype.element_ty), mask=mask)


@triton.jit
def load_row_stats(lse_base, delta_base, rows, n_rows, CHECK_ROWS: tl.constexpr):
    """The backward's per-row statistics: lse in base 2 and delta = rowsum(dO * O).

    Out-of-range rows and rows that saw no key (lse = -inf) get lse = +inf, so their P is 0.
    """
    if CHECK_ROWS:
        row_ok = rows < n_rows
        lse = tl.load(lse_base + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
    else:
        lse = tl.load(lse_base + rows)
        delta = tl.load(delta_base + rows)
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    return lse, delta


def seq_strides(t4: torch.Tensor, is_varlen: bool) -> tuple[int, int, int]:
    """(batch, seq, head) strides of a (B, S, H, D) view; packed tensors have no batch stride
    (a sequence is found by its cu_seqlens offset along the seq axis)."""
    return (0 if is_varlen else t4.stride(0)), t4.stride(1), t4.stride(2)


def table_strides(count, index, shared_heads: bool) -> tuple[int, int, int]:
    """(head stride of counts, head stride of indices, row stride of indices) of a block-sparse
    table pair; a mask shared across heads is read at head 0 by every head."""
    if shared_heads:
        return 0, 0, index.stride(1)
    return count.stride(0), index.stride(0), index.stride(1)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs follow torch.backends.cuda.matmul.allow_tf32 (as torch's own matmuls do):
    TF32 tensor cores when allowed, exact fp32 products otherwise (torch's default); fp16/bf16
    use the tensor cores either way (the argument only matters for fp32 operands)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"
