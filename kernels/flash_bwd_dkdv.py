"""Backward, dK and dV: a key tile (and its V rows) stays on chip while the query tiles that see
it stream past, for every query head that shares the kv head (GQA without atomics on dK/dV).
With ATOMIC_DQ (flash_backward(deterministic=False)) the same pass also adds dS K into a float32
dQ accumulator with atomics, as FlashAttention-2/3 do: no separate dQ kernel recomputing P.

Tiles are transposed (keys along rows, queries along columns) so dK and dV accumulate as
(BLOCK_N, BLOCK_D) without a transpose of P. P is recomputed from Q, K and the saved lse with
the forward's scores (flashtrain.kernels.scores) and dropout mask (flashtrain.kernels.dropout).
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import allowed, query_block_range
from flashtrain.kernels.common import load_row_stats, load_tile, locate_program, store_tile
from flashtrain.kernels.dropout import dropout_keep, head_seed
from flashtrain.kernels.scores import pending_scale, program_scores, tile_scores
from flashtrain.kernels.visit_plan import segment_entries, segment_span, table_row


@triton.jit
def _dkdv_tile_range(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                     dq_acc, offs_n, start, end, seqlen_q, seqlen_k, band, scores, dropout,
                     MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                     HAS_DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """Stream query tiles [start, end) past the held key tile, accumulating dK and dV; with
    ATOMIC_DQ also dQ += dS K into the fp32 accumulator dq_acc = (base, row stride)."""
    pending = pending_scale(scores, SOFTCAP, ALIBI)
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qt_mask = offs_d[:, None] < HEAD_DIM  # (BLOCK_D, 1)
        do_mask = offs_d[None, :] < HEAD_DIM  # (1, BLOCK_D)
        if MASKED:
            qt_mask = qt_mask & (offs_m[None, :] < seqlen_q)
            do_mask = do_mask & (offs_m[:, None] < seqlen_q)
        # Q^T tile (BLOCK_D, BLOCK_M), dO tile (BLOCK_M, BLOCK_D)
        q_t = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None], mask=qt_mask, other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], mask=do_mask, other=0.0)
        lse, delta = load_row_stats(lse_base, delta_base, offs_m, seqlen_q, MASKED)
        qk_t = tl.dot(k, q_t, input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        capped_t = qk_t
        if SOFTCAP or ALIBI:
            qk_t, capped_t = tile_scores(qk_t, offs_m[None, :], offs_n[:, None], band[0], scores,
                                         SOFTCAP, ALIBI)
        p_t = tl.math.exp2(qk_t * pending - lse[None, :])
        if MASKED:
            p_t = tl.where(allowed(offs_m[None, :], offs_n[:, None], seqlen_k, band), p_t, 0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        if HAS_DROPOUT:
            seed_bh, dropout_p = dropout
            keep = dropout_keep(seed_bh, offs_m[None, :], offs_n[:, None], seqlen_k, dropout_p)
            inv_keep = 1.0 / (1.0 - dropout_p)
            p_drop_t = tl.where(keep, p_t * inv_keep, 0.0)
            dp_t = tl.where(keep, dp_t * inv_keep, 0.0)
        else:
            p_drop_t = p_t
        dv = tl.dot(p_drop_t.to(do.dtype), do, dv, input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:  # through the cap: d(softcap * tanh(x / softcap)) / dx = 1 - tanh^2
            ds_t = ds_t * (1.0 - capped_t * capped_t)
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=PRECISION)
        if ATOMIC_DQ:  # 5 matmuls per tile instead of the dQ kernel's recomputation (7 in all)
            dq_base, stride_dqm = dq_acc
            dq_part = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=PRECISION)  # (BLOCK_M, BLOCK_D)
            dq_mask = do_mask  # the rows and head dims of this query tile that exist
            tl.atomic_add(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :], dq_part,
                          mask=dq_mask, sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_query_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                     dq_acc, offs_n, seqlen_q, seqlen_k, band, scores, dropout, bounds, tables, at,
                     SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     PRECISION: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
                     ATOMIC_DQ: tl.constexpr):
    """Run the key tile's visit plan for one query head (flashtrain.kernels.visit_plan)."""
    for seg in tl.static_range(3 - SPARSE):
        for entry in range(segment_entries(tables, at, seg, SPARSE)):
            start, end = segment_span(bounds, tables, at, seg, entry, SPARSE, SPARSE_BLOCK)
            dk, dv = _dkdv_tile_range(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                dq_acc, offs_n, start, end, seqlen_q, seqlen_k, band, scores, dropout,
                (seg == 0) if SPARSE else (seg != 1), SOFTCAP, ALIBI, HAS_DROPOUT,
                HEAD_DIM, BLOCK_D, BLOCK_M, PRECISION, ATOMIC_DQ)
    return dk, dv


