"""The attention backward for Hopper (sm_90) in Gluon: warp-specialized, FlashAttention-3's
structure. dK, dV and dQ in one pass; P is recomputed from Q, K and the saved lse, as in the
Triton kernels (kernels/flash_bwd*.py), whose semantics it keeps (docs/attention_semantics.md).

One program holds a key tile of BLOCK_N = 128 keys of one kv head and streams past it the query
tiles that see it, for each query head of the kv head's group in turn (kernels/hopper/schedule.py
says which, in what order). Three partitions, connected by mbarriers:

  loader (1 warp, 24 registers)    K and V once; then Q, dO and their rows' lse and delta of
                                   every item into a ring of STAGES shared-memory slots, with
                                   TMA (q_ready / q_empty)
  consumers (8 warps: 2 warpgroups, the registers left: 240, 232 under Triton 3.6)
                                   warpgroup w owns keys [64w, 64w + 64) of the tile:
                                     S^T  = K Q^T                        (wgmma, swapped: keys are rows)
                                     P^T  = exp2(S^T scale - lse)        (registers)
                                     dV  += P^T dO                       (P^T from registers)
                                     dP^T = V dO^T
                                     dS^T = P^T (dP^T - delta)
                                     dK  += dS^T Q                       (dS^T from registers)
                                   dS^T of both halves goes to shared memory (two buffers, one
                                   partition barrier a tile), then dQ_tile = dS K (128 keys, one
                                   product split between the warpgroups) into a float32 staging
                                   tile (dq_ready / dq_empty)
  dQ writer (1 warp, 24 registers) adds each dQ tile into a float32 accumulator in global memory:
                                   one TMA bulk reduce-add per tile where Gluon has it (Triton
                                   after 3.6); under Triton 3.6 (2 warps, 32 registers)
                                   per-element fp32 atomics from the staging tile
                                   (gluon_api.TMA_REDUCE)

Then the launcher converts dQ = scale * accumulator to dq's dtype, as the Triton atomic-dQ path
does. Every tile (B, S, H, D) tensor is read and written through one descriptor per sequence
over its (seqlen, heads * head_dim) rows: the hardware zero-fills rows past the sequence and
drops the reduce-add's rows past it, so a tile never touches another sequence.

Masked entries never contribute (docs/attention_semantics.md): on masked tiles (causal edge,
sequence tails) P is 0 outside the band and past the query rows, and dS is 0 where P is (a NaN
of V reaches dP there); K's non-finite entries are zeroed in shared memory once per program
(dQ = dS K must not form 0 x NaN) and the keys that had one get a NaN score term, so the rows
that see such a key still become NaN.

Covers head_dim 64 and 128, fp16 and bf16, causal or not, GQA, fixed-length and varlen; the
rest stays on the Triton kernels (kernels/hopper/route.py decides). It does not run on the
Triton interpreter: its schedule is checked on the CPU by flashtrain/lab/hopper_bwd_mirror.py,
its compiled form by flashtrain/lab/kernel_compile.py, its numbers only on a GPU.
"""

from __future__ import annotations

