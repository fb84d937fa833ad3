"""FlashAttention-2 backward by recomputation: P is rebuilt tile by tile from Q, K and the saved
log-sum-exp; nothing of size seqlen_q x seqlen_k is ever stored.

Three launches: delta = rowsum(dO * O); dK/dV with a key tile held per program, streaming the
query tiles of every query head that shares the kv head (GQA without atomics); dQ with a query
tile held, streaming key tiles. No atomics anywhere, so repeated runs are bitwise identical.
Block-sparse launches stream only the blocks in the layout's tables (transposed for dK/dV).
"""

import triton
import triton.language as tl

from flashtrain.kernels.common import (
    allowed,
    dot_precision,
    dropout_keep,
    key_block_range,
    query_block_range,
    seq_strides,
    sequence_bounds,
)
from flashtrain.kernels.flash_fwd import table_strides
from flashtrain.kernels.tuning import backward_config

LOG2E = 1.4426950408889634


@triton.jit
def flash_backward_preprocess(
    O, DO, DELTA, CU_SEQLENS_Q,
    stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh, stride_lb, stride_lh,
    seqlen_q_fixed, heads_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """delta = rowsum(dO * O) in float32, laid out like the lse."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    q_start, seqlen_q = sequence_bounds(CU_SEQLENS_Q, b, seqlen_q_fixed, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    row0 = q_start.to(tl.int64)
    o = tl.load(O + b64 * stride_ob + row0 * stride_om + h * stride_oh
                + offs_m[:, None] * stride_om + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b64 * stride_dob + row0 * stride_dom + h * stride_doh
                 + offs_m[:, None] * stride_dom + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + b64 * stride_lb + h * stride_lh + q_start + offs_m, delta,
             mask=offs_m < seqlen_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                offs_n, offs_d, start, end, seqlen_q, seqlen_k, diag, window_left, window_right,
                scale_log2, dropout_p, seed,
                MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """Stream query tiles [start, end) past the held key tile, accumulating dK and dV."""
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < seqlen_q
        qt_mask = (offs_d[:, None] < HEAD_DIM) & row_ok[None, :]  # (BLOCK_D, BLOCK_M)
        q_t = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None], mask=qt_mask, other=0.0)
        do_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)  # (BLOCK_M, BLOCK_D)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], mask=do_mask, other=0.0)
        # Out-of-range rows and rows that saw no key get lse = +inf: their P is exactly 0.
        lse = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
        lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        qk_t = tl.dot(k, q_t, input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(qk_t * scale_log2 - lse[None, :])
        if MASKED:
            ok = allowed(offs_m[None, :], offs_n[:, None], seqlen_k, diag, window_left, window_right)
            p_t = tl.where(ok, p_t, 0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[None, :], offs_n[:, None], seqlen_k, dropout_p)
            inv_keep = 1.0 / (1.0 - dropout_p)
            p_drop_t = tl.where(keep, p_t * inv_keep, 0.0)
            dp_t = tl.where(keep, dp_t * inv_keep, 0.0)
        else:
            p_drop_t = p_t
        dv = tl.dot(p_drop_t.to(do.dtype), do, dv, input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def flash_backward_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_SEQLENS_Q, CU_SEQLENS_K,
    Q_PARTIAL_COUNT, Q_PARTIAL_INDEX, Q_FULL_COUNT, Q_FULL_INDEX,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
    stride_lb, stride_lh, stride_count_h, stride_index_h, stride_index_row,
    seqlen_q_fixed, seqlen_k_fixed, heads_kv, softmax_scale, scale_log2,
    window_left, window_right, dropout_p, seed,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
    SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_kv
    h_kv = pid_bh % heads_kv
    q_start, seqlen_q = sequence_bounds(CU_SEQLENS_Q, b, seqlen_q_fixed, IS_VARLEN)
    k_start, seqlen_k = sequence_bounds(CU_SEQLENS_K, b, seqlen_k_fixed, IS_VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    diag = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    k_row0 = k_start.to(tl.int64)
    k = tl.load(K + b64 * stride_kb + k_row0 * stride_kn + h_kv * stride_kh
                + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b64 * stride_vb + k_row0 * stride_vn + h_kv * stride_vh
                + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_row0 = q_start.to(tl.int64)
    heads_q = heads_kv * GROUP
    if not SPARSE:
        lo, full_lo, full_hi, hi = query_block_range(n0, seqlen_q, seqlen_k, diag, window_left,
                                                     window_right, BLOCK_M, BLOCK_N)
    for g in range(GROUP):  # every query head that reads this kv head, in a fixed order
        h = h_kv * GROUP + g
        q_base = Q + b64 * stride_qb + q_row0 * stride_qm + h * stride_qh
        do_base = DO + b64 * stride_dob + q_row0 * stride_dom + h * stride_doh
        lse_base = LSE + b64 * stride_lb + h * stride_lh + q_start
        delta_base = DELTA + b64 * stride_lb + h * stride_lh + q_start
        seed_bh = seed + b * heads_q + h
        if SPARSE:
            k_block = n0 // SPARSE_BLOCK
            count_at = h * stride_count_h + k_block
            index_at = h * stride_index_h + k_block * stride_index_row
            for t in range(tl.load(Q_PARTIAL_COUNT + count_at)):
                m_lo = tl.load(Q_PARTIAL_INDEX + index_at + t) * SPARSE_BLOCK
                dk, dv = _dkdv_tiles(
                    dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                    offs_n, offs_d, m_lo, m_lo + SPARSE_BLOCK, seqlen_q, seqlen_k, diag,
                    window_left, window_right, scale_log2, dropout_p, seed_bh,
                    True, HEAD_DIM, BLOCK_M, HAS_DROPOUT, PRECISION)
            for t in range(tl.load(Q_FULL_COUNT + count_at)):
                m_lo = tl.load(Q_FULL_INDEX + index_at + t) * SPARSE_BLOCK
                dk, dv = _dkdv_tiles(
                    dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                    offs_n, offs_d, m_lo, m_lo + SPARSE_BLOCK, seqlen_q, seqlen_k, diag,
                    window_left, window_right, scale_log2, dropout_p, seed_bh,
                    False, HEAD_DIM, BLOCK_M, HAS_DROPOUT, PRECISION)
        else:
            dk, dv = _dkdv_tiles(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                offs_n, offs_d, lo, full_lo, seqlen_q, seqlen_k, diag,
                window_left, window_right, scale_log2, dropout_p, seed_bh,
                True, HEAD_DIM, BLOCK_M, HAS_DROPOUT, PRECISION)
            dk, dv = _dkdv_tiles(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                offs_n, offs_d, full_lo, full_hi, seqlen_q, seqlen_k, diag,
                window_left, window_right, scale_log2, dropout_p, seed_bh,
                False, HEAD_DIM, BLOCK_M, HAS_DROPOUT, PRECISION)
            dk, dv = _dkdv_tiles(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                offs_n, offs_d, full_hi, hi, seqlen_q, seqlen_k, diag,
                window_left, window_right, scale_log2, dropout_p, seed_bh,
                True, HEAD_DIM, BLOCK_M, HAS_DROPOUT, PRECISION)
    dk = dk * softmax_scale
    tl.store(DK + b64 * stride_dkb + k_row0 * stride_dkn + h_kv * stride_dkh
             + offs_n[:, None] * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(DV + b64 * stride_dvb + k_row0 * stride_dvn + h_kv * stride_dvh
             + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=kv_mask)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
              start, end, seqlen_k, diag, window_left, window_right, scale_log2, dropout_p, seed,
              MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """Stream key tiles [start, end) past the held query tile, accumulating dQ."""
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_mask = (offs_d[:, None] < HEAD_DIM) & (offs_n[None, :] < seqlen_k)  # (BLOCK_D, BLOCK_N)
        k_t = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None], mask=kt_mask, other=0.0)
        v_t = tl.load(v_base + offs_n[None, :] * stride_vn + offs_d[:, None], mask=kt_mask, other=0.0)
        qk = tl.dot(q, k_t, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        p = tl.math.exp2(qk * scale_log2 - lse[:, None])
        if MASKED:
            ok = allowed(offs_m[:, None], offs_n[None, :], seqlen_k, diag, window_left, window_right)
            p = tl.where(ok, p, 0.0)
        dp = tl.dot(do, v_t, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[:, None], offs_n[None, :], seqlen_k, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=PRECISION)
    return dq


@triton.jit
def flash_backward_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_SEQLENS_Q, CU_SEQLENS_K,
    KV_PARTIAL_COUNT, KV_PARTIAL_INDEX, KV_FULL_COUNT, KV_FULL_INDEX,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_lb, stride_lh, stride_count_h, stride_index_h, stride_index_row,
    seqlen_q_fixed, seqlen_k_fixed, heads_q, softmax_scale, scale_log2,
    window_left, window_right, dropout_p, seed,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
    SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    h_kv = h // GROUP
    q_start, seqlen_q = sequence_bounds(CU_SEQLENS_Q, b, seqlen_q_fixed, IS_VARLEN)
    k_start, seqlen_k = sequence_bounds(CU_SEQLENS_K, b, seqlen_k_fixed, IS_VARLEN)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    diag = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen_q
    mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q_row0 = q_start.to(tl.int64)
    q = tl.load(Q + b64 * stride_qb + q_row0 * stride_qm + h * stride_qh
                + offs_m[:, None] * stride_qm + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b64 * stride_dob + q_row0 * stride_dom + h * stride_doh
                 + offs_m[:, None] * stride_dom + offs_d[None, :], mask=mask, other=0.0)
    lse = tl.load(LSE + b64 * stride_lb + h * stride_lh + q_start + offs_m, mask=row_ok,
                  other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = tl.load(DELTA + b64 * stride_lb + h * stride_lh + q_start + offs_m, mask=row_ok,
                    other=0.0)
    k_row0 = k_start.to(tl.int64)
    k_base = K + b64 * stride_kb + k_row0 * stride_kn + h_kv * stride_kh
    v_base = V + b64 * stride_vb + k_row0 * stride_vn + h_kv * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    seed_bh = seed + pid_bh

    if SPARSE:
        q_block = m0 // SPARSE_BLOCK
        count_at = h * stride_count_h + q_block
        index_at = h * stride_index_h + q_block * stride_index_row
        for t in range(tl.load(KV_PARTIAL_COUNT + count_at)):
            n_lo = tl.load(KV_PARTIAL_INDEX + index_at + t) * SPARSE_BLOCK
            dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m,
                           offs_d, n_lo, n_lo + SPARSE_BLOCK, seqlen_k, diag, window_left,
                           window_right, scale_log2, dropout_p, seed_bh,
                           True, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        for t in range(tl.load(KV_FULL_COUNT + count_at)):
            n_lo = tl.load(KV_FULL_INDEX + index_at + t) * SPARSE_BLOCK
            dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m,
                           offs_d, n_lo, n_lo + SPARSE_BLOCK, seqlen_k, diag, window_left,
                           window_right, scale_log2, dropout_p, seed_bh,
                           False, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
    else:
        lo, full_lo, full_hi, hi = key_block_range(m0, seqlen_k, diag, window_left, window_right,
                                                   BLOCK_M, BLOCK_N)
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                       lo, full_lo, seqlen_k, diag, window_left, window_right, scale_log2,
                       dropout_p, seed_bh, True, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                       full_lo, full_hi, seqlen_k, diag, window_left, window_right, scale_log2,
                       dropout_p, seed_bh, False, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                       full_hi, hi, seqlen_k, diag, window_left, window_right, scale_log2,
                       dropout_p, seed_bh, True, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
    dq = dq * softmax_scale
    tl.store(DQ + b64 * stride_dqb + q_row0 * stride_dqm + h * stride_dqh
             + offs_m[:, None] * stride_dqm + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=mask)


def flash_backward(dout, q, k, v, out, lse, dq, dk, dv, *, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
                   dropout_p, seed, tables=None, block_size=0):
    """Launch the backward; layouts as flashtrain.kernels.flash_fwd.flash_forward. Writes dq, dk, dv."""
    is_varlen = cu_seqlens_q is not None
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        q4, k4, v4, o4, do4, dq4, dk4, dv4 = (t.unsqueeze(0) for t in (q, k, v, out, dout, dq, dk, dv))
        stride_lb, stride_lh = 0, lse.stride(0)
    else:
        batch = q.shape[0]
        q4, k4, v4, o4, do4, dq4, dk4, dv4 = q, k, v, out, dout, dq, dk, dv
        stride_lb, stride_lh = lse.stride(0), lse.stride(1)
        cu_seqlens_q = cu_seqlens_k = lse  # unused placeholders (IS_VARLEN=False)
    heads_q, head_dim = q4.shape[2], q4.shape[3]
    heads_kv = k4.shape[2]
    cfg = backward_config(head_dim, q.dtype, q.device, block_size)
    sparse = bool(tables)
    if sparse:
        kv_tables, q_tables = tables[:4], tables[4:]
        shared = tables[0].shape[0] == 1
        kv_strides = table_strides(kv_tables[0], kv_tables[1], shared)
        q_strides = table_strides(q_tables[0], q_tables[1], shared)
    else:
        kv_tables = q_tables = [lse] * 4  # unused placeholders (SPARSE=False)
        kv_strides = q_strides = (0, 0, 0)

    delta = lse.new_empty(lse.shape)
    flash_backward_preprocess[(triton.cdiv(max_seqlen_q, cfg.block_m), batch * heads_q)](
        o4, do4, delta, cu_seqlens_q, *seq_strides(o4, is_varlen), *seq_strides(do4, is_varlen),
        stride_lb, stride_lh, max_seqlen_q, heads_q,
        HEAD_DIM=head_dim, BLOCK_D=cfg.block_d, BLOCK_M=cfg.block_m, IS_VARLEN=is_varlen,
    )
    common = dict(
        GROUP=heads_q // heads_kv, HEAD_DIM=head_dim, BLOCK_D=cfg.block_d,
        IS_VARLEN=is_varlen, HAS_DROPOUT=dropout_p > 0.0, PRECISION=dot_precision(q.dtype),
        SPARSE=sparse, SPARSE_BLOCK=block_size if sparse else 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    scale_log2 = softmax_scale * LOG2E
    flash_backward_dkdv_kernel[(triton.cdiv(max_seqlen_k, cfg.block_n), batch * heads_kv)](
        q4, k4, v4, do4, lse, delta, dk4, dv4, cu_seqlens_q, cu_seqlens_k, *q_tables,
        *seq_strides(q4, is_varlen), *seq_strides(k4, is_varlen), *seq_strides(v4, is_varlen),
        *seq_strides(do4, is_varlen), *seq_strides(dk4, is_varlen), *seq_strides(dv4, is_varlen),
        stride_lb, stride_lh, *q_strides,
        max_seqlen_q, max_seqlen_k, heads_kv, softmax_scale, scale_log2,
        window_left, window_right, dropout_p, seed,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **common,
    )
    # dQ holds a query tile of block_n rows and streams keys block_m at a time.
    flash_backward_dq_kernel[(triton.cdiv(max_seqlen_q, cfg.block_n), batch * heads_q)](
        q4, k4, v4, do4, lse, delta, dq4, cu_seqlens_q, cu_seqlens_k, *kv_tables,
        *seq_strides(q4, is_varlen), *seq_strides(k4, is_varlen), *seq_strides(v4, is_varlen),
        *seq_strides(do4, is_varlen), *seq_strides(dq4, is_varlen),
        stride_lb, stride_lh, *kv_strides,
        max_seqlen_q, max_seqlen_k, heads_q, softmax_scale, scale_log2,
        window_left, window_right, dropout_p, seed,
        BLOCK_M=cfg.block_n, BLOCK_N=cfg.block_m, **common,
    )
