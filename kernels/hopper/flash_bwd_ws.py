"""The attention backward for Hopper (sm_90) in Gluon: warp-specialized, FlashAttention-3's
structure. dK, dV and dQ in one pass; P is recomputed from Q, K and the saved lse, as in the
Triton kernels (kernels/flash_bwd*.py), whose semantics it keeps (docs/attention_semantics.md).

One program holds a key tile of BLOCK_N = 128 keys of one kv head and streams past it the query
tiles that see it, for each query head of the kv head's group in turn (kernels/hopper/schedule.py
says which, in what order). Four partitions, connected by mbarriers:

  consumer 0, consumer 1     one warpgroup each (240 registers); warpgroup w owns keys
  (4 warps each; consumer 0  [64w, 64w + 64) of the tile, K and V held as two 64-row halves:
  is the default partition)    S^T  = K_w Q^T - lse / scale       } issued back to back
                               dP^T = V_w dO^T - delta            } (accumulators start there)
                               P^T  = exp2(S^T scale log2e)       while dP^T runs
                               dV  += P^T dO                      (P^T from registers)
                               dS^T = P^T dP^T                    while dV runs
                               dK  += dS^T Q                      (dS^T from registers)
                               dQ[:, w half of the columns] = dS K over the 128 keys: both
                                 warpgroups' dS^T halves (shared memory, a pair of buffers
                                 an item, ds_ready) and both halves of K
                             FlashAttention-3's overlap: a product waited for only when its
                             result is next needed, one group left in flight (wait(1)) after
                             S^T, dP^T and dV; the item's one full drain (wait(0)) retires dK
                             and dQ together. Each warpgroup has its own dQ staging tile and
                             barrier pair (dq_ready / dq_empty): nothing but the dS^T halves
                             makes one wait for the other
  loader (1 warp)            K and V once; then Q, dO and their rows' lse and delta of every
                             item into a ring of STAGES shared-memory slots, with TMA
                             (q_ready / q_empty: both consumers release a slot)
  dQ writer (1 warp)         adds each warpgroup's half of each dQ tile into a float32
                             accumulator in global memory, in item order: one TMA bulk
                             reduce-add where Gluon has it (Triton after 3.6); under Triton 3.6
                             (2 warps) per-element fp32 atomics from the staging tile
                             (gluon_api.TMA_REDUCE)

The loader and the dQ writer share the third warpgroup, so they ask for one register count (24):
setmaxnreg is warpgroup-wide.

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
HALF = gl.constexpr(BLOCK_N // 2)  # keys a consumer warpgroup owns
CONSUMER_WARPS = 4  # a consumer partition: one warpgroup (the launch's num_warps: consumer 0's)
# setmaxnreg of the worker partitions: consumer 1, then the loader and the dQ writer, which share
# one warpgroup and so ask for one count (setmaxnreg is warpgroup-wide: two counts in one
# warpgroup leave its warps disagreeing). Consumer 0, the default partition, gets what is left
# of the launch's registers: (168 x 384 - 128 x (240 + 24)) / 128 = 240
CONSUMER_REGISTERS = gl.constexpr(240)
WORKER_REGISTERS = gl.constexpr(24)
# Triton 3.6's dQ writer adds per element (no bulk reduce-add in its Gluon): two warps, 4 values
# and their addresses a thread, in the same 24 registers
ATOMIC_WRITER_WARPS = 2
MAX_REGISTERS = 168  # at launch: 65,536 registers / 384 threads, rounded down to a multiple of 8


# ------------------------------------------------------------------ layouts
@gluon.constexpr_function
def _acc_layout(cols):
    """The wgmma accumulator layout of one warpgroup's (rows, cols) product (rows a multiple of
    64: one 64-row instruction a repetition)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, cols, 16])  # fmt: skip


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
    """K and V once, a 64-row half per consumer warpgroup; then Q, dO and their rows' lse and
    delta of every item into its ring slot once both consumers released the slot's previous
    item. stats_at: the offset of (b, head 0, q_start) in lse and delta."""
    mbarrier.expect(kv_ready, 4 * k_desc.block_type.nbytes)
    for w in gl.static_range(2):
        tma_load(k_desc, [n0 + w * HALF, h_kv * HEAD_DIM], kv_ready, k_smem.index(w))
        tma_load(v_desc, [n0 + w * HALF, h_kv * HEAD_DIM], kv_ready, v_smem.index(w))
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
    """Add each item's dQ tile (float32, unscaled) into the accumulator, in item order: each
    consumer warpgroup's columns from its own staging tile, as soon as that one is staged.
    DQ_ACC: the accumulator's first element of this sequence (row q_start, head 0)."""
    COLS_Q: gl.constexpr = HEAD_DIM // 2  # a warpgroup's columns of the tile
    # the per-element path walks a staging tile in (8, 32) chunks, one swizzle atom of the
    # float32 tile (8 rows of 128 bytes); a warp's add covers 32 adjacent floats of one row
    ROWS: gl.constexpr = 8
    COLS: gl.constexpr = 32
    chunk: gl.constexpr = gl.BlockedLayout([ROWS // gl.num_warps(), 1], [1, 32],
                                           [gl.num_warps(), 1], [1, 0])
    # one flat loop over (item, warpgroup) pairs: a body unrolled per warpgroup held twice the
    # addresses and spilled under Triton 3.6
    for j in range(2 * GROUP * n_tiles):
        it = j // 2
        w = j - 2 * it  # the staging tile of warpgroup w: this item's columns [w D/2, D/2)
        g, t = item_tile(it, n_tiles)
        h = h_kv * GROUP + g
        start_m, masked = plan_tile(bounds, n_masked, t, BLOCK_M)
        _, staged = ring_slot(it, 1)  # each staging tile: a ring of one
        staging = dq_smem.index(w)
        mbarrier.wait(dq_ready.index(w), staged)
        column = h * HEAD_DIM + w * COLS_Q
        if TMA_REDUCE:  # one bulk reduce-add; rows past the sequence are dropped
            tma_reduce_add(dq_desc, [start_m, column], staging)
            tma.store_wait(0)  # the staging tile has been read
        else:
            rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, chunk))[:, None]
            cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, chunk))[None, :]
            # one pointer a value, walked down the tile: few addresses live at a time
            ptrs = DQ_ACC + start_m.to(gl.int64) * stride_dqam + column \
                + (rows * stride_dqam + cols)
            for r in gl.static_range(0, BLOCK_M, ROWS):
                keep = rows < seqlen_q - start_m - r
                for c in gl.static_range(0, COLS_Q, COLS):
                    part = staging.slice(r, ROWS, dim=0).slice(c, COLS, dim=1).load(chunk)
                    gl.atomic_add(ptrs + c, part, mask=keep, sem="relaxed")
                ptrs += ROWS * stride_dqam
        mbarrier.arrive(dq_empty.index(w), count=1)


