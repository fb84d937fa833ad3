"""The attention forward for Hopper (sm_90) in Gluon: warp-specialized and persistent,
FlashAttention-3's structure. It keeps the Triton forward's semantics (kernels/flash_fwd.py,
docs/attention_semantics.md): online softmax in base 2, the output normalised once, the
log-sum-exp (natural log) saved per row for the backward.

One persistent program per SM walks a queue of work items (kernels/hopper/fwd_schedule.py): a
128-row query tile of one head of one sequence, for causal bands every head's heaviest tile
first. Three partitions, connected by mbarriers:

  loader (the default partition:  per item its Q tile (two 64-row halves, into one of two Q
  4 warps, one issuing; 40        buffers: the next item's Q arrives while this one finishes),
  registers, what the consumers   then per key tile K_t and V_t, in that order, into a K ring
  leave)                          and a V ring of STAGES slots each, with TMA (q_ready /
                                  q_empty, k_ready / k_empty, v_ready / v_empty)
  consumer 0, consumer 1          one warpgroup each (232 registers), warpgroup w owning query
  (4 warps each)                  rows [m0 + 64w, m0 + 64w + 64) of the item:
                                    S_t  = Q_w K_t^T               (wgmma, async)
                                    O   += P_{t-1} V_{t-1}         (wgmma, P from registers)
                                    P_t  = exp2(S_t scale - m)     (the online softmax)
                                  Intra-warpgroup pipelining: tile t's S_t is issued together with
                                  tile t-1's P V product, so this tile's softmax runs while the
                                  tensor cores do the last tile's second product; O is rescaled
                                  once that product retires. Ping-pong between the warpgroups:
                                  each issues its products only on its turn (turn barriers), so
                                  one warpgroup's softmax runs while the other's products occupy
                                  the tensor cores; an item's first S (no product is pending
                                  yet) goes out outside the turns, beside the other's products.
                                  S_t needs K_t, never V_t (issued in one turn with P_{t-1}
                                  V_{t-1}, it goes out once V_{t-1} has landed too, which the
                                  loader sent before K_t); a K slot is released once both
                                  warpgroups' S reading it retired, a V slot once both P V
                                  products did, the Q buffer once the item's last S did. The
                                  epilogue stages each half of O in that warpgroup's own staging
                                  tile and stores it with TMA, waiting for that store only before
                                  it writes the tile again (the next item, or the partition's
                                  end).

Every (B, S, H, D) tensor is read through one descriptor over the batch as a (rows, H * D)
matrix (kernels/hopper/route.py checks it is one): rows past a sequence's end read the next
sequence's (or zero past the last), so the masked tiles' element mask keeps their keys out, and
the output rows past a sequence's end are never written (a tail half goes out through pointer
stores with a row mask instead of TMA).

Masked entries never contribute (docs/attention_semantics.md): on the masked tiles (the causal
edge, the keys' tail) consumer 0 waits for V to land (S waited for K only), zeroes V's
non-finite entries in its ring slot and records a NaN score term for the keys that had one (a
key past the sequence's end included: the mask drops it); consumer 1 waits for that (the
cleaned barriers) before it reads the term or V. The rows that see such a key get a NaN score,
and so a NaN output, and no other row does.

Covers head_dim 64 and 128, fp16 and bf16, causal or not, GQA, fixed-length and varlen; the
rest stays on the Triton forward (kernels/hopper/route.py decides). It does not run on the
Triton interpreter: its schedule is checked on the CPU by flashtrain/lab/hopper_fwd_mirror.py,
its compiled form by flashtrain/lab/kernel_compile.py, its numbers only on a GPU.
"""

from __future__ import annotations

import triton

