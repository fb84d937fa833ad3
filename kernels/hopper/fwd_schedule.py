"""The Gluon forward's schedule: which work items a persistent program takes, in what order, which
key tiles each streams, and which ring slot, barrier parity and ping-pong turn each one uses.

Written once, as @triton.jit functions of scalars, and called from two places:
  - the Gluon kernel (flash_fwd_ws.py): every partition (the loader and both consumer
    warpgroups) walks the same items and key tiles in the same order, each computing them from
    these functions and its own running counts;
  - `schedule_probe_kernel` below, a plain Triton kernel that writes what these functions say for
    every program into a table. It runs under TRITON_INTERPRET=1 on the CPU, where the Gluon
    kernel cannot, and the PyTorch mirror of the kernel (flashtrain/lab/hopper_fwd_mirror.py)
    computes the forward by that table: a wrong index here gives a wrong output there.

A work item is a BLOCK_M = 128-row query tile of one query head of one sequence; consumer
warpgroup w owns its rows [m0 + 64w, m0 + 64w + 64). The persistent program `pid` of `programs`
takes items pid, pid + programs, ... of the queue (kernels/common.py queue_position: for causal
bands every head's heaviest tile first, FlashAttention-3's longest-first order). An item past its
sequence's end (varlen) is skipped by every partition alike. An item streams the key tiles of its
visit plan (kernels/visit_plan.py): the element-masked ones first (causal edge, the keys' tail),
then the unmasked middle.

Running counts a partition carries across its items, and what they index:
    kv      key tiles streamed so far     the K ring and the V ring alike: ring_slot(kv, STAGES)
                                          (each advances once a tile: one slot, one parity)
    local   items taken so far            the Q buffers: ring_slot(local, Q_BUFFERS)
    turn    ping-pong issues so far       the turn barriers: n_tiles an item. An item's first
                                          S is issued outside the ping-pong; its issue
                                          t < n_tiles - 1 is S_{t+1} with P_t V_t, the last is
                                          P V of the last tile alone, so key tile t's P V goes
                                          out on turn `turn + t`
    masked  masked tiles so far           the cleaned-V handshake: ring_slot(masked, 2)
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import key_block_range
from flashtrain.kernels.common import UNBOUNDED, pair_bounds, queue_position
from flashtrain.kernels.hopper.schedule import plan_tile
from flashtrain.kernels.visit_plan import segment_tiles

_NO_TABLES = tl.constexpr(0)  # the slots of a dense visit plan's calls (no block-sparse tables)
_LEFT = tl.constexpr(UNBOUNDED)  # the band's left side: no window
Q_BUFFERS = tl.constexpr(2)  # the next item's Q loads while this one finishes


def persistent_grid(items: int, sms: int) -> tuple[int]:
    """One program per SM, or per item where there are fewer."""
    return (max(1, min(items, sms)),)


@triton.jit
def work_item(item, tiles_m, heads_q, batch, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
              seqlen_k_fixed, window_right, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr,
              HEAVY_FIRST: tl.constexpr):
    """(m0, b, h, q_start, seqlen_q, k_start, seqlen_k, band) of queue item `item`: the first
    query row of its tile, its sequence and query head, the sequence's bounds and its band
    (diag, left, right) of kernels/band.py with left unbounded (causal: right = 0)."""
    tile, b, h = queue_position(item, tiles_m, heads_q, batch, HEAVY_FIRST)
    q_start, seqlen_q, k_start, seqlen_k = pair_bounds(
        CU_SEQLENS_Q, CU_SEQLENS_K, b, seqlen_q_fixed, seqlen_k_fixed, IS_VARLEN)
    band = (seqlen_k - seqlen_q, _LEFT, window_right)
    return tile * BLOCK_M, b, h, q_start, seqlen_q, k_start, seqlen_k, band


@triton.jit
def query_tile_plan(m0, seqlen_k, band, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(bounds, n_masked, n_tiles): the key range of query tile m0 (band.key_block_range) and
    how many BLOCK_N-key tiles it streams, the first n_masked masked."""
    bounds = key_block_range(m0, seqlen_k, band, BLOCK_M, BLOCK_N)
    tables = (_NO_TABLES, _NO_TABLES, _NO_TABLES, _NO_TABLES)
    at = (_NO_TABLES, _NO_TABLES)
    n_masked = segment_tiles(bounds, tables, at, 0, False, 1, BLOCK_N)
    n_tiles = n_masked + segment_tiles(bounds, tables, at, 1, False, 1, BLOCK_N)
    return bounds, n_masked, n_tiles