from flashtrain.kernels.band import allowed
from flashtrain.kernels.common import LOG2E, UNBOUNDED
from flashtrain.kernels.hopper.gluon_api import (
    TMA_REDUCE,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    partition_barrier,
    tma,
    tma_load,
    tma_reduce_add,
    tma_store,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from flashtrain.kernels.hopper.schedule import (
    item_tile,
    key_tile_grid,
    key_tile_plan,
    key_tile_program,
    plan_tile,
    ring_slot,
)

BLOCK_N = 128  # keys a program holds: 64 per consumer warpgroup
CONSUMER_WARPS = 8  # two warpgroups
WORKER_REGISTERS = gl.constexpr(24)  # loader and dQ writer (setmaxnreg, the least there is); consumers get the rest
# Triton 3.6's dQ writer adds per element (no bulk reduce-add in its Gluon): two warps of 32
# registers, 4 values and their addresses a thread (Triton 3.6 then leaves the consumers 232:
# no spill either side, docs/kernel_compile.md)
ATOMIC_WRITER = dict(warps=2, registers=32)
MAX_REGISTERS = 168  # at launch: 65,536 registers / 384 threads, rounded down to a multiple of 8


# ------------------------------------------------------------------ layouts
@gluon.constexpr_function
def _acc_layout(rows, cols, num_warps):
    """The wgmma accumulator layout of a (rows, cols) product over num_warps warps: warpgroups
    stacked along the rows while each keeps >= 64 of them, else side by side along the columns."""
    row_groups = max(1, min(num_warps // 4, rows // 64))
    warps = [4 * row_groups, num_warps // (4 * row_groups)]
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps,
                                     instr_shape=[16, cols // warps[1], 16])


@gluon.constexpr_function
def _shared(shape, dtype):
    return gl.NVMMASharedLayout.get_default_for(shape, dtype)


# ------------------------------------------------------------------ partitions
@gluon.jit
def _load_partition(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, k_smem, v_smem,
                    q_smem, do_smem, lse_smem, delta_smem, kv_ready, q_ready, q_empty, n0, h_kv,
                    stats_at, stride_lh, bounds, n_masked, n_tiles,
                    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    STAGES: gl.constexpr):
    """K and V once, then Q, dO and their rows' lse and delta of every item into its ring slot
    once the slot is free. stats_at: the offset of (b, head 0, q_start) in lse and delta."""
    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes)
    tma_load(k_desc, [n0, h_kv * HEAD_DIM], kv_ready, k_smem)
    tma_load(v_desc, [n0, h_kv * HEAD_DIM], kv_ready, v_smem)
    tile_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes
    for it in range(GROUP * n_tiles):
        g, t = item_tile(it, n_tiles)
        h = h_kv * GROUP + g
        slot, parity = ring_slot(it, STAGES)
        start_m, masked = plan_tile(bounds, n_masked, t, BLOCK_M)
        mbarrier.wait(q_empty.index(slot), parity ^ 1)  # its previous use released
        ready = q_ready.index(slot)
        mbarrier.expect(ready, tile_bytes)
        tma_load(q_desc, [start_m, h * HEAD_DIM], ready, q_smem.index(slot))
        tma_load(do_desc, [start_m, h * HEAD_DIM], ready, do_smem.index(slot))
        tma_load(lse_desc, [stats_at + h * stride_lh + start_m], ready, lse_smem.index(slot))
        tma_load(delta_desc, [stats_at + h * stride_lh + start_m], ready, delta_smem.index(slot))


@gluon.jit
def _dq_partition(dq_desc, DQ_ACC, stride_dqam, dq_smem, dq_ready, dq_empty, h_kv, seqlen_q,
                  bounds, n_masked, n_tiles, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, TMA_REDUCE: gl.constexpr):
    """Add each item's dQ tile (float32, unscaled) into the accumulator, in item order.
    DQ_ACC: the accumulator's first element of this sequence (row q_start, head 0)."""
    # the per-element path walks the staging tile in (8, 32) chunks, one swizzle atom of the
    # float32 tile (8 rows of 128 bytes); a warp's add covers 32 adjacent floats of one row
    ROWS: gl.constexpr = 8
    COLS: gl.constexpr = 32
    chunk: gl.constexpr = gl.BlockedLayout([ROWS // gl.num_warps(), 1], [1, 32],
                                           [gl.num_warps(), 1], [1, 0])
    for it in range(GROUP * n_tiles):
        g, t = item_tile(it, n_tiles)
        h = h_kv * GROUP + g
        start_m, masked = plan_tile(bounds, n_masked, t, BLOCK_M)
        _, staged = ring_slot(it, 1)  # the staging tile: a ring of one
        mbarrier.wait(dq_ready, staged)
        if TMA_REDUCE:  # one bulk reduce-add; rows past the sequence are dropped
            tma_reduce_add(dq_desc, [start_m, h * HEAD_DIM], dq_smem)
            tma.store_wait(0)  # the staging tile has been read
        else:
            rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, chunk))[:, None]
            cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, chunk))[None, :]
            # one pointer a value, walked down the tile: few addresses live at a time
            ptrs = DQ_ACC + start_m.to(gl.int64) * stride_dqam + h * HEAD_DIM \
                + (rows * stride_dqam + cols)
            for r in gl.static_range(0, BLOCK_M, ROWS):
                keep = rows < seqlen_q - start_m - r
                for c in gl.static_range(0, HEAD_DIM, COLS):
                    part = dq_smem.slice(r, ROWS, dim=0).slice(c, COLS, dim=1).load(chunk)
                    gl.atomic_add(ptrs + c, part, mask=keep, sem="relaxed")
                ptrs += ROWS * stride_dqam
        mbarrier.arrive(dq_empty, count=1)


@gluon.jit
def _clean_keys(k_smem, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                key_layout: gl.constexpr, num_warps: gl.constexpr):
    """Zero the held K tile's non-finite entries in place (dQ = dS K must not form 0 x NaN on
    keys a row does not see); returns (any_bad, key_term), key_term (BLOCK_N,) in key_layout:
    NaN on the keys that had one, so the rows that see them still get a NaN score."""
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    k = k_smem.load(rows)
    finite = gl.abs(k.to(gl.float32)) < float("inf")  # False for NaN and +-inf
    bad = gl.max(gl.where(finite, 0, 1), 1)  # (BLOCK_N,)
    any_bad = gl.max(bad, 0) > 0
    if any_bad:
        k_smem.store(gl.where(finite, k, gl.zeros_like(k)))
        fence_async_shared()  # before the tensor cores read the cleaned tile
    key_term = gl.convert_layout(gl.where(bad > 0, float("nan"), 0.0), key_layout)
    return any_bad, key_term


@gluon.jit
def _compute_partition(dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
                       cols_smem, ds_smem, dq_smem, kv_ready, q_ready, q_empty, dq_ready,
                       dq_empty, h_kv, seqlen_q, seqlen_k, n0, band, bounds,
                       n_masked, n_tiles, scale_log2, softmax_scale,
                       GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The two consumer warpgroups: dK and dV of the held keys in registers, dQ tiles out."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, BLOCK_M, num_warps)  # S^T, dP^T (keys, queries)
    kv_layout: gl.constexpr = _acc_layout(BLOCK_N, HEAD_DIM, num_warps)  # dK, dV (keys, dims)
    dq_layout: gl.constexpr = _acc_layout(BLOCK_M, HEAD_DIM, num_warps)  # dQ (queries, dims)
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    key_axis: gl.constexpr = gl.SliceLayout(1, s_layout)
    query_axis: gl.constexpr = gl.SliceLayout(0, s_layout)

    offs_n = n0 + gl.arange(0, BLOCK_N, layout=key_axis)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    mbarrier.wait(kv_ready, 0)
    any_bad, key_term = _clean_keys(k_smem, BLOCK_N, HEAD_DIM, key_axis, num_warps)
    # the query columns 0 .. BLOCK_M - 1 in shared memory: read on masked tiles only, so the
    # compiler does not keep 16 per-thread column indices in registers across the loop
    cols_smem.store(gl.arange(0, BLOCK_M, layout=query_axis))
    partition_barrier()  # both warpgroups' halves of K cleaned before any product reads it
    for it in range(GROUP * n_tiles):
        g, t = item_tile(it, n_tiles)
        slot, parity = ring_slot(it, STAGES)
        start_m, masked = plan_tile(bounds, n_masked, t, BLOCK_M)
        q_tile = q_smem.index(slot)
        do_tile = do_smem.index(slot)
        mbarrier.wait(q_ready.index(slot), parity)
        s_t = warpgroup_mma(k_smem, q_tile.permute((1, 0)),  # S^T = K Q^T
                            gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout),
                            use_acc=False, is_async=True)
        # lse in base 2; a row that saw no key (lse = -inf) gets +inf, so its P is 0
        lse = lse_smem.index(slot).load(query_axis)
        lse = gl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
        s_t = warpgroup_mma_wait(0, deps=(s_t,))
        if any_bad:
            s_t = s_t + key_term[:, None]
        p_t = gl.exp2(s_t * scale_log2 - lse[None, :])  # (BLOCK_N, BLOCK_M)
        if masked:  # the band, the keys' end and the queries' end (rows past it read
            # another sequence's lse)
            offs_m = start_m + cols_smem.load(query_axis)
            seen = allowed(offs_m[None, :], offs_n[:, None], seqlen_k, band)
            p_t = gl.where(seen & (offs_m[None, :] < seqlen_q), p_t, 0.0)
        p_op = gl.convert_layout(p_t.to(dtype), operand)
        dv = warpgroup_mma(p_op, do_tile, dv, is_async=True)
        # retired before dP^T is issued: P^T's bf16 copy (the product's A operand) then
        # leaves the registers before dP^T's accumulator takes them (240 a thread at d128).
        # An operand in registers is a dependency of its wait: its registers stay untouched
        # until the product has read them
        dv, p_op = warpgroup_mma_wait(0, deps=(dv, p_op))
        dp_t = warpgroup_mma(v_smem, do_tile.permute((1, 0)),  # dP^T = V dO^T
                             gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout),
                             use_acc=False, is_async=True)
        delta = delta_smem.index(slot).load(query_axis)
        dp_t = warpgroup_mma_wait(0, deps=(dp_t,))
        ds_t = p_t * (dp_t - delta[None, :])
        if masked:  # masked entries never contribute (a NaN of V reaches dp_t)
            ds_t = gl.where(p_t == 0.0, 0.0, ds_t)
        ds_t = ds_t.to(dtype)
        ds_op = gl.convert_layout(ds_t, operand)
        dk = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
        # dS^T to shared memory for dQ: two buffers, so one barrier a tile keeps a
        # warpgroup from overwriting a buffer the other's dQ product still reads
        ds_buffer, _ = ring_slot(it, 2)
        ds_tile = ds_smem.index(ds_buffer)
        ds_tile.store(ds_t)
        fence_async_shared()
        partition_barrier()
        dq = warpgroup_mma(ds_tile.permute((1, 0)), k_smem,
                           gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout),
                           use_acc=False, is_async=True)
        dq, dv, dk, ds_op = warpgroup_mma_wait(0, deps=(dq, dv, dk, ds_op))
        _, staged = ring_slot(it, 1)
        mbarrier.wait(dq_empty, staged ^ 1)  # the writer has read the previous tile
        dq_smem.store(dq)
        fence_async_shared()
        partition_barrier()  # both warpgroups done with the slot and the staging tile
        mbarrier.arrive(q_empty.index(slot), count=1)
        mbarrier.arrive(dq_ready, count=1)
    # dK, dV out through the held tiles' buffers (no product reads them any more)
    k_smem.store((dk * softmax_scale).to(dtype))
    v_smem.store(dv.to(dtype))
    fence_async_shared()
    partition_barrier()
    tma_store(dk_desc, [n0, h_kv * HEAD_DIM], k_smem)
    tma_store(dv_desc, [n0, h_kv * HEAD_DIM], v_smem)
    tma.store_wait(0)