@triton.jit(do_not_specialize=["seed"])
def flash_backward_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, SEED,
    Q_PARTIAL_COUNT, Q_PARTIAL_INDEX, Q_FULL_COUNT, Q_FULL_INDEX,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
    stride_dqab, stride_dqam, stride_dqah, stride_lb, stride_lh, stride_count_h, stride_index_h, stride_index_row,
    seqlen_q_fixed, seqlen_k_fixed, heads_kv, window_left, window_right, softmax_scale,
    scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah, dropout_p, seed,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    SEED_IN_MEMORY: tl.constexpr, ATOMIC_DQ: tl.constexpr,
):
    pid_n, b, h_kv, q_start, seqlen_q, k_start, seqlen_k = locate_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_kv, IS_VARLEN, False)
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    band = (seqlen_k - seqlen_q, window_left, window_right)
    b64 = b.to(tl.int64)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k_row0 = k_start.to(tl.int64)
    k = load_tile(K + b64 * stride_kb + k_row0 * stride_kn + h_kv * stride_kh, offs_n, stride_kn,
                  seqlen_k, HEAD_DIM, BLOCK_D)  # (BLOCK_N, BLOCK_D)
    v = load_tile(V + b64 * stride_vb + k_row0 * stride_vn + h_kv * stride_vh, offs_n, stride_vn,
                  seqlen_k, HEAD_DIM, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_row0 = q_start.to(tl.int64)
    heads_q = heads_kv * GROUP
    # Dense: the band's query range; sparse: the query blocks of the key tile's layout block.
    bounds = query_block_range(n0, seqlen_q, seqlen_k, band, BLOCK_M, BLOCK_N)
    tables = (Q_PARTIAL_COUNT, Q_PARTIAL_INDEX, Q_FULL_COUNT, Q_FULL_INDEX)
    table_strides = (stride_count_h, stride_index_h, stride_index_row)
    for g in range(GROUP):  # every query head that reads this kv head, in a fixed order
        h = h_kv * GROUP + g
        q_base = Q + b64 * stride_qb + q_row0 * stride_qm + h * stride_qh
        do_base = DO + b64 * stride_dob + q_row0 * stride_dom + h * stride_doh
        lse_base = LSE + b64 * stride_lb + h * stride_lh + q_start
        delta_base = DELTA + b64 * stride_lb + h * stride_lh + q_start
        dq_acc = (DQ_ACC + b64 * stride_dqab + q_row0 * stride_dqam + h * stride_dqah, stride_dqam)
        scores = program_scores(scale_log2, softcap_scale, softcap_log2, ALIBI_SLOPES, b, h,
                                stride_ab, stride_ah, ALIBI)
        dropout = (head_seed(SEED, seed, b, h, heads_q, SEED_IN_MEMORY), dropout_p)
        at = table_row(h, n0 // SPARSE_BLOCK, table_strides)
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
            dq_acc, offs_n, seqlen_q, seqlen_k, band, scores, dropout, bounds, tables, at,
            SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_M, PRECISION,
            SPARSE, SPARSE_BLOCK, ATOMIC_DQ)
    store_tile(DK + b64 * stride_dkb + k_row0 * stride_dkn + h_kv * stride_dkh, offs_n, stride_dkn,
               seqlen_k, dk * softmax_scale, HEAD_DIM, BLOCK_D)
    store_tile(DV + b64 * stride_dvb + k_row0 * stride_dvn + h_kv * stride_dvh, offs_n, stride_dvn,
               seqlen_k, dv, HEAD_DIM, BLOCK_D)
