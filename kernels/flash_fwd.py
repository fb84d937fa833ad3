"""FlashAttention-2 forward: a Q tile stays on chip while K/V tiles stream past it.

Online softmax in base 2 (log2(e) folded into the scale), the output normalised once at the
end, and the log-sum-exp (natural log) saved per row for the backward. Key blocks outside the
causal/window band are never visited; only blocks that cross the band's edges or the end of
the sequence pay for an element mask. Block-sparse launches (SPARSE) visit only the kept key
blocks listed in the layout's tables, partial ones masked and full ones not.
"""

import triton
import triton.language as tl

from flashtrain.kernels.common import (
    allowed,
    dot_precision,
    dropout_keep,
    key_block_range,
    seq_strides,
    sequence_bounds,
)
from flashtrain.kernels.tuning import forward_config

LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


@triton.jit
def _forward_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                   start, end, seqlen_k, diag, window_left, window_right, scale_log2,
                   dropout_p, seed,
                   MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                   HAS_DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """Stream key tiles [start, end) past the query tile, updating (acc, l_i, m_i)."""
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        v_mask = offs_d[None, :] < HEAD_DIM  # (1, BLOCK_D)
        k_mask = offs_d[:, None] < HEAD_DIM  # (BLOCK_D, 1)
        if MASKED:
            v_mask = v_mask & (offs_n[:, None] < seqlen_k)
            k_mask = k_mask & (offs_n[None, :] < seqlen_k)
        # K^T tile (BLOCK_D, BLOCK_N), V tile (BLOCK_N, BLOCK_D)
        k = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None], mask=k_mask, other=0.0)
        qk = tl.dot(q, k, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N) fp32
        if MASKED:
            ok = allowed(offs_m[:, None], offs_n[None, :], seqlen_k, diag, window_left, window_right)
            qk = tl.where(ok, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * scale_log2)
        if MASKED:
            # A row with nothing allowed so far keeps m = -inf; shift by 0 to avoid inf - inf.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_shift = m_new
        p = tl.math.exp2(qk * scale_log2 - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[:, None], offs_n[None, :], seqlen_k, dropout_p)
            p = tl.where(keep, p, 0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=v_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_forward_kernel(
    Q, K, V, O, LSE, CU_SEQLENS_Q, CU_SEQLENS_K, VISITS,
    KV_PARTIAL_COUNT, KV_PARTIAL_INDEX, KV_FULL_COUNT, KV_FULL_INDEX,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh, stride_count_h, stride_index_h, stride_index_row,
    seqlen_q_fixed, seqlen_k_fixed, heads_q, scale_log2,
    window_left, window_right, dropout_p, seed,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
    SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr, COUNT_VISITS: tl.constexpr,
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
    d_ok = offs_d < HEAD_DIM
    q_base = Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qm + h * stride_qh
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    k_base = K + b64 * stride_kb + k_start.to(tl.int64) * stride_kn + h_kv * stride_kh
    v_base = V + b64 * stride_vb + k_start.to(tl.int64) * stride_vn + h_kv * stride_vh

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    seed_bh = seed + pid_bh

    if SPARSE:
        # The query tile lies inside one layout block; visit only that block's kept key blocks.
        q_block = m0 // SPARSE_BLOCK
        count_at = h * stride_count_h + q_block
        index_at = h * stride_index_h + q_block * stride_index_row
        n_partial = tl.load(KV_PARTIAL_COUNT + count_at)
        n_full = tl.load(KV_FULL_COUNT + count_at)
        for t in range(n_partial):
            n_lo = tl.load(KV_PARTIAL_INDEX + index_at + t) * SPARSE_BLOCK
            acc, l_i, m_i = _forward_tiles(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                n_lo, n_lo + SPARSE_BLOCK, seqlen_k, diag, window_left, window_right, scale_log2,
                dropout_p, seed_bh, True, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        for t in range(n_full):
            n_lo = tl.load(KV_FULL_INDEX + index_at + t) * SPARSE_BLOCK
            acc, l_i, m_i = _forward_tiles(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                n_lo, n_lo + SPARSE_BLOCK, seqlen_k, diag, window_left, window_right, scale_log2,
                dropout_p, seed_bh, False, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        tiles = (n_partial + n_full) * (SPARSE_BLOCK // BLOCK_N)
    else:
        lo, full_lo, full_hi, hi = key_block_range(m0, seqlen_k, diag, window_left, window_right,
                                                   BLOCK_M, BLOCK_N)
        acc, l_i, m_i = _forward_tiles(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
            lo, full_lo, seqlen_k, diag, window_left, window_right, scale_log2,
            dropout_p, seed_bh, True, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        acc, l_i, m_i = _forward_tiles(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
            full_lo, full_hi, seqlen_k, diag, window_left, window_right, scale_log2,
            dropout_p, seed_bh, False, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        acc, l_i, m_i = _forward_tiles(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
            full_hi, hi, seqlen_k, diag, window_left, window_right, scale_log2,
            dropout_p, seed_bh, True, HEAD_DIM, BLOCK_N, HAS_DROPOUT, PRECISION)
        tiles = (full_lo - lo + BLOCK_N - 1) // BLOCK_N + (full_hi - full_lo) // BLOCK_N
        tiles += (hi - full_hi + BLOCK_N - 1) // BLOCK_N
    if COUNT_VISITS:  # key tiles this program streamed, for cost accounting without a GPU
        tl.store(VISITS + pid_bh * tl.num_programs(0) + pid_m, tiles)

    # Rows that saw no key: output 0, lse -inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    if HAS_DROPOUT:
        out = out * (1.0 / (1.0 - dropout_p))
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    o_base = O + b64 * stride_ob + q_start.to(tl.int64) * stride_om + h * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    lse_base = LSE + b64 * stride_lb + h * stride_lh + q_start
    tl.store(lse_base + offs_m, lse, mask=row_ok)


def table_strides(count, index, shared_heads: bool) -> tuple[int, int, int]:
    """(head stride of counts, head stride of indices, row stride of indices); a mask shared
    across heads is read at head 0 by every head."""
    return (0 if shared_heads else count.stride(0)), (0 if shared_heads else index.stride(0)), index.stride(1)


def flash_forward(q, k, v, out, lse, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  softmax_scale, window_left, window_right, dropout_p, seed, tables=None,
                  block_size=0, visits=None):
    """Launch the forward. Dense: q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D), lse (B, Hq, Sq).
    Packed: q (total_q, Hq, D), k/v (total_k, Hkv, D), lse (Hq, total_q), cu_seqlens int32 (B+1,).
    Writes out (like q) and lse (float32) in place. Windows use flashtrain.kernels.common.UNBOUNDED for -1.
    tables: a block-sparse layout's int32 tables (BlockTables.as_list()) at block_size tokens.
    visits: optional zeroed int32 tensor (B * Hq * query tiles,) that receives, per program,
    the number of key tiles it streamed.
    """
    is_varlen = cu_seqlens_q is not None
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        q4, k4, v4, o4 = (t.unsqueeze(0) for t in (q, k, v, out))
        stride_lb, stride_lh = 0, lse.stride(0)
    else:
        batch = q.shape[0]
        q4, k4, v4, o4 = q, k, v, out
        stride_lb, stride_lh = lse.stride(0), lse.stride(1)
        cu_seqlens_q = cu_seqlens_k = lse  # unused placeholders (IS_VARLEN=False)
    heads_q, head_dim = q4.shape[2], q4.shape[3]
    heads_kv = k4.shape[2]
    cfg = forward_config(head_dim, q.dtype, q.device, block_size)
    sparse = bool(tables)
    if sparse:
        kv_pc, kv_pi, kv_fc, kv_fi = tables[:4]
        t_strides = table_strides(kv_pc, kv_pi, kv_pc.shape[0] == 1)
    else:
        kv_pc = kv_pi = kv_fc = kv_fi = lse  # unused placeholders (SPARSE=False)
        t_strides = (0, 0, 0)
    grid = (triton.cdiv(max_seqlen_q, cfg.block_m), batch * heads_q)
    flash_forward_kernel[grid](
        q4, k4, v4, o4, lse, cu_seqlens_q, cu_seqlens_k, visits if visits is not None else lse,
        kv_pc, kv_pi, kv_fc, kv_fi,
        *seq_strides(q4, is_varlen), *seq_strides(k4, is_varlen),
        *seq_strides(v4, is_varlen), *seq_strides(o4, is_varlen),
        stride_lb, stride_lh, *t_strides,
        max_seqlen_q, max_seqlen_k, heads_q, softmax_scale * LOG2E,
        window_left, window_right, dropout_p, seed,
        GROUP=heads_q // heads_kv, HEAD_DIM=head_dim, BLOCK_D=cfg.block_d,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_VARLEN=is_varlen, HAS_DROPOUT=dropout_p > 0.0, PRECISION=dot_precision(q.dtype),
        SPARSE=sparse, SPARSE_BLOCK=block_size if sparse else 1, COUNT_VISITS=visits is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
