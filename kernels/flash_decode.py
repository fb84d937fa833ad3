"""Split-KV attention for decoding ("flash-decoding"): a few query rows against a long KV cache.

A decode step has one query row per sequence, so the forward's grid (query tiles x batch x
heads) has a handful of programs while the cache is read once. Here the cache's sequence axis
is split over programs as well: program (split, row tile, batch x kv head) streams only its
split's key range and writes a normalised partial output and its log-sum-exp; a combine kernel
merges the splits exactly through the LSE (the ring attention's merge):

    lse = log sum_s exp(lse_s),   out = sum_s exp(lse_s - lse) * out_s

The query heads of one KV head (a GQA group) and the query rows share the tile's rows
(row r: query r // GROUP, head h_kv * GROUP + r % GROUP), so each K/V tile is loaded once
for the whole group and tl.dot gets at least 16 rows. Each batch entry has its own key count
(SEQLENS_K, read on the device: no host sync), its own cache row (CACHE_BATCH_IDX) or its
own pages of a paged cache (BLOCK_TABLE: key j at row j % page_size of page
block_table[b, j // page_size], looked up per key), and optionally a first key (LEFTPAD: keys before it are left padding); query i sits at key
position i + seqlen_k[b] - Sq (bottom-right causal alignment).

With one split the partial output is the output: the kernel writes out and lse directly and
no combine runs. Masked entries never contribute, not even as 0 x NaN (MASKED_TILES), and every
offset is int64 (docs/attention_semantics.md); the integer tables must have their last dim
contiguous (the API copies a strided one, the launcher refuses it).
"""

import torch
import triton
import triton.language as tl

from flashtrain.kernels import tuning
from flashtrain.kernels.band import finite_keys
from flashtrain.kernels.common import LN2, LOG2E, UNBOUNDED, check_grid, dot_precision
from flashtrain.kernels.launch_args import check_index_table
from flashtrain.kernels.scores import tanh
from flashtrain.kernels.scratch import provide_scratch_allocator
from flashtrain.kernels.tuning import (
    TileConfig,
    block_d_for,
    fit_shared_memory,
    launch_fitted,
    max_shared_memory,
)

MAX_SPLITS = 128


