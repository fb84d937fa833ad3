"""FlashAttention-2 forward: a Q tile stays on chip while K/V tiles stream past it.

Online softmax in base 2 (log2(e) folded into the scale), the output normalised once at the
end, and the log-sum-exp (natural log) saved per row for the backward. Scores may be
soft-capped and carry an ALiBi bias (flashtrain.kernels.scores); dropout is fused
(flashtrain.kernels.dropout). Key blocks outside the causal/window band are never visited;
only blocks that cross the band's edges or the end of the sequence pay for an element mask.
Block-sparse launches (SPARSE) visit only the kept key blocks listed in the layout's tables,
partial ones masked and full ones not (flashtrain.kernels.visit_plan).
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import allowed, finite_keys
from flashtrain.kernels.common import (
    LN2,
    dot_precision,
    heavy_first,
    load_rows,
    queue_position,
    seq_strides,
    store_rows,
    tile_grid,
)
from flashtrain.kernels.dropout import dropout_keep, seed_args
from flashtrain.kernels.hopper.route import ws_forward_blocker
from flashtrain.kernels.launch_args import call_shapes, cleaned_values, score_args, sparse_args
from flashtrain.kernels.program import head_rows, program_prologue, query_tile, tile_prologue
from flashtrain.kernels.scores import pending_scale, tile_scores
from flashtrain.kernels.scratch import provide_scratch_allocator
from flashtrain.kernels.tma import use_descriptors
from flashtrain.kernels.tuning import builtin_config, forward_config, launch_fitted, sm_count
from flashtrain.kernels.visit_plan import segment_tiles, tile_start


@triton.jit
def _forward_tile(acc, l_i, m_i, q, k_src, v_src, start_n, offs_m, seqlen_k, band, scores,
                  dropout, pending, key_nan, MASKED: tl.constexpr, CLEAN_V: tl.constexpr,
                  KEY_NAN: tl.constexpr, SOFTCAP: tl.constexpr,
                  ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                  TMA: tl.constexpr):
    """Stream the key tile [start_n, start_n + BLOCK_N) past the query tile: (acc, l_i, m_i)
    updated; MASKED: the band's and the sequence's element mask applied; CLEAN_V (with MASKED):
    V's non-finite entries kept away from the rows that cannot see them; KEY_NAN: V was cleaned
    before the launch and key_nan = (descriptor, row) of the keys' 0 / NaN score
    term (launch_args.cleaned_values), which makes the rows that see a non-finite value NaN."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if CLEAN_V:
        # Masked entries never contribute, not even as 0 * NaN (docs/attention_semantics.md):
        # V's non-finite entries are zeroed, and a row that sees such a key gets a NaN score.
        # Done before the scores exist, so only key_bad (BLOCK_N,) is live across q @ k^T:
        # zeroing V beside the live (BLOCK_M, BLOCK_N) scores took 255 registers and spilled.
        v = load_rows(v_src, start_n, MASKED, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # (BLOCK_N, BLOCK_D)
        v, key_bad = finite_keys(v)
    k = load_rows(k_src, start_n, MASKED, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # (BLOCK_N, BLOCK_D)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N) fp32
    if SOFTCAP or ALIBI:
        qk, _ = tile_scores(qk, offs_m[:, None], offs_n[None, :], band[0], scores, SOFTCAP, ALIBI)
    if KEY_NAN:
        nan_desc, nan_row = key_nan
        qk = qk + nan_desc.load([nan_row, start_n])  # (1, BLOCK_N): 0 or NaN per key
    if CLEAN_V:
        seen = allowed(offs_m[:, None], offs_n[None, :], seqlen_k, band)
        qk = tl.where(seen, tl.where(key_bad[None, :], float("nan"), qk), float("-inf"))
    elif MASKED:
        qk = tl.where(allowed(offs_m[:, None], offs_n[None, :], seqlen_k, band), qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * pending)
    if MASKED:
        # A row with nothing allowed so far keeps m = -inf; shift by 0 to avoid inf - inf.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_shift = m_new
    p = tl.math.exp2(qk * pending - m_shift[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if HAS_DROPOUT:
        seed_bh, dropout_p = dropout
        p = tl.where(dropout_keep(seed_bh, offs_m[:, None], offs_n[None, :], seqlen_k, dropout_p), p, 0.0)
    if not CLEAN_V:
        v = load_rows(v_src, start_n, MASKED, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)  # (BLOCK_N, BLOCK_D)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def _forward_segment(acc, l_i, m_i, q, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
                     bounds, tables, at, seg: tl.constexpr, MASKED: tl.constexpr,
                     SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                     PRECISION: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
                     TMA: tl.constexpr):
    """Stream the key tiles of segment `seg` of the visit plan past the query tile, updating
    (acc, l_i, m_i); one flat loop (flashtrain.kernels.visit_plan)."""
    pending = pending_scale(scores, SOFTCAP, ALIBI)
    for t in range(segment_tiles(bounds, tables, at, seg, SPARSE, SPARSE_BLOCK, BLOCK_N)):
        start_n = tile_start(bounds, tables, at, seg, t, SPARSE, SPARSE_BLOCK, BLOCK_N)
        acc, l_i, m_i = _forward_tile(
            acc, l_i, m_i, q, k_src, v_src, start_n, offs_m, seqlen_k, band, scores, dropout,
            pending, 0, MASKED, MASKED, False, SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D,
            BLOCK_N, PRECISION, TMA)
    return acc, l_i, m_i


@triton.jit
def _forward_key_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
                      bounds, tables, at,
                      SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                      PRECISION: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
                      TMA: tl.constexpr):
    """Run the query tile's visit plan as its two segments; also returns the number of key
    tiles streamed."""
    tiles = 0
    for seg in tl.static_range(2):
        acc, l_i, m_i = _forward_segment(
            acc, l_i, m_i, q, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
            bounds, tables, at, seg, seg == 0,
            SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION,
            SPARSE, SPARSE_BLOCK, TMA)
        tiles += segment_tiles(bounds, tables, at, seg, SPARSE, SPARSE_BLOCK, BLOCK_N)
    return acc, l_i, m_i, tiles


@triton.jit
def _forward_one_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
                      bounds, has_rows, key_nan,
                      SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                      PRECISION: tl.constexpr, TMA: tl.constexpr):
    """The warp-specialized variant (dense launches with descriptor loads): the whole visit plan
    in one loop that Triton splits into a load partition and two softmax/product partitions
    (tl.range(warp_specialize=True)). Triton's warp-specialization pass takes only one loop
    carrying the accumulators, with no early exit, no branch, no load but the descriptors' and
    no MMA operand in registers (docs/kernel_compile.md "Variants"), so: both segments' tiles
    in one loop, the start chosen by arithmetic, every tile with the element mask (all true on
    the middle tiles), a tile past its sequence's end (has_rows False) streaming nothing
    instead of returning, and V cleaned before the launch, its non-finite keys' NaN added to
    the scores from a third descriptor (key_nan; docs/attention_semantics.md). Returns the
    number of key tiles streamed too."""
    pending = pending_scale(scores, SOFTCAP, ALIBI)
    lo, full_lo, full_hi, hi = bounds
    edge = (full_lo - lo + BLOCK_N - 1) // BLOCK_N  # the masked tiles below the middle
    middle = (full_hi - full_lo) // BLOCK_N
    tiles = tl.where(has_rows, edge + middle + (hi - full_hi + BLOCK_N - 1) // BLOCK_N, 0)
    for t in tl.range(0, tiles, warp_specialize=True):
        # in key order: [lo, full_lo) then the middle [full_lo, full_hi) (contiguous: lo and
        # full_lo are multiples of BLOCK_N unless full_lo = hi), then [full_hi, hi)
        start_n = tl.where(t < edge + middle, lo + t * BLOCK_N, full_hi + (t - edge - middle) * BLOCK_N)
        acc, l_i, m_i = _forward_tile(
            acc, l_i, m_i, q, k_src, v_src, start_n, offs_m, seqlen_k, band, scores, dropout,
            pending, key_nan, True, False, True, SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D,
            BLOCK_N, PRECISION, TMA)
    return acc, l_i, m_i, tiles


@triton.jit
def _forward_query_tile(
    Q, K, V, O, LSE, ALIBI_SLOPES, SEED, VISITS, tables, place, strides, key_nan, tiles_m, heads_q,
    scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah, dropout_p, seed,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    SEED_IN_MEMORY: tl.constexpr, COUNT_VISITS: tl.constexpr, TMA: tl.constexpr,
    ONE_LOOP: tl.constexpr,
):
    """Attend one query tile: place = (tile, b, h, q_start, seqlen_q, k_start, seqlen_k, band)
    from program_prologue / tile_prologue; strides the (batch, seq, head) strides of Q, K, V
    and O, LSE's (batch, head) and the tables' (count_h, index_h, index_row); key_nan (with
    ONE_LOOP) = (KEY_NAN, rows, columns, row stride) of the key-NaN table of
    launch_args.cleaned_values; writes its rows of O and LSE. The caller has checked
    that the tile holds rows, except with ONE_LOOP (the warp-specialized loop, which streams
    nothing for a tile past its sequence's end and whose stores then write nothing)."""
    pid_m, b, h, q_start, seqlen_q, k_start, seqlen_k, band = place
    q_strides, k_strides, v_strides, o_strides, lse_strides, table_strides = strides
    m0 = pid_m * BLOCK_M
    offs_m, scores, dropout, q, k_src, v_src, bounds, at = query_tile(
        Q, K, V, ALIBI_SLOPES, SEED, seed, (b, h, q_start, seqlen_q, k_start, seqlen_k, band), m0,
        q_strides, k_strides, v_strides, table_strides,
        heads_q, scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah, dropout_p, GROUP,
        HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, SPARSE_BLOCK, ALIBI, SEED_IN_MEMORY, TMA)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if ONE_LOOP:
        KEY_NAN, nan_rows, nan_cols, nan_stride = key_nan
        nan_desc = tl.make_tensor_descriptor(KEY_NAN, shape=[nan_rows, nan_cols],
                                             strides=[nan_stride, 1], block_shape=[1, BLOCK_N])
        nan_tile = (nan_desc, b * (heads_q // GROUP) + h // GROUP)  # sequence b, kv head
        acc, l_i, m_i, tiles = _forward_one_loop(
            acc, l_i, m_i, q, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
            bounds, m0 < seqlen_q, nan_tile, SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N,
            PRECISION, TMA)
    else:
        acc, l_i, m_i, tiles = _forward_key_loop(
            acc, l_i, m_i, q, k_src, v_src, offs_m, seqlen_k, band, scores, dropout,
            bounds, tables, at, SOFTCAP, ALIBI, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N,
            PRECISION, SPARSE, SPARSE_BLOCK, TMA)
    if COUNT_VISITS:  # key tiles this tile streamed, for cost accounting without a GPU
        tl.store(VISITS + (b * heads_q + h) * tiles_m + pid_m, tiles)

    # Rows that saw no key: output 0, lse -inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    if HAS_DROPOUT:
        out = out * (1.0 / (1.0 - dropout_p))
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    o_src = head_rows(O, o_strides, b, q_start, h, seqlen_q, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    if ONE_LOOP:
        # a tile past its sequence's end (only the one-loop form gets here with one) writes
        # nothing: an empty sequence's descriptor still spans a row, the next sequence's first
        if m0 < seqlen_q:
            store_rows(o_src, m0, out, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    else:
        store_rows(o_src, m0, out, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    stride_lb, stride_lh = lse_strides
    lse_base = LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start
    tl.store(lse_base + offs_m, lse, mask=offs_m < seqlen_q)


@triton.jit(do_not_specialize=["seed"])
def flash_forward_kernel(
    Q, K, V, O, LSE, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, SEED, VISITS, KEY_NAN,
    KV_PARTIAL_COUNT, KV_PARTIAL_INDEX, KV_FULL_COUNT, KV_FULL_INDEX,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh, stride_count_h, stride_index_h, stride_index_row,
    nan_rows, nan_cols, nan_stride,
    seqlen_q_fixed, seqlen_k_fixed, batch, heads_q, window_left, window_right,
    scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah, dropout_p, seed,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr, SPARSE: tl.constexpr, SPARSE_BLOCK: tl.constexpr,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    SEED_IN_MEMORY: tl.constexpr, COUNT_VISITS: tl.constexpr, HEAVY_FIRST: tl.constexpr,
    TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, PERSISTENT: tl.constexpr,
):
    """One query tile per program (grid: tile_grid), or with PERSISTENT one program per SM
    walking the queue of tiles x heads x batch (queue_position); WARP_SPECIALIZE: the one-loop
    visit plan (_forward_one_loop). seqlen_q_fixed is max_seqlen_q when IS_VARLEN."""
    tiles_m = tl.cdiv(seqlen_q_fixed, BLOCK_M)
    tables = (KV_PARTIAL_COUNT, KV_PARTIAL_INDEX, KV_FULL_COUNT, KV_FULL_INDEX)
    strides = ((stride_qb, stride_qm, stride_qh), (stride_kb, stride_kn, stride_kh),
               (stride_vb, stride_vn, stride_vh), (stride_ob, stride_om, stride_oh),
               (stride_lb, stride_lh), (stride_count_h, stride_index_h, stride_index_row))
    key_nan = (KEY_NAN, nan_rows, nan_cols, nan_stride)
    if PERSISTENT:
        for item in range(tl.program_id(0), tiles_m * heads_q * batch, tl.num_programs(0)):
            tile, b, h = queue_position(item, tiles_m, heads_q, batch, HEAVY_FIRST)
            place = tile_prologue(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed,
                                  window_left, window_right, tile, b, h, IS_VARLEN)
            if WARP_SPECIALIZE or tile * BLOCK_M < place[4]:  # the tile holds rows
                _forward_query_tile(
                    Q, K, V, O, LSE, ALIBI_SLOPES, SEED, VISITS, tables, place, strides, key_nan,
                    tiles_m, heads_q, scale_log2, softcap_scale, softcap_log2, stride_ab,
                    stride_ah, dropout_p, seed, GROUP, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                    PRECISION, SPARSE, SPARSE_BLOCK, SOFTCAP, ALIBI, HAS_DROPOUT,
                    SEED_IN_MEMORY, COUNT_VISITS, TMA, WARP_SPECIALIZE)
    else:
        place = program_prologue(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed,
                                 heads_q, window_left, window_right, IS_VARLEN, HEAVY_FIRST)
        if not WARP_SPECIALIZE:
            if place[0] * BLOCK_M >= place[4]:  # a varlen grid's tile past its sequence's end
                return
        _forward_query_tile(
            Q, K, V, O, LSE, ALIBI_SLOPES, SEED, VISITS, tables, place, strides, key_nan,
            tiles_m, heads_q, scale_log2, softcap_scale, softcap_log2, stride_ab, stride_ah,
            dropout_p, seed, GROUP, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, SPARSE,
            SPARSE_BLOCK, SOFTCAP, ALIBI, HAS_DROPOUT, SEED_IN_MEMORY, COUNT_VISITS, TMA,
            WARP_SPECIALIZE)


def flash_forward(q, k, v, out, lse, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  softmax_scale, window_left, window_right, dropout_p, seed, tables=None,
                  block_size=0, visits=None, softcap=0.0, alibi_slopes=None):
    """Launch the forward. Dense: q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D), lse (B, Hq, Sq).
    Packed: q (total_q, Hq, D), k/v (total_k, Hkv, D), lse (Hq, total_q), cu_seqlens int32 (B+1,).
    Writes out (like q) and lse (float32, natural log) in place. head_dim any 1..256.
    Windows use flashtrain.kernels.common.UNBOUNDED for an unbounded side; causal is right = 0.
    seed: a Python int in [0, 2**63) or a 1-element int64 tensor on q's device (no host sync);
        the same value gives the same dropout mask either way.
    softcap: > 0 caps the scores at softcap * tanh(s / softcap); 0 = off.
    alibi_slopes: None or float32 (B, Hq) on q's device; the bias is -slope * |i + Sk - Sq - j|.
    tables: a block-sparse layout's int32 tables (BlockTables.as_list()) at block_size tokens.
    visits: optional zeroed int32 tensor (B * Hq * query tiles,) that receives, per program,
    the number of key tiles it streamed.
    """
    shapes = call_shapes(q, k, lse, cu_seqlens_q, cu_seqlens_k, v, out)
    q4, k4, v4, o4 = shapes.views(q, k, v, out)
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if shapes.is_varlen else (lse, lse)  # placeholders
    slopes, score_scalars, score_flags = score_args(softmax_scale, softcap, alibi_slopes, shapes,
                                                    q.device, lse)
    seed_ptr, seed_value, seed_in_memory = seed_args(seed, q.device, lse)
    cfg = forward_config(shapes.head_dim, q.dtype, q.device, block_size)
    sparse = bool(tables)
    heavy = heavy_first(window_left, window_right)
    if cfg.gluon:  # the Gluon forward where it covers the call (kernels/hopper/route.py)
        declined = ws_forward_blocker(
            cfg, q4=q4, k4=k4, v4=v4, o4=o4, dropout_p=dropout_p, softcap=softcap,
            alibi_slopes=alibi_slopes, window_left=window_left, window_right=window_right,
            sparse=sparse)  # fmt: skip
        # visits count the Triton forward's key tiles (cost accounting): that call keeps it
        if declined is None and visits is None:
            from flashtrain.kernels.hopper.flash_fwd_ws import flash_forward_ws

            flash_forward_ws(q4, k4, v4, o4, lse, cu_seqlens_q=cu_seqlens_q,
                             cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                             max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale,
                             window_right=window_right, shapes=shapes, stages=cfg.num_stages)  # fmt: skip
            return
        cfg = builtin_config("fwd", shapes.head_dim, q.dtype, q.device, block_size)
    table_tensors, table_stride_args = sparse_args(tables[:4] if sparse else None, lse)

    def launch(cfg):
        tiles = triton.cdiv(max_seqlen_q, cfg.block_m)
        if cfg.persistent:  # one program per SM, each walking its share of the tile queue
            grid = (max(1, min(tiles * shapes.batch * shapes.heads_q, sm_count(q.device))),)
        else:
            grid = tile_grid(tiles, shapes.batch, shapes.heads_q, heavy)
        descriptors = use_descriptors(cfg, q.device, q4, k4, v4, o4)
        # Triton's warp specialization takes descriptor loads only, and no table loads (sparse)
        one_loop = cfg.warp_specialize and descriptors and not sparse
        values, key_nan, key_nan_args = v4, lse, (0, 0, 0)  # placeholders but one_loop
        if one_loop:
            values, key_nan, key_nan_args = cleaned_values(v4, shapes.batch, max_seqlen_k,
                                                           cu_seqlens_k)
            one_loop = use_descriptors(cfg, q.device, values)
            values = values if one_loop else v4
        provide_scratch_allocator()  # in this thread: autograd's backward runs on its own
        flash_forward_kernel[grid](
            q4, k4, values, o4, lse, cu_q, cu_k, slopes, seed_ptr,
            visits if visits is not None else lse, key_nan, *table_tensors,
            *seq_strides(q4, shapes.is_varlen), *seq_strides(k4, shapes.is_varlen),
            *seq_strides(values, shapes.is_varlen), *seq_strides(o4, shapes.is_varlen),
            *shapes.lse_strides, *table_stride_args, *key_nan_args,
            max_seqlen_q, max_seqlen_k, shapes.batch, shapes.heads_q, window_left, window_right,
            *score_scalars, dropout_p, seed_value,
            GROUP=shapes.heads_q // shapes.heads_kv, HEAD_DIM=shapes.head_dim, BLOCK_D=cfg.block_d,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, PRECISION=dot_precision(q.dtype),
            IS_VARLEN=shapes.is_varlen, SPARSE=sparse, SPARSE_BLOCK=block_size if sparse else 1,
            **score_flags, HAS_DROPOUT=dropout_p > 0.0, SEED_IN_MEMORY=seed_in_memory,
            COUNT_VISITS=visits is not None, HEAVY_FIRST=heavy,
            TMA=descriptors, WARP_SPECIALIZE=one_loop, PERSISTENT=cfg.persistent,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )

    launch_fitted("fwd", cfg, launch)