from flashtrain.kernels.band import allowed
from flashtrain.kernels.common import LN2, LOG2E, UNBOUNDED
from flashtrain.kernels.hopper.fwd_schedule import (
    Q_BUFFERS,
    persistent_grid,
    plan_key_tile,
    query_tile_plan,
    turn_parity,
    work_item,
)
from flashtrain.kernels.hopper.gluon_api import (
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    partition_barrier,
    tma,
    tma_load,
    tma_store,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from flashtrain.kernels.hopper.schedule import ring_slot
from flashtrain.kernels.scratch import provide_scratch_allocator
from flashtrain.kernels.tuning import sm_count

BLOCK_M = 128  # query rows a work item holds: 64 per consumer warpgroup
BLOCK_N = 128  # keys a K / V tile holds
CONSUMER_WARPS = 4  # one warpgroup a consumer (the launch's num_warps: the loader's, the same)
# setmaxnreg: each consumer's count; the loader the rest: (168 x 384 - 2 x 232 x 128) / 128 = 40
CONSUMER_REGISTERS = gl.constexpr(232)
MAX_REGISTERS = 168  # at launch: 65,536 registers / 384 threads, rounded down to a multiple of 8
SCAN_COLUMNS = gl.constexpr(16)  # V's columns consumer 0 checks at a time on masked tiles


# ------------------------------------------------------------------ layouts
@gluon.constexpr_function
def _acc_layout(cols):
    """The wgmma accumulator layout of a warpgroup's (64, cols) product."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, cols, 16])  # fmt: skip


@gluon.constexpr_function
def _shared(shape, dtype):
    return gl.NVMMASharedLayout.get_default_for(shape, dtype)


# ------------------------------------------------------------------ loader
@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                    k_empty, v_ready, v_empty, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
                    seqlen_k_fixed, heads_q, batch, window_right, GROUP: gl.constexpr,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, HEAVY_FIRST: gl.constexpr):
    """Each item's Q halves into its Q buffer, then its key tiles' K and V into their rings,
    every buffer once both consumers have released its previous use."""
    HALF: gl.constexpr = BLOCK_M // 2
    tiles_m = (seqlen_q_fixed + BLOCK_M - 1) // BLOCK_M
    kv = 0
    local = 0
    for item in range(gl.program_id(0), tiles_m * heads_q * batch, gl.num_programs(0)):
        m0, b, h, q_start, seqlen_q, k_start, seqlen_k, band = work_item(
            item, tiles_m, heads_q, batch, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
            seqlen_k_fixed, window_right, BLOCK_M, IS_VARLEN, HEAVY_FIRST)
        if m0 < seqlen_q:
            bounds, n_masked, n_tiles = query_tile_plan(m0, seqlen_k, band, BLOCK_M, BLOCK_N)
            q_row, k_row = _first_rows(b, q_start, k_start, seqlen_q_fixed, seqlen_k_fixed,
                                       IS_VARLEN)  # fmt: skip
            q_slot, q_parity = ring_slot(local, Q_BUFFERS)
            mbarrier.wait(q_empty.index(q_slot), q_parity ^ 1)  # its previous item's S retired
            ready = q_ready.index(q_slot)
            mbarrier.expect(ready, 2 * q_desc.block_type.nbytes)
            tma_load(q_desc, [q_row + m0, h * HEAD_DIM], ready, q_smem.index(2 * q_slot))
            tma_load(q_desc, [q_row + m0 + HALF, h * HEAD_DIM], ready,
                     q_smem.index(2 * q_slot + 1))  # fmt: skip
            column = (h // GROUP) * HEAD_DIM
            for t in range(n_tiles):
                start_n, masked = plan_key_tile(bounds, n_masked, t, BLOCK_N)
                # one slot index and parity for both rings: each advances once a tile
                slot, parity = ring_slot(kv + t, STAGES)
                # K first: S_t needs only K_t, and its slot frees first (once S retired)
                mbarrier.wait(k_empty.index(slot), parity ^ 1)
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                tma_load(k_desc, [k_row + start_n, column], k_ready.index(slot),
                         k_smem.index(slot))  # fmt: skip
                mbarrier.wait(v_empty.index(slot), parity ^ 1)
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                tma_load(v_desc, [k_row + start_n, column], v_ready.index(slot),
                         v_smem.index(slot))  # fmt: skip
            kv += n_tiles
            local += 1


@gluon.jit
def _first_rows(b, q_start, k_start, seqlen_q_fixed, seqlen_k_fixed, IS_VARLEN: gl.constexpr):
    """The rows of sequence b's first query and key in the descriptors' (rows, H * D) matrices."""
    if IS_VARLEN:
        q_row = q_start
        k_row = k_start
    else:
        q_row = b * seqlen_q_fixed
        k_row = b * seqlen_k_fixed
    return q_row, k_row


# ------------------------------------------------------------------ consumers
@gluon.jit
def _scan_values(v_tile, term, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Zero the V tile's non-finite entries in place (a masked row's P = 0 must not meet a NaN
    in P V) and write the keys' score term (BLOCK_N,) into `term`: NaN on the keys that had
    one, 0 elsewhere. SCAN_COLUMNS columns at a time, the term stored from the scan's own
    layout: the scores and O stay live meanwhile (a layout conversion here spilled at d128)."""
    # 8 values (16 bytes) a thread and row, the warp's lanes across the chunk's columns
    lanes: gl.constexpr = SCAN_COLUMNS // 8
    chunk: gl.constexpr = gl.BlockedLayout([1, 8], [32 // lanes, lanes], [4, 1], [1, 0])
    bad = gl.zeros([BLOCK_N], gl.int32, gl.SliceLayout(1, chunk))
    for c in gl.static_range(0, HEAD_DIM, SCAN_COLUMNS):
        x = v_tile.slice(c, SCAN_COLUMNS, dim=1).load(chunk)
        finite = gl.abs(x) < float("inf")  # False for NaN and +-inf
        bad = gl.maximum(bad, gl.max(gl.where(finite, 0, 1), 1))
    term.store(gl.where(bad > 0, float("nan"), 0.0))
    if gl.max(bad, 0) > 0:  # rare: only inputs with non-finite values pay for the rewrite
        for c in gl.static_range(0, HEAD_DIM, SCAN_COLUMNS):
            part = v_tile.slice(c, SCAN_COLUMNS, dim=1)
            x = part.load(chunk)
            part.store(gl.where(gl.abs(x) < float("inf"), x, gl.zeros_like(x)))
        fence_async_shared()  # before the tensor cores read the cleaned tile


@gluon.jit
def _masked_key_term(WG: gl.constexpr, v_tile, v_landed, v_parity, term_smem, cleaned,
                     masked_count, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     key_layout: gl.constexpr):
    """The score term of a masked tile's keys, after V's non-finite entries are zeroed: consumer
    0 waits for V to land, cleans the slot and publishes the term (term buffer and cleaned
    barrier: a ring of 2, by the count of masked tiles), consumer 1 waits for it."""
    buffer, parity = ring_slot(masked_count, 2)
    term = term_smem.index(buffer)
    if WG == 0:
        mbarrier.wait(v_landed, v_parity)  # S_t waited for K_t only
        _scan_values(v_tile, term, BLOCK_N, HEAD_DIM)
        # (the arrive's lowering syncs the warpgroup first: every thread's writes of V and the
        # term, and the fence after a rewrite, come before consumer 1 is let in)
        mbarrier.arrive(cleaned.index(buffer), count=1)
    else:
        mbarrier.wait(cleaned.index(buffer), parity)
    return term.load(key_layout)


@gluon.jit
def _softmax(WG: gl.constexpr, s, m_i, l_i, offs_m, start_n, masked, v_tile, v_landed, v_parity,
             term_smem, cleaned, masked_count, seqlen_k, band, scale_log2, BLOCK_N: gl.constexpr,
             HEAD_DIM: gl.constexpr, key_layout: gl.constexpr):
    """The online softmax of one (64, BLOCK_N) score tile: (P, m, l, alpha, masked_count),
    alpha the factor that brings the previous tiles' O and l to the new running maximum."""
    if masked:  # the band, the keys' end, and the non-finite values' NaN term
        key_term = _masked_key_term(WG, v_tile, v_landed, v_parity, term_smem, cleaned,
                                    masked_count, BLOCK_N, HEAD_DIM, key_layout)  # fmt: skip
        masked_count += 1
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=key_layout)
        seen = allowed(offs_m[:, None], offs_n[None, :], seqlen_k, band)
        s = gl.where(seen, s + key_term[None, :], float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * scale_log2)
    # a row with nothing allowed so far keeps m = -inf; shift by 0 to avoid inf - inf
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * scale_log2 - m_shift[:, None])
    alpha = gl.exp2(m_i - m_shift)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha, masked_count


@gluon.jit
def _consumer_partition(WG: gl.constexpr, O, LSE, o_desc, q_smem, k_smem, v_smem, o_smem,
                        term_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turns,
                        cleaned, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed,
                        heads_q, batch, window_right, stride_om, stride_lb, stride_lh,
                        scale_log2, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_VARLEN: gl.constexpr,
                        HEAVY_FIRST: gl.constexpr):
    """Consumer warpgroup WG: the attention of its 64 rows of every item, O and lse out."""
    HALF: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)  # S, P (rows, keys)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM)  # O (rows, dims)
    p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_axis: gl.constexpr = gl.SliceLayout(1, s_layout)
    key_axis: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_tile = o_smem.index(WG)  # this warpgroup's output staging tile (HALF, HEAD_DIM)
    tiles_m = (seqlen_q_fixed + BLOCK_M - 1) // BLOCK_M
    kv = 0
    local = 0
    turn = 0
    masked_count = 0
    for item in range(gl.program_id(0), tiles_m * heads_q * batch, gl.num_programs(0)):
        m0, b, h, q_start, seqlen_q, k_start, seqlen_k, band = work_item(
            item, tiles_m, heads_q, batch, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
            seqlen_k_fixed, window_right, BLOCK_M, IS_VARLEN, HEAVY_FIRST)
        if m0 < seqlen_q:
            bounds, n_masked, n_tiles = query_tile_plan(m0, seqlen_k, band, BLOCK_M, BLOCK_N)
            q_slot, q_parity = ring_slot(local, Q_BUFFERS)
            q_tile = q_smem.index(2 * q_slot + WG)  # this warpgroup's half (HALF, HEAD_DIM)
            mbarrier.wait(q_ready.index(q_slot), q_parity)
            offs_m = m0 + WG * HALF + gl.arange(0, HALF, layout=row_axis)  # (HALF,)
            m_i = gl.full([HALF], float("-inf"), gl.float32, row_axis)
            l_i = gl.zeros([HALF], gl.float32, row_axis)
            acc = gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout)
            if n_tiles > 0:
                # tile 0: S_0 alone and outside the ping-pong (no P V product is pending), so
                # it runs beside the other warpgroup's products
                start_n, masked = plan_key_tile(bounds, n_masked, 0, BLOCK_N)
                slot, parity = ring_slot(kv, STAGES)
                mbarrier.wait(k_ready.index(slot), parity)
                s = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)),
                                  gl.zeros([HALF, BLOCK_N], gl.float32, s_layout),
                                  use_acc=False, is_async=True)  # fmt: skip
                s = warpgroup_mma_wait(0, deps=(s,))
                mbarrier.arrive(k_empty.index(slot), count=1)  # S_0 has read K_0
                p, m_i, l_i, alpha, masked_count = _softmax(
                    WG, s, m_i, l_i, offs_m, start_n, masked, v_smem.index(slot),
                    v_ready.index(slot), parity, term_smem, cleaned, masked_count, seqlen_k,
                    band, scale_log2, BLOCK_N, HEAD_DIM, key_axis)  # fmt: skip
                p_op = gl.convert_layout(p.to(dtype), p_operand)
                for t in range(1, n_tiles):
                    start_n, masked = plan_key_tile(bounds, n_masked, t, BLOCK_N)
                    prev, prev_parity = slot, parity
                    slot, parity = ring_slot(kv + t, STAGES)
                    mbarrier.wait(k_ready.index(slot), parity)
                    # V_{t-1}, loaded before K_t, is waited for before the turn: a late copy
                    # never holds the other warpgroup's turn
                    mbarrier.wait(v_ready.index(prev), prev_parity)
                    mbarrier.wait(turns.index(WG), turn_parity(turn, WG))
                    s = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)),
                                      gl.zeros([HALF, BLOCK_N], gl.float32, s_layout),
                                      use_acc=False, is_async=True)  # fmt: skip
                    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                    mbarrier.arrive(turns.index(1 - WG), count=1)
                    turn += 1
                    s = warpgroup_mma_wait(1, deps=(s,))  # S_t done; P_{t-1} V_{t-1} may run on
                    mbarrier.arrive(k_empty.index(slot), count=1)
                    p, m_i, l_i, alpha, masked_count = _softmax(
                        WG, s, m_i, l_i, offs_m, start_n, masked, v_smem.index(slot),
                        v_ready.index(slot), parity, term_smem, cleaned, masked_count,
                        seqlen_k, band, scale_log2, BLOCK_N, HEAD_DIM, key_axis)  # fmt: skip
                    # P_{t-1}'s registers are the product's operand: a dependency of its wait
                    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
                    mbarrier.arrive(v_empty.index(prev), count=1)
                    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
                    p_op = gl.convert_layout(p.to(dtype), p_operand)
                # every S of the item has retired: its Q buffer is the loader's
                mbarrier.arrive(q_empty.index(q_slot), count=1)
                # the last tile's P V product
                mbarrier.wait(v_ready.index(slot), parity)
                mbarrier.wait(turns.index(WG), turn_parity(turn, WG))
                acc = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
                mbarrier.arrive(turns.index(1 - WG), count=1)
                turn += 1
                acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
                mbarrier.arrive(v_empty.index(slot), count=1)
                kv += n_tiles
            else:
                mbarrier.arrive(q_empty.index(q_slot), count=1)  # no key: nothing reads Q
            q_row, _ = _first_rows(b, q_start, k_start, seqlen_q_fixed, seqlen_k_fixed,
                                   IS_VARLEN)  # fmt: skip
            _epilogue(WG, O, LSE, o_desc, o_tile, acc, m_i, l_i, offs_m, q_row + m0, h, b,
                      q_start, seqlen_q, seqlen_q - m0, stride_om, stride_lb, stride_lh,
                      HEAD_DIM, HALF, o_layout)  # fmt: skip
            local += 1
    tma.store_wait(0)  # the last item's store has read o_tile before the partition ends


