"""Visit plans: the tiles a program's loop streams, in two segments, each segment one flat loop.

Every loop (forward keys, dK/dV queries, dQ keys) runs one plan of two segments, the first
element-masked, the second not:
  dense:  the band's range [lo, hi) split at full_lo and full_hi: segment 0 streams the edge
          tiles [lo, full_lo) and then [full_hi, hi) (where the band's edges and the sequence end
          need the element mask), segment 1 the middle [full_lo, full_hi) (no mask);
  sparse: the table entries: the partial blocks (masked), then the full blocks (unmasked), each
          entry one layout block [idx * SPARSE_BLOCK, (idx + 1) * SPARSE_BLOCK), i.e.
          SPARSE_BLOCK // BLOCK tiles.
Two loops rather than one per range: every loop is software-pipelined with its own buffers and
the accumulators must stay in registers across all of them; with a third loop the dK/dV kernel
ran out of registers on sm_90 (docs/kernel_compile.md). A segment is one loop over its tiles,
the sparse ones too (tile t of a sparse segment is tile t % TILES of kept block t // TILES), so
Triton's pipeliner prefetches the next tile across layout blocks as it does within one:
    for seg in tl.static_range(2):  # the segments
        for t in range(segment_tiles(bounds, tables, at, seg, SPARSE, SPARSE_BLOCK, BLOCK)):
            start = tile_start(bounds, tables, at, seg, t, SPARSE, SPARSE_BLOCK, BLOCK)
            ... stream [start, start + BLOCK), element-masked iff seg == 0
`bounds` is the (lo, full_lo, full_hi, hi) of flashtrain.kernels.band; `tables` the layout's
(PARTIAL_COUNT, PARTIAL_INDEX, FULL_COUNT, FULL_INDEX); `at` = (count offset, index offset) of
the program's row of them, from table_row.
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
def _leading_edge_tiles(bounds, BLOCK: tl.constexpr):
    """Tiles of the masked range [lo, full_lo) that segment 0 streams first."""
    lo, full_lo, full_hi, hi = bounds
    return (full_lo - lo + BLOCK - 1) // BLOCK


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
        lo, full_lo, full_hi, hi = bounds
        if seg == 0:
            n = _leading_edge_tiles(bounds, BLOCK) + (hi - full_hi + BLOCK - 1) // BLOCK
        else:
            n = (full_hi - full_lo) // BLOCK
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
        lo, full_lo, full_hi, hi = bounds
        if seg == 0:
            leading = _leading_edge_tiles(bounds, BLOCK)
            start = tl.where(t < leading, lo + t * BLOCK, full_hi + (t - leading) * BLOCK)
        else:
            start = full_lo + t * BLOCK
    return start
