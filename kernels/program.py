"""The program prologue shared by the attention kernels (forward, dK/dV, dQ): where a program
works, its band, the score and dropout parameters of a query head, and the (seq, head_dim)
matrices it reads and writes.

    tile, b, h, q_start, seqlen_q, k_start, seqlen_k, band = program_prologue(...)
    scores, dropout = head_features(..., b, h, ...)      # per query head
    q_src = head_rows(Q, (stride_qb, stride_qm, stride_qh), b, q_start, h, seqlen_q, ...)

The programs over a query tile (forward, dQ) take the rest of it, their queries and their
visit plan from one call after program_prologue and their exit test: query_tile. The dK/dV
program (a key tile, looping over its query heads) composes the parts itself.
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import key_block_range
from flashtrain.kernels.common import grid_position, load_rows, pair_bounds, rows_source
from flashtrain.kernels.dropout import head_seed
from flashtrain.kernels.scores import program_scores
from flashtrain.kernels.visit_plan import table_row


@triton.jit
def program_prologue(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads,
                     window_left, window_right, IS_VARLEN: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    """(tile, b, head, q_start, seqlen_q, k_start, seqlen_k, band) of this program: its place in
    the grid (flashtrain.kernels.common.grid_position; `heads` the heads the grid spans), then
    tile_prologue."""
    tile, b, h = grid_position(heads, HEAVY_FIRST)
    return tile_prologue(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, window_left,
                         window_right, tile, b, h, IS_VARLEN)


@triton.jit
def tile_prologue(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, window_left,
                  window_right, tile, b, h, IS_VARLEN: tl.constexpr):
    """(tile, b, head, q_start, seqlen_q, k_start, seqlen_k, band) of the work at (tile, b, h):
    its sequences' bounds and the causal/window band (diag, left, right) of
    flashtrain.kernels.band. A persistent program calls it once per item of its queue."""
    q_start, seqlen_q, k_start, seqlen_k = pair_bounds(
        CU_SEQLENS_Q, CU_SEQLENS_K, b, seqlen_q_fixed, seqlen_k_fixed, IS_VARLEN)
    band = (seqlen_k - seqlen_q, window_left, window_right)
    return tile, b, h, q_start, seqlen_q, k_start, seqlen_k, band


@triton.jit
def head_features(ALIBI_SLOPES, SEED, seed, b, h, heads_q, scale_log2, softcap_scale,
                  softcap_log2, stride_ab, stride_ah, dropout_p, ALIBI: tl.constexpr,
                  SEED_IN_MEMORY: tl.constexpr):
    """(scores, dropout) of query head h of batch b: the `scores` tuple of
    flashtrain.kernels.scores and (Philox key of the head, dropout_p) of
    flashtrain.kernels.dropout."""
    scores = program_scores(scale_log2, softcap_scale, softcap_log2, ALIBI_SLOPES, b, h,
                            stride_ab, stride_ah, ALIBI)
    return scores, (head_seed(SEED, seed, b, h, heads_q, SEED_IN_MEMORY), dropout_p)


@triton.jit
def head_rows(BASE, strides, b, row0, h, n_rows, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """The rows_source of head h of sequence b: the (n_rows, HEAD_DIM) matrix at rows row0.. of
    a (batch, seq, head, head_dim) tensor with strides = (batch, seq, head) strides; offsets in
    int64 (a batch or a packed sequence can pass 2**31 elements)."""
    stride_b, stride_row, stride_h = strides
    base = (BASE + b.to(tl.int64) * stride_b + row0.to(tl.int64) * stride_row
            + h.to(tl.int64) * stride_h)  # a head-major view of a long sequence passes 2^31
    return rows_source(base, stride_row, n_rows, HEAD_DIM, BLOCK_R, BLOCK_D, TMA)


@triton.jit
def query_tile(Q, K, V, ALIBI_SLOPES, SEED, seed, place, m0, q_strides, k_strides, v_strides,
               table_strides, heads_q, scale_log2, softcap_scale, softcap_log2, stride_ab,
               stride_ah, dropout_p, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               SPARSE_BLOCK: tl.constexpr, ALIBI: tl.constexpr, SEED_IN_MEMORY: tl.constexpr,
               TMA: tl.constexpr):
    """The rest of a query-tile program's set-up (the forward, the dQ backward), once
    program_prologue has placed it and the tile is known to hold rows (m0 < seqlen_q):
    place = (b, h, q_start, seqlen_q, k_start, seqlen_k, band) from program_prologue; x_strides
    the (batch, seq, head) strides of X; table_strides (count_h, index_h, index_row).

        offs_m, scores, dropout, q, k_src, v_src, bounds, at = query_tile(...)

    offs_m: the tile's rows m0 .. m0 + BLOCK_M; scores, dropout: query head h's (head_features);
    q: the tile's queries (BLOCK_M, BLOCK_D); the rows_source of K and V (its K/V head,
    h // GROUP); the visit plan's key-block range of the band (bounds) and row of the
    block-sparse tables (at, flashtrain.kernels.visit_plan).
    The order is the compiled code's (sm_90, kernel_compile): the exit for a tile past its
    sequence's end before any of this, and q loaded before K's and V's sources are made, else
    the d128 block-sparse forward spills 8 more bytes."""
    b, h, q_start, seqlen_q, k_start, seqlen_k, band = place
    h_kv = h // GROUP
    scores, dropout = head_features(ALIBI_SLOPES, SEED, seed, b, h, heads_q, scale_log2,
                                    softcap_scale, softcap_log2, stride_ab, stride_ah, dropout_p,
                                    ALIBI, SEED_IN_MEMORY)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_src = head_rows(Q, q_strides, b, q_start, h, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    q = load_rows(q_src, m0, True, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)  # (BLOCK_M, BLOCK_D)
    k_src = head_rows(K, k_strides, b, k_start, h_kv, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    v_src = head_rows(V, v_strides, b, k_start, h_kv, seqlen_k, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    # Dense: the band's key range; sparse: the kept key blocks of the query tile's layout block.
    bounds = key_block_range(m0, seqlen_k, band, BLOCK_M, BLOCK_N)
    at = table_row(h, m0 // SPARSE_BLOCK, table_strides)
    return offs_m, scores, dropout, q, k_src, v_src, bounds, at
