"""Backward, dK and dV: a key tile (and its V rows) stays on chip while the query tiles that see
it stream past, for every query head that shares the kv head (GQA without atomics on dK/dV), or
with SPLIT_GROUP for one query head, whose share of dK/dV the launcher sums over the group.
With ATOMIC_DQ (flash_backward(deterministic=False)) the same pass also adds dS K into a float32
dQ accumulator with atomics, as FlashAttention-2/3 do: no separate dQ kernel recomputing P.

Tiles are transposed (keys along rows, queries along columns) so dK and dV accumulate as
(BLOCK_N, BLOCK_D) without a transpose of P. P is recomputed from Q, K and the saved lse with
the forward's scores (flashtrain.kernels.scores) and dropout mask (flashtrain.kernels.dropout).
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import allowed, query_block_range
from flashtrain.kernels.common import load_row_stats, load_rows, store_rows
from flashtrain.kernels.dropout import dropout_keep
from flashtrain.kernels.program import head_features, head_rows, program_prologue
from flashtrain.kernels.scores import pending_scale, tile_scores
from flashtrain.kernels.visit_plan import segment_tiles, table_row, tile_start


@triton.jit
def _add_dq(dq_src, start_m, dq_part_t, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, DQ_TMA: tl.constexpr):
    """dQ rows [start_m, start_m + BLOCK_M) += dq_part_t^T in the float32 accumulator (a
    rows_source). DQ_TMA: one bulk reduce-add through the descriptor (the copy engine adds
    the tile; rows past the sequence are dropped), no per-element addresses in registers;
    else fp32 atomics per element, masked to the rows and head dims that exist."""
    handle, stride_dqm, seqlen_q = dq_src
    if DQ_TMA:
        handle.atomic_add([start_m, 0], tl.trans(dq_part_t))
    else:
        rows = tl.arange(0, BLOCK_M)
        offs_m = start_m + rows
        offs_d = tl.arange(0, BLOCK_D)
        # the tile's first row in int64 (start_m * stride passes 2^31 in a long sequence)
        first = handle + start_m.to(tl.int64) * stride_dqm
        dq_ptrs = first + rows[None, :] * stride_dqm + offs_d[:, None]
        if MASKED:  # the rows and head dims of this query tile that exist
            dq_mask = (offs_m[None, :] < seqlen_q) & (offs_d[:, None] < HEAD_DIM)
            tl.atomic_add(dq_ptrs, dq_part_t, mask=dq_mask, sem="relaxed")
        elif HEAD_DIM == BLOCK_D:
            tl.atomic_add(dq_ptrs, dq_part_t, sem="relaxed")
        else:
            tl.atomic_add(dq_ptrs, dq_part_t, mask=offs_d[:, None] < HEAD_DIM, sem="relaxed")


@triton.jit
def _dkdv_segment(dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_acc, offs_n,
                  seqlen_q, seqlen_k, band, scores, dropout, bounds, tables, at,
                  seg: tl.constexpr, MASKED: tl.constexpr, SOFTCAP: tl.constexpr,
                  ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr,
                  SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr, TMA: tl.constexpr,
                  ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr):
    """Stream the query tiles of segment `seg` of the visit plan past the held key tile,
    accumulating dK and dV; with ATOMIC_DQ also dQ += dS K into the fp32 accumulator dq_acc
    (a rows_source)."""
    pending = pending_scale(scores, SOFTCAP, ALIBI)
    for t in range(segment_tiles(bounds, tables, at, seg, SPARSE, SPARSE_BLOCK, BLOCK_M)):
        start_m = tile_start(bounds, tables, at, seg, t, SPARSE, SPARSE_BLOCK, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_rows(q_src, start_m, MASKED, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)  # (BLOCK_M, BLOCK_D)
        do = load_rows(do_src, start_m, MASKED, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
        lse, delta = load_row_stats(lse_base, delta_base, offs_m, seqlen_q, MASKED)
        qk_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
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
        if MASKED:  # masked entries never contribute (a NaN of V through dp_t); p_t is 0 there,
            # and testing it keeps no (BLOCK_N, BLOCK_M) mask live across the dp_t product
            ds_t = tl.where(p_t == 0.0, 0.0, ds_t)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
        if ATOMIC_DQ:  # 5 matmuls per tile instead of the dQ kernel's recomputation (7 in all)
            # Transposed, dQ^T = K^T dS^T: the held K tile is the A operand (from shared memory)
            # with BLOCK_D >= 64 rows, so the product runs on wgmma whatever the query tile's
            # height (dS K would have BLOCK_M rows: mma.sync below 64, and K in registers).
            k_dq = k
            if MASKED:  # nor a NaN of K a query row cannot see, as 0 * NaN in its dQ
                k_dq = tl.where(tl.abs(k.to(tl.float32)) < float("inf"), k, 0.0).to(k.dtype)
            dq_part_t = tl.dot(tl.trans(k_dq), ds_t.to(k.dtype), input_precision=PRECISION)  # (BLOCK_D, BLOCK_M)
            _add_dq(dq_acc, start_m, dq_part_t, MASKED, HEAD_DIM, BLOCK_M, BLOCK_D, DQ_TMA)
    return dk, dv


@triton.jit
def _dkdv_query_loop(dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_acc, offs_n,
                     seqlen_q, seqlen_k, band, scores, dropout, bounds, tables, at,
                     SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     PRECISION: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
                     TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr):
    """Run the key tile's visit plan for one query head (flashtrain.kernels.visit_plan)."""
    for seg in tl.static_range(2):
        dk, dv = _dkdv_segment(
            dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_acc, offs_n,
            seqlen_q, seqlen_k, band, scores, dropout, bounds, tables, at,
            seg, seg == 0, SOFTCAP, ALIBI, HAS_DROPOUT,
            HEAD_DIM, BLOCK_D, BLOCK_M, PRECISION, SPARSE, SPARSE_BLOCK, TMA, ATOMIC_DQ, DQ_TMA)
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
    SEED_IN_MEMORY: tl.constexpr, ATOMIC_DQ: tl.constexpr, TMA: tl.constexpr,
    DQ_TMA: tl.constexpr, SPLIT_GROUP: tl.constexpr,
):
    # SPLIT_GROUP: one program per query head, writing that head's share of dK/dV (DK and DV
    # then have heads_q heads; the launcher sums each group). Else one program per kv head,
    # looping over the group's query heads.
    HEADS: tl.constexpr = 1 if SPLIT_GROUP else GROUP
    pid_n, b, head, q_start, seqlen_q, k_start, seqlen_k, band = program_prologue(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_kv * (GROUP // HEADS),
        window_left, window_right, IS_VARLEN, False)
    h_kv = head // (GROUP // HEADS)  # the kv head this program reads
    first_h = head * HEADS  # its first query head
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k_src = head_rows(K, (stride_kb, stride_kn, stride_kh), b, k_start, h_kv, seqlen_k,
                      HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    v_src = head_rows(V, (stride_vb, stride_vn, stride_vh), b, k_start, h_kv, seqlen_k,
                      HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    k = load_rows(k_src, n0, True, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # (BLOCK_N, BLOCK_D)
    v = load_rows(v_src, n0, True, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    heads_q = heads_kv * GROUP
    # Dense: the band's query range; sparse: the query blocks of the key tile's layout block.
    bounds = query_block_range(n0, seqlen_q, seqlen_k, band, BLOCK_M, BLOCK_N)
    tables = (Q_PARTIAL_COUNT, Q_PARTIAL_INDEX, Q_FULL_COUNT, Q_FULL_INDEX)
    table_strides = (stride_count_h, stride_index_h, stride_index_row)
    for g in range(HEADS):  # the query heads this program serves, in a fixed order
        h = first_h + g
        q_src = head_rows(Q, (stride_qb, stride_qm, stride_qh), b, q_start, h, seqlen_q,
                          HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
        do_src = head_rows(DO, (stride_dob, stride_dom, stride_doh), b, q_start, h, seqlen_q,
                           HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
        stats_at = b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start
        dq_acc = head_rows(DQ_ACC, (stride_dqab, stride_dqam, stride_dqah), b, q_start, h,
                           seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D, DQ_TMA)
        scores, dropout = head_features(ALIBI_SLOPES, SEED, seed, b, h, heads_q, scale_log2,
                                        softcap_scale, softcap_log2, stride_ab, stride_ah,
                                        dropout_p, ALIBI, SEED_IN_MEMORY)
        at = table_row(h, n0 // SPARSE_BLOCK, table_strides)
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_src, do_src, LSE + stats_at, DELTA + stats_at, dq_acc, offs_n,
            seqlen_q, seqlen_k, band, scores, dropout, bounds, tables, at,
            SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_M, PRECISION,
            SPARSE, SPARSE_BLOCK, TMA, ATOMIC_DQ, DQ_TMA)
    dk_src = head_rows(DK, (stride_dkb, stride_dkn, stride_dkh), b, k_start, head, seqlen_k,
                       HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    dv_src = head_rows(DV, (stride_dvb, stride_dvn, stride_dvh), b, k_start, head, seqlen_k,
                       HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    store_rows(dk_src, n0, dk * softmax_scale, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    store_rows(dv_src, n0, dv, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