@gluon.jit
def _epilogue(WG: gl.constexpr, O, LSE, o_desc, o_tile, acc, m_i, l_i, offs_m, tile_row, h, b,
              q_start, seqlen_q, rows_left, stride_om, stride_lb, stride_lh,
              HEAD_DIM: gl.constexpr, HALF: gl.constexpr, o_layout: gl.constexpr):
    """O = acc / l for this warpgroup's rows and their lse; rows that saw no key get 0 and -inf.
    A half wholly inside the sequence goes out through its staging tile and one TMA store,
    waited for only before the tile is written again (the next such half, or the partition's
    end); a tail half through pointer stores of the rows it has."""
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    out = (acc / gl.convert_layout(l_safe, o_rows)[:, None]).to(o_tile.dtype)
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    first = WG * HALF  # this half's first row within the tile
    if first + HALF <= rows_left:
        # the previous item's store has read the tile (its lowering syncs the warpgroup after
        # the issuing thread's wait: every warp writes after it)
        tma.store_wait(0)
        o_tile.store(out)
        fence_async_shared()
        partition_barrier()  # every warp's part of the tile written before one thread stores
        tma_store(o_desc, [tile_row + first, h * HEAD_DIM], o_tile)
    elif first < rows_left:
        rows = gl.arange(0, HALF, layout=o_rows)
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        ptrs = O + (tile_row + first + rows[:, None]).to(gl.int64) * stride_om \
            + (h * HEAD_DIM + cols[None, :])
        gl.store(ptrs, out, mask=(first + rows < rows_left)[:, None])
    lse_base = LSE + b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + q_start
    gl.store(lse_base + offs_m, lse, mask=offs_m < seqlen_q)