# (start_n, masked) of key tile t of a plan: the masked segment's tiles, then the middle; the
# backward's plan_tile, whose block is the streamed tile's (here BLOCK_N keys)
plan_key_tile = plan_tile


@triton.jit
def turn_parity(turn, WG: tl.constexpr):
    """The parity warpgroup WG waits for on its turn barrier before its `turn`-th ping-pong
    issue (items' first S GEMMs not counted). Warpgroup 0 goes first (its first wait passes on
    a fresh barrier: the phase before it, parity 1, counts as complete) and then waits for
    warpgroup 1's issue `turn` - 1; warpgroup 1 waits for warpgroup 0's issue `turn`."""
    if WG == 0:
        parity = (turn & 1) ^ 1
    else:
        parity = turn & 1
    return parity


# Columns of the probe's table, one row per (program, event): an item's header row (kind 0:
# start_n, masked and the ring columns -1) or one of its key tiles (kind 1). Row 0 of a program
# holds its row count in the "item" column. kv_slot / kv_parity: the tile's slot and phase in the
# K ring and in the V ring; turn: an item's first ping-pong issue, a tile's P V issue.
PROBE_COLUMNS = ("kind", "item", "b", "h", "m0", "q_start", "seqlen_q", "k_start", "seqlen_k",
                 "n_tiles", "start_n", "masked", "q_slot", "q_parity", "kv_slot", "kv_parity",
                 "turn", "clean_slot", "clean_parity")  # fmt: skip


@triton.jit
def _probe_row(base, row, values, COLUMNS: tl.constexpr):
    for c in tl.static_range(COLUMNS):
        tl.store(base + (row + 1) * COLUMNS + c, values[c])


@triton.jit
def schedule_probe_kernel(
    OUT, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_q, batch,
    window_right, max_rows,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, IS_VARLEN: tl.constexpr,
    HEAVY_FIRST: tl.constexpr, COLUMNS: tl.constexpr,
):
    """Writes the schedule of persistent program `program_id(0)` (of the Gluon kernel's grid)
    into OUT (programs, max_rows + 1, COLUMNS) int32: row 0 its row count, then its events in
    the order every partition walks them (module docstring). The counts run as the kernel's
    partitions run them."""
    base = OUT + tl.program_id(0).to(tl.int64) * (max_rows + 1) * COLUMNS
    tiles_m = tl.cdiv(seqlen_q_fixed, BLOCK_M)
    row = 0
    kv = 0
    local = 0
    turn = 0
    masked_count = 0
    for item in range(tl.program_id(0), tiles_m * heads_q * batch, tl.num_programs(0)):
        m0, b, h, q_start, seqlen_q, k_start, seqlen_k, band = work_item(
            item, tiles_m, heads_q, batch, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed,
            seqlen_k_fixed, window_right, BLOCK_M, IS_VARLEN, HEAVY_FIRST)
        if m0 < seqlen_q:
            bounds, n_masked, n_tiles = query_tile_plan(m0, seqlen_k, band, BLOCK_M, BLOCK_N)
            q_slot = local % Q_BUFFERS
            q_parity = (local // Q_BUFFERS) & 1
            _probe_row(base, row, (0, item, b, h, m0, q_start, seqlen_q, k_start, seqlen_k,
                                   n_tiles, -1, -1, q_slot, q_parity, -1, -1, turn, -1, -1),
                       COLUMNS)  # fmt: skip
            row += 1
            for t in range(n_tiles):
                start_n, masked = plan_key_tile(bounds, n_masked, t, BLOCK_N)
                clean_slot = tl.where(masked, masked_count % 2, -1)
                clean_parity = tl.where(masked, (masked_count // 2) & 1, -1)
                _probe_row(base, row, (1, item, b, h, m0, q_start, seqlen_q, k_start, seqlen_k,
                                       n_tiles, start_n, masked.to(tl.int32), q_slot, q_parity,
                                       kv % STAGES, (kv // STAGES) & 1, turn + t, clean_slot,
                                       clean_parity), COLUMNS)  # fmt: skip
                row += 1
                kv += 1
                masked_count += masked.to(tl.int32)
            turn += n_tiles  # the consumers' issues in turn (module docstring)
            local += 1
    tl.store(base + 1, row)  # row 0's "item" column
