"""The program prologue shared by the attention kernels (forward, dK/dV, dQ): where a program
works, its band, the score and dropout parameters of a query head, and the (seq, head_dim)
matrices it reads and writes.

    tile, b, h, q_start, seqlen_q, k_start, seqlen_k, band = program_prologue(...)
    scores, dropout = head_features(..., b, h, ...)      # per query head
    q_src = head_rows(Q, (stride_qb, stride_qm, stride_qh), b, q_start, h, seqlen_q, ...)
"""

import triton
import triton.language as tl

from flashtrain.kernels.common import locate_program, rows_source
from flashtrain.kernels.dropout import head_seed
from flashtrain.kernels.scores import program_scores


@triton.jit
def program_prologue(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads,
                     window_left, window_right, IS_VARLEN: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    """(tile, b, head, q_start, seqlen_q, k_start, seqlen_k, band) of this program: its place in
    the grid (flashtrain.kernels.common.locate_program; `heads` the heads the grid spans), its
    sequences' bounds and the causal/window band (diag, left, right) of flashtrain.kernels.band."""
    tile, b, h, q_start, seqlen_q, k_start, seqlen_k = locate_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads, IS_VARLEN, HEAVY_FIRST)
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