# ------------------------------------------------------------------ the kernel
@gluon.jit
def flash_forward_ws_kernel(
    Q, K, V, O, LSE, CU_SEQLENS_Q, CU_SEQLENS_K, rows_q, rows_k, stride_qm, stride_km, stride_vm,
    stride_om, stride_lb, stride_lh, seqlen_q_fixed, seqlen_k_fixed, batch, heads_q,
    window_right, scale_log2,
    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, HEAVY_FIRST: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Q, O: (rows_q, heads_q * HEAD_DIM) matrices with row stride stride_qm / stride_om; K, V:
    (rows_k, heads_kv * HEAD_DIM); LSE: (b, h) at b * stride_lb + h * stride_lh, rows from the
    sequence's q_start. seqlen_q_fixed is max_seqlen_q when IS_VARLEN."""
    HALF: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = Q.dtype.element_ty
    heads_kv = heads_q // GROUP
    half_layout: gl.constexpr = _shared([HALF, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = _shared([BLOCK_N, HEAD_DIM], dtype)
    q_desc = tma.make_tensor_descriptor(Q, shape=[rows_q, heads_q * HEAD_DIM],
                                        strides=[stride_qm, 1], block_shape=[HALF, HEAD_DIM],
                                        layout=half_layout)  # fmt: skip
    o_desc = tma.make_tensor_descriptor(O, shape=[rows_q, heads_q * HEAD_DIM],
                                        strides=[stride_om, 1], block_shape=[HALF, HEAD_DIM],
                                        layout=half_layout)  # fmt: skip
    k_desc = tma.make_tensor_descriptor(K, shape=[rows_k, heads_kv * HEAD_DIM],
                                        strides=[stride_km, 1], block_shape=[BLOCK_N, HEAD_DIM],
                                        layout=kv_layout)  # fmt: skip
    v_desc = tma.make_tensor_descriptor(V, shape=[rows_k, heads_kv * HEAD_DIM],
                                        strides=[stride_vm, 1], block_shape=[BLOCK_N, HEAD_DIM],
                                        layout=kv_layout)  # fmt: skip

    q_smem = gl.allocate_shared_memory(dtype, [2 * Q_BUFFERS, HALF, HEAD_DIM], half_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    o_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], half_layout)  # a consumer's
    # (a layout of one rank less than the buffer: that of each vector the ring holds)
    term_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_N],
                                          gl.SwizzledSharedLayout(1, 1, 1, [0]))  # fmt: skip
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    cleaned = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(Q_BUFFERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumers
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
        mbarrier.init(cleaned.index(i), count=1)

    # no starred arguments in Gluon: each partition's list written out
    # the loader is the default partition (the launch's 4 warps, one of which issues): then
    # the two consumer warpgroups are workers whose registers are named, and the loader's are
    # what is left, so the three together never ask for more than the launch holds (a 1-warp
    # worker's warpgroup is counted as one warp when the default's share is worked out, and
    # the setmaxnreg increases then ask for more than the pool has)
    gl.warp_specialize([
        (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty,
                           k_ready, k_empty, v_ready, v_empty, CU_SEQLENS_Q, CU_SEQLENS_K,
                           seqlen_q_fixed, seqlen_k_fixed, heads_q, batch, window_right, GROUP,
                           HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_VARLEN, HEAVY_FIRST)),
        (_consumer_partition, (gl.constexpr(0), O, LSE, o_desc, q_smem, k_smem, v_smem, o_smem,
                               term_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                               turns, cleaned, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
                               seqlen_k_fixed, heads_q, batch, window_right, stride_om,
                               stride_lb, stride_lh, scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N,
                               STAGES, IS_VARLEN, HEAVY_FIRST)),
        (_consumer_partition, (gl.constexpr(1), O, LSE, o_desc, q_smem, k_smem, v_smem, o_smem,
                               term_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                               turns, cleaned, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
                               seqlen_k_fixed, heads_q, batch, window_right, stride_om,
                               stride_lb, stride_lh, scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N,
                               STAGES, IS_VARLEN, HEAVY_FIRST)),
    ], [num_warps, num_warps], [CONSUMER_REGISTERS, CONSUMER_REGISTERS])  # fmt: skip