# ------------------------------------------------------------------ the kernel
@gluon.jit
def _stats_descriptor(BASE, numel, BLOCK_M: gl.constexpr):
    """A descriptor over a flat float32 buffer (lse or delta), BLOCK_M values a tile."""
    return tma.make_tensor_descriptor(BASE, shape=[numel], strides=[1], block_shape=[BLOCK_M],
                                      layout=_shared([BLOCK_M], gl.float32))


@gluon.jit
def _rows_descriptor(BASE, stride_b, stride_row, b, start, n_rows, heads,
                     HEAD_DIM: gl.constexpr, BLOCK_R: gl.constexpr):
    """A descriptor over one sequence's (n_rows, heads * HEAD_DIM) rows of a (batch, seq, head,
    head_dim) tensor whose heads are adjacent (stride HEAD_DIM): tiles [r, r + BLOCK_R) x one
    head's columns; rows past n_rows read as zero and are never written."""
    base = BASE + b.to(gl.int64) * stride_b + start.to(gl.int64) * stride_row
    return tma.make_tensor_descriptor(
        base, shape=[gl.maximum(n_rows, 1), heads * HEAD_DIM], strides=[stride_row, 1],
        block_shape=[BLOCK_R, HEAD_DIM], layout=_shared([BLOCK_R, HEAD_DIM], BASE.dtype.element_ty))


