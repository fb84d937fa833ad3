"""Visit plans: the tiles a program's loop streams, in segments, each segment one flat loop.

Every loop (forward keys, dK/dV queries, dQ keys) runs one plan:
  dense:  3 segments, each one contiguous range: [lo, full_lo) masked, [full_lo, full_hi)
          unmasked, [full_hi, hi) masked (the band's edges and the sequence end pay for the
          element mask);
  sparse: 2 segments of table entries: the partial blocks (masked), then the full blocks
          (unmasked), each entry one layout block [idx * SPARSE_BLOCK, (idx + 1) * SPARSE_BLOCK),
          i.e. SPARSE_BLOCK // BLOCK tiles.
A segment is one loop over its tiles, the sparse ones too (tile t of a sparse segment is tile
t % TILES of kept block t // TILES), so Triton's pipeliner prefetches the next tile across layout
blocks as it does within one:
    for seg in tl.static_range(3 - SPARSE):  # the segments
        for t in range(segment_tiles(bounds, tables, at, seg, SPARSE, SPARSE_BLOCK, BLOCK)):
            start = tile_start(bounds, tables, at, seg, t, SPARSE, SPARSE_BLOCK, BLOCK)
            ... stream [start, start + BLOCK), element-masked iff (seg == 0) if SPARSE else (seg != 1)
The segment count and the masked flag are constexpr expressions written in place (a
@triton.jit helper would return tensors). `bounds` is the (lo, full_lo, full_hi, hi) of
flashtrain.kernels.band; `tables` the layout's (PARTIAL_COUNT, PARTIAL_INDEX, FULL_COUNT,
FULL_INDEX); `at` = (count offset, index offset) of the program's row of them, from table_row.
"""

import triton
import triton.language as tl


@triton.jit
def table_row(h, block, strides):
    """(count offset, index offset) of head h, block `block` in a table pair with strides
    (count head, index head, index row) from flashtrain.kernels.common.table_strides."""
    stride_count_h, stride_index_h, stride_index_row = strides
    return h * stride_count_h + block, h * stride_index_h + block * stride_index_row


@triton.jit
def _dense_segment(bounds, seg: tl.constexpr):
    """[start, end) of dense segment `seg`."""
    lo, full_lo, full_hi, hi = bounds
    if seg == 0:
        start, end = lo, full_lo
    elif seg == 1:
        start, end = full_lo, full_hi
    else:
        start, end = full_hi, hi
    return start, end


@triton.jit
def segment_tiles(bounds, tables, at, seg: tl.constexpr, SPARSE: tl.constexpr,
                  SPARSE_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """How many BLOCK-row tiles segment `seg` streams."""
    if SPARSE:
        if seg == 0:
            n = tl.load(tables[0] + at[0]) * (SPARSE_BLOCK // BLOCK)
        else:
            n = tl.load(tables[2] + at[0]) * (SPARSE_BLOCK // BLOCK)
    else:
        start, end = _dense_segment(bounds, seg)
        n = (end - start + BLOCK - 1) // BLOCK
    return n


@triton.jit
def tile_start(bounds, tables, at, seg: tl.constexpr, t, SPARSE: tl.constexpr,
               SPARSE_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """First row of tile t of segment `seg`."""
    if SPARSE:
        TILES: tl.constexpr = SPARSE_BLOCK // BLOCK
        if seg == 0:
            block = tl.load(tables[1] + at[1] + t // TILES)
        else:
            block = tl.load(tables[3] + at[1] + t // TILES)
        start = block * SPARSE_BLOCK + (t % TILES) * BLOCK
    else:
        start = _dense_segment(bounds, seg)[0] + t * BLOCK
    return start
