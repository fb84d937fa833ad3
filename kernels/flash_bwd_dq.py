"""Backward, dQ: a query tile (with its dO rows, lse and delta) stays on chip while the key
tiles it sees stream past, recomputing P with the forward's scores and dropout mask.

Each program owns its dQ rows, so no atomics: repeated runs are bitwise identical.
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import allowed, key_block_range
from flashtrain.kernels.common import load_row_stats, load_tile, locate_program, store_tile
from flashtrain.kernels.dropout import dropout_keep, head_seed
from flashtrain.kernels.scores import pending_scale, program_scores, tile_scores
from flashtrain.kernels.visit_plan import segment_entries, segment_span, table_row


@triton.jit
def _dq_tile_range(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m,
                   start, end, seqlen_k, band, scores, dropout,
                   MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                   HAS_DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Stream key tiles [start, end) past the held query tile, accumulating dQ."""
    pending = pending_scale(scores, SOFTCAP, ALIBI)
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_mask = offs_d[:, None] < HEAD_DIM  # (BLOCK_D, 1)
        if MASKED:
            kt_mask = kt_mask & (offs_n[None, :] < seqlen_k)
        # K^T and V^T tiles (BLOCK_D, BLOCK_N)
        k_t = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None], mask=kt_mask, other=0.0)
        v_t = tl.load(v_base + offs_n[None, :] * stride_vn + offs_d[:, None], mask=kt_mask, other=0.0)
        qk = tl.dot(q, k_t, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        capped = qk
        if SOFTCAP or ALIBI:
            qk, capped = tile_scores(qk, offs_m[:, None], offs_n[None, :], band[0], scores, SOFTCAP, ALIBI)
        p = tl.math.exp2(qk * pending - lse[:, None])
        if MASKED:
            p = tl.where(allowed(offs_m[:, None], offs_n[None, :], seqlen_k, band), p, 0.0)
        dp = tl.dot(do, v_t, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        if HAS_DROPOUT:
            seed_bh, dropout_p = dropout
            keep = dropout_keep(seed_bh, offs_m[:, None], offs_n[None, :], seqlen_k, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:  # through the cap: d(softcap * tanh(x / softcap)) / dx = 1 - tanh^2
            ds = ds * (1.0 - capped * capped)
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=PRECISION)
    return dq


@triton.jit
def _dq_key_loop(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m,
                 seqlen_k, band, scores, dropout, bounds, tables, at,
                 SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                 PRECISION: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr):
    """Run the query tile's visit plan (flashtrain.kernels.visit_plan)."""
    for seg in tl.static_range(3 - SPARSE):
        for entry in range(segment_entries(tables, at, seg, SPARSE)):
            start, end = segment_span(bounds, tables, at, seg, entry, SPARSE, SPARSE_BLOCK)
            dq = _dq_tile_range(
                dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m,
                start, end, seqlen_k, band, scores, dropout,
                (seg == 0) if SPARSE else (seg != 1), SOFTCAP, ALIBI, HAS_DROPOUT,
                HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
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
    SEED_IN_MEMORY: tl.constexpr, HEAVY_FIRST: tl.constexpr,
):
    pid_m, b, h, q_start, seqlen_q, k_start, seqlen_k = locate_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_q, IS_VARLEN, HEAVY_FIRST)
    h_kv = h // GROUP
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    band = (seqlen_k - seqlen_q, window_left, window_right)
    scores = program_scores(scale_log2, softcap_scale, softcap_log2, ALIBI_SLOPES, b, h,
                            stride_ab, stride_ah, ALIBI)
    dropout = (head_seed(SEED, seed, b, h, heads_q, SEED_IN_MEMORY), dropout_p)
    b64 = b.to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_row0 = q_start.to(tl.int64)
    q = load_tile(Q + b64 * stride_qb + q_row0 * stride_qm + h * stride_qh, offs_m, stride_qm,
                  seqlen_q, HEAD_DIM, BLOCK_D)  # (BLOCK_M, BLOCK_D)
    do = load_tile(DO + b64 * stride_dob + q_row0 * stride_dom + h * stride_doh, offs_m, stride_dom,
                   seqlen_q, HEAD_DIM, BLOCK_D)
    stats_at = b64 * stride_lb + h * stride_lh + q_start
    lse, delta = load_row_stats(LSE + stats_at, DELTA + stats_at, offs_m, seqlen_q, True)
    k_row0 = k_start.to(tl.int64)
    k_base = K + b64 * stride_kb + k_row0 * stride_kn + h_kv * stride_kh
    v_base = V + b64 * stride_vb + k_row0 * stride_vn + h_kv * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bounds = key_block_range(m0, seqlen_k, band, BLOCK_M, BLOCK_N)
    tables = (KV_PARTIAL_COUNT, KV_PARTIAL_INDEX, KV_FULL_COUNT, KV_FULL_INDEX)
    at = table_row(h, m0 // SPARSE_BLOCK, (stride_count_h, stride_index_h, stride_index_row))
    dq = _dq_key_loop(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m,
                      seqlen_k, band, scores, dropout, bounds, tables, at,
                      SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION,
                      SPARSE, SPARSE_BLOCK)
    store_tile(DQ + b64 * stride_dqb + q_row0 * stride_dqm + h * stride_dqh, offs_m, stride_dqm,
               seqlen_q, dq * softmax_scale, HEAD_DIM, BLOCK_D)