@triton.jit
def flash_decode_split_kernel(
    Q, K, V, O, LSE, SEQLENS_K, CACHE_BATCH_IDX, LEFTPAD, ALIBI_SLOPES, BLOCK_TABLE,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_os, stride_ob, stride_om, stride_oh, stride_ls, stride_lb, stride_lh, stride_lm,
    stride_ab, stride_ah, stride_bt, page_size,
    seqlen_q, split_len, window_left, window_right,
    scale_log2, softcap_scale, softcap_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
    HAS_LEFTPAD: tl.constexpr, PAGED: tl.constexpr, MASKED_TILES: tl.constexpr,
):
    # grid (splits, row tiles x KV heads, batch): the block order of (splits, row tiles,
    # batch x KV heads), with z under 65,536 up to that many sequences
    split = tl.program_id(0)
    row_tiles = tl.cdiv(seqlen_q * GROUP, BLOCK_M)
    m0 = (tl.program_id(1) % row_tiles) * BLOCK_M
    h_kv = tl.program_id(1) // row_tiles
    b = tl.program_id(2)
    seqlen_k = tl.load(SEQLENS_K + b)
    cache_b = tl.load(CACHE_BATCH_IDX + b) if HAS_BATCH_IDX else b
    # Offsets in int64 (docs/attention_semantics.md, "Size limits"): a head-major view puts
    # h * stride_h past 2^31, a long chunk i * stride_m, a long split output split * stride_s.
    b64, cache_b64, h_kv64, split64 = b.to(tl.int64), cache_b.to(tl.int64), h_kv.to(tl.int64), split.to(tl.int64)

    rows = m0 + tl.arange(0, BLOCK_M)  # (BLOCK_M,) in the (Sq * GROUP) row space
    row_ok = rows < seqlen_q * GROUP
    i = rows // GROUP  # query index
    h = h_kv * GROUP + rows % GROUP  # query head
    i64, h64 = i.to(tl.int64), h.to(tl.int64)
    cols_d = tl.arange(0, BLOCK_D)
    d_ok = cols_d < HEAD_DIM
    q_ptrs = Q + b64 * stride_qb + i64[:, None] * stride_qm + h64[:, None] * stride_qh + cols_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)

    # Keys this tile may see: its split's range, inside the band of its first and last query.
    diag = seqlen_k - seqlen_q
    i_first = m0 // GROUP
    i_last = tl.minimum((m0 + BLOCK_M - 1) // GROUP, seqlen_q - 1)
    first_key = tl.load(LEFTPAD + b) if HAS_LEFTPAD else 0  # keys before it are padding
    lo = tl.maximum(split * split_len, tl.maximum(i_first + diag - window_left, first_key))
    hi = tl.minimum((split + 1) * split_len, tl.minimum(seqlen_k, i_last + diag + window_right + 1))
    if ALIBI:
        slope_log2 = -tl.load(ALIBI_SLOPES + b * stride_ab + h * stride_ah, mask=row_ok, other=0.0) * LOG2E
    pos = i + diag  # (BLOCK_M,) key position of each query

    if PAGED:  # a page index per key: the cache is a pool of (page_size, Hkv, D) pages
        k_base = K + h_kv64 * stride_kh
        v_base = V + h_kv64 * stride_vh
    else:
        k_base = K + cache_b64 * stride_kb + h_kv64 * stride_kh
        v_base = V + cache_b64 * stride_vb + h_kv64 * stride_vh
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        kv_mask = col_ok[:, None] & d_ok[None, :]
        if PAGED:
            page = tl.load(BLOCK_TABLE + b64 * stride_bt + cols // page_size, mask=col_ok, other=0).to(tl.int64)
            in_page = (cols % page_size).to(tl.int64)
            k_rows = page * stride_kb + in_page * stride_kn
            v_rows = page * stride_vb + in_page * stride_vn
        else:
            k_rows = cols.to(tl.int64) * stride_kn
            v_rows = cols.to(tl.int64) * stride_vn
        k = tl.load(k_base + k_rows[:, None] + cols_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N) fp32
        if SOFTCAP:
            s = tanh(qk * softcap_scale) * softcap_log2
        else:
            s = qk * scale_log2
        if ALIBI:
            s += slope_log2[:, None] * tl.abs(pos[:, None] - cols[None, :]).to(tl.float32)
        keep = (col_ok[None, :] & row_ok[:, None] & (cols[None, :] <= pos[:, None] + window_right)
                & (cols[None, :] >= pos[:, None] - window_left))
        if MASKED_TILES:
            # A key loaded for one row may be masked for another, and masked entries never
            # contribute, not even as 0 * NaN (docs/attention_semantics.md): V's non-finite
            # entries are zeroed and a row that sees such a key gets a NaN score.
            v = tl.load(v_base + v_rows[:, None] + cols_d[None, :], mask=kv_mask, other=0.0)
            v, key_bad = finite_keys(v)
            s = tl.where(keep, tl.where(key_bad[None, :], float("nan"), s), float("-inf"))
        else:
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet
        p = tl.math.exp2(s - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        if not MASKED_TILES:
            v = tl.load(v_base + v_rows[:, None] + cols_d[None, :], mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    # A split (or a row) that saw no key: output 0, lse -inf; the combine gives it weight 0.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    o_ptrs = (O + split64 * stride_os + b64 * stride_ob + i64[:, None] * stride_om
              + h64[:, None] * stride_oh + cols_d[None, :])
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    lse_ptrs = LSE + split64 * stride_ls + b64 * stride_lb + h64 * stride_lh + i64 * stride_lm
    tl.store(lse_ptrs, lse, mask=row_ok)


@triton.jit
def flash_decode_combine_kernel(
    O_PART, LSE_PART, O, LSE, splits, heads_q, seqlen_q,
    stride_ps, stride_pb, stride_pm, stride_ph, stride_qs, stride_qb, stride_qh, stride_qm,
    stride_ob, stride_om, stride_oh, stride_lb, stride_lh, stride_lm,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """One program per output row (b, i, h): merge the splits' (out_s, lse_s) through the LSE.
    Offsets in int64, as in the split kernel."""
    row = tl.program_id(0).to(tl.int64)
    h = row % heads_q
    i = (row // heads_q) % seqlen_q
    b = row // heads_q // seqlen_q
    offs_s = tl.arange(0, BLOCK_S).to(tl.int64)
    lse_s = tl.load(LSE_PART + offs_s * stride_qs + b * stride_qb + h * stride_qh + i * stride_qm,
                    mask=offs_s < splits, other=float("-inf"))
    lse_max = tl.max(lse_s, 0)
    shift = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    total = tl.sum(tl.math.exp2((lse_s - shift) * LOG2E), 0)
    lse = tl.where(total == 0.0, float("-inf"), shift + tl.log(tl.where(total == 0.0, 1.0, total)))
    cols_d = tl.arange(0, BLOCK_D)
    d_ok = cols_d < HEAD_DIM
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    o_part = O_PART + b * stride_pb + i * stride_pm + h * stride_ph  # split 0's row
    lse_part = LSE_PART + b * stride_qb + h * stride_qh + i * stride_qm
    for _ in range(splits):  # pointers step on: no split * stride product to overflow
        lse_one = tl.load(lse_part)
        weight = tl.where(lse_one == float("-inf"), 0.0, tl.math.exp2((lse_one - lse) * LOG2E))
        acc += weight * tl.load(o_part + cols_d, mask=d_ok, other=0.0)
        o_part += stride_ps
        lse_part += stride_qs
    tl.store(O + b * stride_ob + i * stride_om + h * stride_oh + cols_d, acc.to(O.dtype.element_ty), mask=d_ok)
    tl.store(LSE + b * stride_lb + h * stride_lh + i * stride_lm, lse)


# ------------------------------------------------------------------ host side
def decode_config(head_dim: int, dtype: torch.dtype, device: torch.device, rows: int) -> TileConfig:
    """Tiles of the split kernel: block_m covers the rows of one KV head (Sq x GROUP, at least
    the 16 tl.dot needs, at most 64), block_n the streamed key tile; sized like the forward's
    (one held tile, K and V streamed) and shrunk to the GPU's shared memory."""
    block_d = block_d_for(head_dim)
    if tuning.gpu_capability(device) is None:  # interpreter, CPU (a compile check stands in a GPU)
        return TileConfig(16, 16, block_d, 4, 1)
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    wide = dtype == torch.float32 or block_d > 128
    cfg = TileConfig(block_m, 32 if wide else 64, block_d, 4, 2)
    return fit_shared_memory("fwd", cfg, dtype.itemsize, max_shared_memory(device))


def _multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors to fill; a nominal 4 off CUDA (interpreter, compile checks), so
    that CPU tests of num_splits=0 still split."""
    if device.type != "cuda":
        return 4
    return _cuda_multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


_SM_COUNT: dict[int, int] = {}


def _cuda_multiprocessors(index: int) -> int:
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def choose_splits(programs: int, key_tiles: int, multiprocessors: int) -> int:
    """How many splits of the key axis fill the GPU: none when the other axes already give
    about a wave of programs; otherwise enough for two waves, at most one per key tile and
    MAX_SPLITS (each split costs a partial row in the combine)."""
    if programs >= 0.8 * multiprocessors:
        return 1
    wanted = triton.cdiv(2 * multiprocessors, max(programs, 1))
    return max(1, min(wanted, key_tiles, MAX_SPLITS))


def flash_decode(q, k_cache, v_cache, out, lse, seqlens_k, *, cache_batch_idx, softmax_scale,
                 window_left, window_right, softcap=0.0, alibi_slopes=None, num_splits=0,
                 cache_leftpad=None, block_table=None):
    """Attention of q (B, Sq, Hq, D) against the KV cache: k_cache / v_cache (B_cache, S_cache,
    Hkv, D), batch b reading cache row cache_batch_idx[b] (int32 (B,), or None: row b) and its
    first seqlens_k[b] keys (int32 (B,) on q's device), from cache_leftpad[b] on (int32 (B,), or
    None: from 0). Paged: block_table int32 (B, pages) maps entry b's key j to row j % page_size of
    page block_table[b, j // page_size] of k_cache / v_cache (num_pages, page_size, Hkv, D).
    Writes out (like q) and lse (B, Hq, Sq)
    float32 in place. Windows use flashtrain.kernels.common.UNBOUNDED for an unbounded side, causal
    is right = 0, aligned per batch entry at the bottom right. alibi_slopes None or float32
    (B, Hq). num_splits: 0 chooses from the shape (choose_splits), else at most that many (one
    per key tile and MAX_SPLITS at most). Nothing here reads a device value: no host sync."""
    tables = dict(seqlens_k=seqlens_k, cache_batch_idx=cache_batch_idx,
                  cache_leftpad=cache_leftpad, block_table=block_table)  # fmt: skip
    for name, table in tables.items():  # read with stride 1 along the last dim: no strided view
        if table is not None:
            check_index_table(name, table)
    batch, seqlen_q, heads_q, head_dim = q.shape
    cache_len, heads_kv = k_cache.shape[1], k_cache.shape[2]
    page_size = k_cache.shape[1]
    if block_table is not None:  # the keys an entry may hold: its pages
        cache_len = block_table.shape[1] * page_size
    group = heads_q // heads_kv
    rows = seqlen_q * group
    cfg = decode_config(head_dim, q.dtype, q.device, rows)
    scale_log2 = softmax_scale * LOG2E.value
    cap = (softmax_scale / softcap, softcap * LOG2E.value) if softcap > 0.0 else (0.0, 0.0)
    slopes = alibi_slopes if alibi_slopes is not None else lse
    slope_strides = alibi_slopes.stride() if alibi_slopes is not None else (0, 0)
    batch_idx = cache_batch_idx if cache_batch_idx is not None else seqlens_k
    # The rows of a tile see different key ranges only with several queries and a bounded
    # band side; otherwise every key a tile loads is seen by all its rows.
    masked_tiles = seqlen_q > 1 and (window_left < UNBOUNDED or window_right < UNBOUNDED)

    def launch(cfg):
        row_tiles = triton.cdiv(rows, cfg.block_m)
        key_tiles = max(1, triton.cdiv(cache_len, cfg.block_n))
        splits = min(num_splits, MAX_SPLITS) or choose_splits(batch * heads_kv * row_tiles, key_tiles,
                                             _multiprocessors(q.device))
        # whole key tiles per split; no split left empty by the rounding
        split_len = triton.cdiv(key_tiles, min(splits, key_tiles)) * cfg.block_n
        splits = max(1, triton.cdiv(cache_len, split_len))
        if splits == 1:
            o_part, lse_part = out, lse
            o_strides = (0, *out.stride()[:3])
            l_strides = (0, *lse.stride())
        else:
            o_part = torch.empty(splits, batch, seqlen_q, heads_q, head_dim, dtype=torch.float32,
                                 device=q.device)
            lse_part = torch.empty(splits, batch, heads_q, seqlen_q, dtype=torch.float32,
                                   device=q.device)
            o_strides, l_strides = o_part.stride()[:4], lse_part.stride()
        provide_scratch_allocator()  # in this thread: autograd's backward runs on its own
        grid = check_grid((splits, row_tiles * heads_kv, batch), "splits, row tiles x KV heads, batch")
        flash_decode_split_kernel[grid](
            q, k_cache, v_cache, o_part, lse_part, seqlens_k, batch_idx,
            cache_leftpad if cache_leftpad is not None else seqlens_k, slopes,
            block_table if block_table is not None else seqlens_k,
            *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
            *o_strides, *l_strides, *slope_strides,
            block_table.stride(0) if block_table is not None else 0, page_size,
            seqlen_q, split_len, window_left, window_right, scale_log2, *cap,
            GROUP=group, HEAD_DIM=head_dim, BLOCK_D=cfg.block_d, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, PRECISION=dot_precision(q.dtype), SOFTCAP=softcap > 0.0,
            ALIBI=alibi_slopes is not None, HAS_BATCH_IDX=cache_batch_idx is not None,
            HAS_LEFTPAD=cache_leftpad is not None, PAGED=block_table is not None,
            MASKED_TILES=masked_tiles,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        if splits > 1:
            flash_decode_combine_kernel[(batch * seqlen_q * heads_q,)](
                o_part, lse_part, out, lse, splits, heads_q, seqlen_q,
                *o_part.stride()[:4], *lse_part.stride(), *out.stride()[:3], *lse.stride(),
                HEAD_DIM=head_dim, BLOCK_D=cfg.block_d,
                BLOCK_S=max(2, triton.next_power_of_2(splits)), num_warps=1 if head_dim <= 64 else 2,
            )

    launch_fitted("fwd", cfg, launch)