@gluon.jit
def flash_backward_ws_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, CU_SEQLENS_Q, CU_SEQLENS_K,
    stride_qb, stride_qm, stride_kb, stride_kn, stride_vb, stride_vn, stride_dob, stride_dom,
    stride_dkb, stride_dkn, stride_dvb, stride_dvn, stride_dqab, stride_dqam, stride_lb, stride_lh,
    stats_numel, seqlen_q_fixed, seqlen_k_fixed, heads_kv, window_right, scale_log2,
    softmax_scale, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, HEAVY_FIRST: gl.constexpr,
    TMA_REDUCE: gl.constexpr, DQ_WARPS: gl.constexpr, DQ_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    pid_n, b, h_kv, q_start, seqlen_q, k_start, seqlen_k, band = key_tile_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_kv, window_right,
        IS_VARLEN, HEAVY_FIRST)
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    bounds, n_masked, n_tiles = key_tile_plan(n0, seqlen_q, seqlen_k, band, BLOCK_M, BLOCK_N)
    heads_q = heads_kv * GROUP
    q_desc = _rows_descriptor(Q, stride_qb, stride_qm, b, q_start, seqlen_q, heads_q, HEAD_DIM, BLOCK_M)
    do_desc = _rows_descriptor(DO, stride_dob, stride_dom, b, q_start, seqlen_q, heads_q, HEAD_DIM, BLOCK_M)
    k_desc = _rows_descriptor(K, stride_kb, stride_kn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, BLOCK_N)
    v_desc = _rows_descriptor(V, stride_vb, stride_vn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, BLOCK_N)
    dk_desc = _rows_descriptor(DK, stride_dkb, stride_dkn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, BLOCK_N)
    dv_desc = _rows_descriptor(DV, stride_dvb, stride_dvn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, BLOCK_N)
    dq_desc = _rows_descriptor(DQ_ACC, stride_dqab, stride_dqam, b, q_start, seqlen_q, heads_q, HEAD_DIM, BLOCK_M)
    dq_base = DQ_ACC + b.to(gl.int64) * stride_dqab + q_start.to(gl.int64) * stride_dqam
    # lse and delta: flat float32 rows, (b, h) at b * stride_lb + h * stride_lh; a tile's rows
    # past its sequence read the next ones (masked tiles select them away)
    lse_desc = _stats_descriptor(LSE, stats_numel, BLOCK_M)
    delta_desc = _stats_descriptor(DELTA, stats_numel, BLOCK_M)
    stats_at = b * stride_lb + q_start

    dtype: gl.constexpr = Q.dtype.element_ty
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], _shared([BLOCK_N, BLOCK_M], dtype))
    dq_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, HEAD_DIM], dq_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    cols_smem = gl.allocate_shared_memory(gl.int32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(dq_ready, count=1)
    mbarrier.init(dq_empty, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=1)

    gl.warp_specialize([
        (_compute_partition, (dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
                              delta_smem, cols_smem, ds_smem, dq_smem, kv_ready, q_ready, q_empty,
                              dq_ready, dq_empty, h_kv, seqlen_q, seqlen_k, n0, band,
                              bounds, n_masked, n_tiles, scale_log2, softmax_scale, GROUP,
                              HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, num_warps)),
        (_load_partition, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, k_smem,
                           v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, q_ready,
                           q_empty, n0, h_kv, stats_at, stride_lh, bounds, n_masked, n_tiles,
                           GROUP, HEAD_DIM, BLOCK_M, STAGES)),
        (_dq_partition, (dq_desc, dq_base, stride_dqam, dq_smem, dq_ready, dq_empty, h_kv,
                         seqlen_q, bounds, n_masked, n_tiles, GROUP, HEAD_DIM, BLOCK_M,
                         TMA_REDUCE)),
    ], [1, DQ_WARPS], [WORKER_REGISTERS, DQ_REGS])