# ------------------------------------------------------------------ the launcher
def flash_forward_ws(q4, k4, v4, o4, lse, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, window_right, shapes, stages):  # fmt: skip
    """Launch the Gluon forward on (B, S, H, D) views (a packed call: a batch of one with
    cu_seqlens): writes o4 and lse (float32, natural log; shapes.lse_strides). shapes: the
    call's kernels/launch_args.call_shapes. The caller has checked that the call and the ring
    depth `stages` are ones it covers (kernels/hopper/route.py)."""
    is_varlen = cu_seqlens_q is not None
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if is_varlen else (lse, lse)  # placeholders
    items = triton.cdiv(max_seqlen_q, BLOCK_M) * shapes.heads_q * shapes.batch
    rows_q, rows_k = q4.shape[0] * q4.shape[1], k4.shape[0] * k4.shape[1]
    if items == 0 or rows_q == 0:
        return
    grid = persistent_grid(items, sm_count(q4.device))
    provide_scratch_allocator()  # the device-side descriptors' scratch, in this thread
    flash_forward_ws_kernel[grid](
        q4, k4, v4, o4, lse, cu_q, cu_k, rows_q, max(rows_k, 1), q4.stride(1), k4.stride(1),
        v4.stride(1), o4.stride(1), *shapes.lse_strides, max_seqlen_q, max_seqlen_k,
        shapes.batch, shapes.heads_q, window_right, softmax_scale * LOG2E.value,
        GROUP=shapes.heads_q // shapes.heads_kv, HEAD_DIM=shapes.head_dim, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, STAGES=stages, IS_VARLEN=is_varlen,
        HEAVY_FIRST=window_right < UNBOUNDED, num_warps=CONSUMER_WARPS, maxnreg=MAX_REGISTERS,
    )  # fmt: skip
