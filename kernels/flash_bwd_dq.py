"""Backward, dQ: a query tile (with its dO rows, lse and delta) stays on chip while the key
tiles it sees stream past, recomputing P with the forward's scores and dropout mask.

Each program owns its dQ rows, so no atomics: repeated runs are bitwise identical.
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import allowed
from flashtrain.kernels.common import load_row_stats, load_rows, store_rows
from flashtrain.kernels.dropout import dropout_keep
from flashtrain.kernels.program import head_rows, program_prologue, query_tile
from flashtrain.kernels.scores import pending_scale, tile_scores
from flashtrain.kernels.visit_plan import segment_tiles, tile_start


@triton.jit
def _dq_segment(dq, q, do, lse, delta, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
                bounds, tables, at, seg: tl.constexpr, MASKED: tl.constexpr,
                SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                PRECISION: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
                TMA: tl.constexpr):
    """Stream the key tiles of segment `seg` of the visit plan past the held query tile,
    accumulating dQ."""
    pending = pending_scale(scores, SOFTCAP, ALIBI)
    for t in range(segment_tiles(bounds, tables, at, seg, SPARSE, SPARSE_BLOCK, BLOCK_N)):
        start_n = tile_start(bounds, tables, at, seg, t, SPARSE, SPARSE_BLOCK, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_rows(k_src, start_n, MASKED, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # (BLOCK_N, BLOCK_D)
        v = load_rows(v_src, start_n, MASKED, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        capped = qk
        if SOFTCAP or ALIBI:
            qk, capped = tile_scores(qk, offs_m[:, None], offs_n[None, :], band[0], scores, SOFTCAP, ALIBI)
        p = tl.math.exp2(qk * pending - lse[:, None])
        if MASKED:
            seen = allowed(offs_m[:, None], offs_n[None, :], seqlen_k, band)
            p = tl.where(seen, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        if HAS_DROPOUT:
            seed_bh, dropout_p = dropout
            keep = dropout_keep(seed_bh, offs_m[:, None], offs_n[None, :], seqlen_k, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:  # through the cap: d(softcap * tanh(x / softcap)) / dx = 1 - tanh^2
            ds = ds * (1.0 - capped * capped)
        if MASKED:  # masked entries never contribute: not a NaN of V through dp, nor of K below
            ds = tl.where(seen, ds, 0.0)
            k = tl.where(tl.abs(k.to(tl.float32)) < float("inf"), k, 0.0).to(k.dtype)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit
def _dq_key_loop(dq, q, do, lse, delta, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
                 bounds, tables, at,
                 SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                 PRECISION: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
                 TMA: tl.constexpr):
    """Run the query tile's visit plan (flashtrain.kernels.visit_plan)."""
    for seg in tl.static_range(2):
        dq = _dq_segment(
            dq, q, do, lse, delta, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
            bounds, tables, at, seg, seg == 0,
            SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION,
            SPARSE, SPARSE_BLOCK, TMA)
    return dq


@triton.jit(do_not_specialize=["seed"])
def flash_backward_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, SEED,
    KV_PARTIAL_COUNT, KV_PARTIAL_INDEX, KV_FULL_COUNT, KV_FULL_INDEX,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_lb, stride_lh, stride_count_h, stride_index_h, stride_index_row,
    seqlen_q_fixed, seqlen_k_fixed, heads_q, window_left, window_right, softmax_scale,
    scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah, dropout_p, seed,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    SEED_IN_MEMORY: tl.constexpr, HEAVY_FIRST: tl.constexpr, TMA: tl.constexpr,
):
    pid_m, b, h, q_start, seqlen_q, k_start, seqlen_k, band = program_prologue(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_q,
        window_left, window_right, IS_VARLEN, HEAVY_FIRST)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:  # a varlen grid's tile past its sequence's end
        return
    offs_m, scores, dropout, q, k_src, v_src, bounds, at = query_tile(
        Q, K, V, ALIBI_SLOPES, SEED, seed, (b, h, q_start, seqlen_q, k_start, seqlen_k, band), m0,
        (stride_qb, stride_qm, stride_qh), (stride_kb, stride_kn, stride_kh),
        (stride_vb, stride_vn, stride_vh), (stride_count_h, stride_index_h, stride_index_row),
        heads_q, scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah, dropout_p, GROUP,
        HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, SPARSE_BLOCK, ALIBI, SEED_IN_MEMORY, TMA)
    do_src = head_rows(DO, (stride_dob, stride_dom, stride_doh), b, q_start, h, seqlen_q,
                       HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    do = load_rows(do_src, m0, True, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    stats_at = b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start
    lse, delta = load_row_stats(LSE + stats_at, DELTA + stats_at, offs_m, seqlen_q, True)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    tables = (KV_PARTIAL_COUNT, KV_PARTIAL_INDEX, KV_FULL_COUNT, KV_FULL_INDEX)
    dq = _dq_key_loop(dq, q, do, lse, delta, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
                      bounds, tables, at, SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N,
                      PRECISION, SPARSE, SPARSE_BLOCK, TMA)
    dq_src = head_rows(DQ, (stride_dqb, stride_dqm, stride_dqh), b, q_start, h, seqlen_q,
                       HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    store_rows(dq_src, m0, dq * softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