@gluon.jit
def _clean_keys(k_half, term, HEAD_DIM: gl.constexpr):
    """Zero the held K half's non-finite entries in place (dQ = dS K must not form 0 x NaN on
    keys a row does not see) and write the keys' score term into `term` (HALF,): NaN on the
    keys that had one, so the rows that see them still get a NaN score, 0 elsewhere. Returns
    whether any key had one. The term stays in shared memory, read only where one had: two
    registers a thread less across the loop (d128 with GQA spilled without them)."""
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    k = k_half.load(rows)
    finite = gl.abs(k.to(gl.float32)) < float("inf")  # False for NaN and +-inf
    bad = gl.max(gl.where(finite, 0, 1), 1)  # (HALF,)
    any_bad = gl.max(bad, 0) > 0
    if any_bad:
        k_half.store(gl.where(finite, k, gl.zeros_like(k)))
        fence_async_shared()  # before the tensor cores read the cleaned half
    term.store(gl.where(bad > 0, float("nan"), 0.0))
    return any_bad


@gluon.jit
def _consumer_item(WG: gl.constexpr, it, dk, dv, any_bad, term, cols, n0, k_smem, v_smem, q_smem,
                   do_smem, lse_smem, delta_smem, ds_smem, dq_smem, q_ready, q_empty, ds_ready,
                   dq_ready, dq_empty, seqlen_q, seqlen_k, band,
                   bounds, n_masked, n_tiles, scale_log2, softmax_scale,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warpgroup WG on item `it`: the products of its 64 keys into dK and dV, its half
    of the item's dS^T, and its half of the dQ tile's columns (from both warpgroups' halves of
    dS^T) out through its own staging tile. Returns dK and dV, nothing left in flight."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_M)  # S^T, dP^T: (64 keys, BLOCK_M queries)
    kv_layout: gl.constexpr = _acc_layout(HEAD_DIM)  # dK, dV (64 keys, dims); dQ (queries, dims)
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    key_axis: gl.constexpr = gl.SliceLayout(1, s_layout)
    query_axis: gl.constexpr = gl.SliceLayout(0, s_layout)
    g, t = item_tile(it, n_tiles)
    slot, parity = ring_slot(it, STAGES)
    start_m, masked = plan_tile(bounds, n_masked, t, BLOCK_M)
    pair, pair_parity = ring_slot(it, 2)  # its pair of dS^T buffers and their ds_ready phase
    q_tile = q_smem.index(slot)
    do_tile = do_smem.index(slot)
    mbarrier.wait(q_ready.index(slot), parity)
    # S^T and dP^T issued back to back, so P^T is computed while dP^T runs. Their accumulators
    # start at -lse / scale and -delta: the products add onto them, so neither row statistic
    # (16 values a thread in this layout) stays live in registers across a product
    lse = lse_smem.index(slot).load(query_axis)
    # a row that saw no key (lse = -inf) gets +inf, so its P is 0
    lse = gl.where(lse == float("-inf"), float("inf"), lse) / softmax_scale
    s_t = warpgroup_mma(k_smem.index(WG), q_tile.permute((1, 0)),  # S^T - lse / scale
                        gl.zeros([HALF, BLOCK_M], gl.float32, s_layout) - lse[None, :],
                        is_async=True)  # fmt: skip
    delta = delta_smem.index(slot).load(query_axis)
    dp_t = warpgroup_mma(v_smem.index(WG), do_tile.permute((1, 0)),  # dP^T - delta
                         gl.zeros([HALF, BLOCK_M], gl.float32, s_layout) - delta[None, :],
                         is_async=True)  # fmt: skip
    s_t = warpgroup_mma_wait(1, deps=(s_t,))  # S^T retired, dP^T in flight
    if any_bad:
        s_t = s_t + term.load(key_axis)[:, None]
    p_t = gl.exp2(s_t * scale_log2)  # (HALF, BLOCK_M): exp2(S^T scale log2e - lse log2e)
    if masked:  # the band, the keys' end and the queries' end (rows past it read another
        # sequence's lse)
        offs_m = start_m + cols.load(query_axis)
        offs_n = n0 + WG * HALF + cols.slice(0, HALF).load(key_axis)
        seen = allowed(offs_m[None, :], offs_n[:, None], seqlen_k, band)
        p_t = gl.where(seen & (offs_m[None, :] < seqlen_q), p_t, 0.0)
    p_op = gl.convert_layout(p_t.to(dtype), operand)
    dv = warpgroup_mma(p_op, do_tile, dv, is_async=True)  # dV += P^T dO
    dp_t = warpgroup_mma_wait(1, deps=(dp_t,))  # dP^T - delta retired, dV in flight
    ds_t = p_t * dp_t
    if masked:  # masked entries never contribute (a NaN of V reaches dp_t)
        ds_t = gl.where(p_t == 0.0, 0.0, ds_t)
    ds_t = ds_t.to(dtype)
    # this warpgroup's half of the item's dS^T. Both halves of the pair were last read by
    # both warpgroups' dQ products of item it - 2: this one retired its own, and the other
    # retired its own before it arrived on ds_ready for item it - 1, which this one waited for
    ds_smem.index(2 * pair + WG).store(ds_t)
    fence_async_shared()  # before the tensor cores read it
    mbarrier.arrive(ds_ready.index(pair), count=1)  # (the lowering syncs the warps first)
    ds_op = gl.convert_layout(ds_t, operand)
    dk = warpgroup_mma(ds_op, q_tile, dk, is_async=True)  # dK += dS^T Q
    # dV retired, dK in flight. An operand in registers is a dependency of its wait: its
    # registers stay untouched until the product has read them
    dv, p_op = warpgroup_mma_wait(1, deps=(dv, p_op))
    # this warpgroup's columns of the dQ tile = dS K[:, cols] over the 128 keys: both halves
    # of dS^T, both of K
    mbarrier.wait(ds_ready.index(pair), pair_parity)
    cols_q: gl.constexpr = HEAD_DIM // 2
    dq = warpgroup_mma(ds_smem.index(2 * pair).permute((1, 0)),
                       k_smem.index(0).slice(WG * cols_q, cols_q, dim=1),
                       gl.zeros([BLOCK_M, cols_q], gl.float32, _acc_layout(cols_q)),
                       use_acc=False, is_async=True)  # fmt: skip
    dq = warpgroup_mma(ds_smem.index(2 * pair + 1).permute((1, 0)),
                       k_smem.index(1).slice(WG * cols_q, cols_q, dim=1), dq,
                       is_async=True)  # fmt: skip
    dq, dk, ds_op = warpgroup_mma_wait(0, deps=(dq, dk, ds_op))
    staging = dq_smem.index(WG)
    _, staged = ring_slot(it, 1)  # the staging tile: a ring of one
    mbarrier.wait(dq_empty.index(WG), staged ^ 1)  # the writer took its last tile
    staging.store(dq)
    fence_async_shared()
    mbarrier.arrive(dq_ready.index(WG), count=1)
    mbarrier.arrive(q_empty.index(slot), count=1)  # both consumers: count 2
    return dk, dv


@gluon.jit
def _consumer_partition(WG: gl.constexpr, dk_desc, dv_desc, k_smem, v_smem, q_smem, do_smem,
                        lse_smem, delta_smem, cols_smem, terms_smem, ds_smem, dq_smem, kv_ready,
                        q_ready, q_empty, ds_ready, dq_ready, dq_empty, keys_done, h_kv, seqlen_q,
                        seqlen_k, n0, band, bounds, n_masked, n_tiles, scale_log2, softmax_scale,
                        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                        STAGES: gl.constexpr):
    """Consumer warpgroup WG: dK and dV of its 64 keys in registers, half of every dQ tile's
    columns out through its staging tile, then dK and dV out."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_M)
    kv_layout: gl.constexpr = _acc_layout(HEAD_DIM)
    query_axis: gl.constexpr = gl.SliceLayout(0, s_layout)
    k_half = k_smem.index(WG)  # (64, HEAD_DIM): this warpgroup's keys
    v_half = v_smem.index(WG)
    dk = gl.zeros([HALF, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([HALF, HEAD_DIM], gl.float32, kv_layout)
    mbarrier.wait(kv_ready, 0)
    # its own half of K cleaned; the other warpgroup's dQ products read it only after this
    # one's first arrival on ds_ready, which follows in program order
    term = terms_smem.index(WG)
    any_bad = _clean_keys(k_half, term, HEAD_DIM)
    # 0 .. BLOCK_M - 1 in shared memory, the masked tiles' query and key offsets: read there
    # only, so the compiler does not keep 16 per-thread indices in registers across the loop
    cols = cols_smem.index(WG)
    cols.store(gl.arange(0, BLOCK_M, layout=query_axis))
    partition_barrier()  # the tables written by every warp before any reads them
    for it in range(GROUP * n_tiles):
        dk, dv = _consumer_item(WG, it, dk, dv, any_bad, term, cols, n0, k_smem, v_smem,
                                q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem,
                                q_ready, q_empty, ds_ready, dq_ready, dq_empty, seqlen_q,
                                seqlen_k, band, bounds, n_masked, n_tiles, scale_log2,
                                softmax_scale, HEAD_DIM, BLOCK_M, STAGES)  # fmt: skip
    # dV, then dK out through the held halves' buffers. V's half is this warpgroup's alone;
    # K's halves are read by both warpgroups' dQ products until both are done (keys_done)
    v_half.store(dv.to(dtype))
    mbarrier.arrive(keys_done, count=1)
    mbarrier.wait(keys_done, 0)
    k_half.store((dk * softmax_scale).to(dtype))
    fence_async_shared()
    partition_barrier()  # every warp's part of both tiles written before one thread stores
    tma_store(dv_desc, [n0 + WG * HALF, h_kv * HEAD_DIM], v_half)
    tma_store(dk_desc, [n0 + WG * HALF, h_kv * HEAD_DIM], k_half)
    tma.store_wait(0)


# ------------------------------------------------------------------ the kernel
@gluon.jit
def _stats_descriptor(BASE, numel, BLOCK_M: gl.constexpr):
    """A descriptor over a flat float32 buffer (lse or delta), BLOCK_M values a tile."""
    return tma.make_tensor_descriptor(BASE, shape=[numel], strides=[1], block_shape=[BLOCK_M],
                                      layout=_shared([BLOCK_M], gl.float32))


@gluon.jit
def _rows_descriptor(BASE, stride_b, stride_row, b, start, n_rows, heads,
                     HEAD_DIM: gl.constexpr, BLOCK_R: gl.constexpr, BLOCK_C: gl.constexpr):
    """A descriptor over one sequence's (n_rows, heads * HEAD_DIM) rows of a (batch, seq, head,
    head_dim) tensor whose heads are adjacent (stride HEAD_DIM): tiles [r, r + BLOCK_R) x
    BLOCK_C of a head's columns; rows past n_rows read as zero and are never written."""
    base = BASE + b.to(gl.int64) * stride_b + start.to(gl.int64) * stride_row
    return tma.make_tensor_descriptor(
        base, shape=[gl.maximum(n_rows, 1), heads * HEAD_DIM], strides=[stride_row, 1],
        block_shape=[BLOCK_R, BLOCK_C], layout=_shared([BLOCK_R, BLOCK_C], BASE.dtype.element_ty))


