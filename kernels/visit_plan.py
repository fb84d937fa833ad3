"""Visit plans: the tiles a program's loop streams, as segments of tile ranges.

Every loop (forward keys, dK/dV queries, dQ keys) runs one plan:
  dense:  3 segments of one range each: [lo, full_lo) masked, [full_lo, full_hi) unmasked,
          [full_hi, hi) masked (the band's edges and the sequence end pay for the element mask);
  sparse: 2 segments of table entries: the partial blocks (masked), then the full blocks
          (unmasked), each entry one layout block [idx * SPARSE_BLOCK, (idx + 1) * SPARSE_BLOCK).
A loop is written once as
    for seg in tl.static_range(3 - SPARSE):  # the segments
        for entry in range(segment_entries(tables, at, seg, SPARSE)):
            start, end = segment_span(bounds, tables, at, seg, entry, SPARSE, SPARSE_BLOCK)
            ... stream [start, end), element-masked iff (seg == 0) if SPARSE else (seg != 1)
The dense entry loop has one iteration and compiles away. The segment count and the masked
flag are constexpr expressions written in place (a @triton.jit helper would return tensors).
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
def segment_entries(tables, at, seg: tl.constexpr, SPARSE: tl.constexpr):
    """Ranges in segment `seg`: the table's count (sparse) or 1 (dense)."""
    if SPARSE:
        if seg == 0:
            n = tl.load(tables[0] + at[0])
        else:
            n = tl.load(tables[2] + at[0])
    else:
        n = 1
    return n


@triton.jit
def segment_span(bounds, tables, at, seg: tl.constexpr, entry, SPARSE: tl.constexpr,
                 SPARSE_BLOCK: tl.constexpr):
    """[start, end) of range `entry` of segment `seg`."""
    if SPARSE:
        if seg == 0:
            block = tl.load(tables[1] + at[1] + entry)
        else:
            block = tl.load(tables[3] + at[1] + entry)
        start = block * SPARSE_BLOCK
        end = start + SPARSE_BLOCK
    else:
        lo, full_lo, full_hi, hi = bounds
        if seg == 0:
            start, end = lo, full_lo
        elif seg == 1:
            start, end = full_lo, full_hi
        else:
            start, end = full_hi, hi
    return start, end