# ------------------------------------------------------------------ the launcher
def flash_backward_ws(q4, k4, v4, do4, lse, delta, dq_acc, dk4, dv4, *, cu_seqlens_q,
                      cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_right,
                      heads_q, heads_kv, batch, lse_strides, block_m, stages):  # fmt: skip
    """Launch the warp-specialized backward on (B, S, H, D) views (a packed call: a batch of one
    with cu_seqlens): accumulates dS K into dq_acc (float32, zeroed; the caller scales it) and
    writes dk4 (scaled) and dv4. delta = rowsum(dO * O), laid out like lse. The caller has
    checked that the call and the tile (block_m query rows, a ring of `stages` slots) are ones
    it covers (kernels/hopper/route.py)."""
    head_dim = q4.shape[-1]
    is_varlen = cu_seqlens_q is not None
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if is_varlen else (lse, lse)  # placeholders
    heavy = window_right < UNBOUNDED  # causal: key tile 0 sees every query
    grid = key_tile_grid(batch, heads_kv, max_seqlen_k, heavy, BLOCK_N)

    def batch_stride(t):
        return 0 if is_varlen else t.stride(0)

    flash_backward_ws_kernel[grid](
        q4, k4, v4, do4, lse, delta, dk4, dv4, dq_acc, cu_q, cu_k,
        batch_stride(q4), q4.stride(1), batch_stride(k4), k4.stride(1),
        batch_stride(v4), v4.stride(1), batch_stride(do4), do4.stride(1),
        batch_stride(dk4), dk4.stride(1), batch_stride(dv4), dv4.stride(1),
        batch_stride(dq_acc), dq_acc.stride(1), *lse_strides, lse.numel(),
        max_seqlen_q, max_seqlen_k, heads_kv, window_right, softmax_scale * LOG2E.value,
        softmax_scale,
        GROUP=heads_q // heads_kv, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        STAGES=stages, IS_VARLEN=is_varlen, HEAVY_FIRST=heavy, TMA_REDUCE=TMA_REDUCE,
        DQ_WARPS=1 if TMA_REDUCE else ATOMIC_WRITER["warps"],
        DQ_REGS=WORKER_REGISTERS if TMA_REDUCE else ATOMIC_WRITER["registers"],
        num_warps=CONSUMER_WARPS, maxnreg=MAX_REGISTERS,
    )  # fmt: skip