@gluon.jit
def flash_backward_ws_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, CU_SEQLENS_Q, CU_SEQLENS_K,
    stride_qb, stride_qm, stride_kb, stride_kn, stride_vb, stride_vn, stride_dob, stride_dom,
    stride_dkb, stride_dkn, stride_dvb, stride_dvn, stride_dqab, stride_dqam, stride_lb, stride_lh,
    stats_numel, seqlen_q_fixed, seqlen_k_fixed, heads_kv, window_right, scale_log2,
    softmax_scale, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, HEAVY_FIRST: gl.constexpr,
    TMA_REDUCE: gl.constexpr, DQ_WARPS: gl.constexpr, num_warps: gl.constexpr,
):
    pid_n, b, h_kv, q_start, seqlen_q, k_start, seqlen_k, band = key_tile_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_kv, window_right,
        IS_VARLEN, HEAVY_FIRST)
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    bounds, n_masked, n_tiles = key_tile_plan(n0, seqlen_q, seqlen_k, band, BLOCK_M, BLOCK_N)
    heads_q = heads_kv * GROUP
    q_desc = _rows_descriptor(Q, stride_qb, stride_qm, b, q_start, seqlen_q, heads_q, HEAD_DIM, BLOCK_M, HEAD_DIM)
    do_desc = _rows_descriptor(DO, stride_dob, stride_dom, b, q_start, seqlen_q, heads_q, HEAD_DIM, BLOCK_M, HEAD_DIM)
    # K, V, dK, dV in 64-row halves, one per consumer warpgroup
    k_desc = _rows_descriptor(K, stride_kb, stride_kn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, HALF, HEAD_DIM)
    v_desc = _rows_descriptor(V, stride_vb, stride_vn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, HALF, HEAD_DIM)
    dk_desc = _rows_descriptor(DK, stride_dkb, stride_dkn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, HALF, HEAD_DIM)
    dv_desc = _rows_descriptor(DV, stride_dvb, stride_dvn, b, k_start, seqlen_k, heads_kv, HEAD_DIM, HALF, HEAD_DIM)
    dq_desc = _rows_descriptor(DQ_ACC, stride_dqab, stride_dqam, b, q_start, seqlen_q, heads_q, HEAD_DIM, BLOCK_M, HEAD_DIM // 2)
    dq_base = DQ_ACC + b.to(gl.int64) * stride_dqab + q_start.to(gl.int64) * stride_dqam
    # lse and delta: flat float32 rows, (b, h) at b * stride_lb + h * stride_lh; a tile's rows
    # past its sequence read the next ones (masked tiles select them away)
    lse_desc = _stats_descriptor(LSE, stats_numel, BLOCK_M)
    delta_desc = _stats_descriptor(DELTA, stats_numel, BLOCK_M)
    stats_at = b * stride_lb + q_start

    dtype: gl.constexpr = Q.dtype.element_ty
    k_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    # dS^T: two pairs of buffers (an item's pair: ring_slot(it, 2)), a 64-key half from either
    # warpgroup each: buffer 2 * pair + w
    ds_smem = gl.allocate_shared_memory(dtype, [4, HALF, BLOCK_M], _shared([HALF, BLOCK_M], dtype))
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], dq_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    cols_smem = gl.allocate_shared_memory(gl.int32, [2, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    terms_smem = gl.allocate_shared_memory(gl.float32, [2, HALF], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    keys_done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(keys_done, count=2)  # both consumers
    for s in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=2)
    for w in gl.static_range(2):
        mbarrier.init(ds_ready.index(w), count=2)
        mbarrier.init(dq_ready.index(w), count=1)
        mbarrier.init(dq_empty.index(w), count=1)

    # no starred arguments in Gluon: each partition's list written out. Consumer 0 is the
    # default partition (the launch's 4 warps); consumer 1 a worker warpgroup; the loader and
    # the dQ writer share the third warpgroup
    gl.warp_specialize([
        (_consumer_partition, (gl.constexpr(0), dk_desc, dv_desc, k_smem, v_smem, q_smem,
                               do_smem, lse_smem, delta_smem, cols_smem, terms_smem, ds_smem,
                               dq_smem, kv_ready, q_ready, q_empty, ds_ready, dq_ready, dq_empty,
                               keys_done, h_kv, seqlen_q, seqlen_k, n0, band, bounds, n_masked,
                               n_tiles, scale_log2, softmax_scale, GROUP, HEAD_DIM, BLOCK_M,
                               STAGES)),
        (_consumer_partition, (gl.constexpr(1), dk_desc, dv_desc, k_smem, v_smem, q_smem,
                               do_smem, lse_smem, delta_smem, cols_smem, terms_smem, ds_smem,
                               dq_smem, kv_ready, q_ready, q_empty, ds_ready, dq_ready, dq_empty,
                               keys_done, h_kv, seqlen_q, seqlen_k, n0, band, bounds, n_masked,
                               n_tiles, scale_log2, softmax_scale, GROUP, HEAD_DIM, BLOCK_M,
                               STAGES)),
        (_load_partition, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, k_smem,
                           v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, q_ready,
                           q_empty, n0, h_kv, stats_at, stride_lh, bounds, n_masked, n_tiles,
                           GROUP, HEAD_DIM, BLOCK_M, STAGES)),
        (_dq_partition, (dq_desc, dq_base, stride_dqam, dq_smem, dq_ready, dq_empty, h_kv,
                         seqlen_q, bounds, n_masked, n_tiles, GROUP, HEAD_DIM, BLOCK_M,
                         TMA_REDUCE)),
    ], [num_warps, 1, DQ_WARPS],
        [CONSUMER_REGISTERS, WORKER_REGISTERS, WORKER_REGISTERS])  # fmt: skip


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
        DQ_WARPS=1 if TMA_REDUCE else ATOMIC_WRITER_WARPS,
        num_warps=CONSUMER_WARPS, maxnreg=MAX_REGISTERS,
    )  # fmt: skip
