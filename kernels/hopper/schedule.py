"""The warp-specialized backward's schedule: which program holds which key tile, which query
tiles stream past it and in what order, and which ring slot and barrier parity each one uses.

Written once, as @triton.jit functions of scalars, and called from two places:
  - the Gluon kernel (flash_bwd_ws.py): every partition (loader, consumers, dQ writer) walks the
    same items in the same order, each computing them from these functions;
  - `schedule_probe_kernel` below, a plain Triton kernel that writes what these functions say
    for every program into a table. It runs under TRITON_INTERPRET=1 on the CPU, where the Gluon
    kernel cannot, and the PyTorch mirror of the kernel (flashtrain/lab/hopper_bwd_mirror.py)
    computes the gradients by that table: a wrong index here gives wrong gradients there.

A program holds key tile [n0, n0 + BLOCK_N) of one kv head of one sequence and streams, for each
of the GROUP query heads that share the kv head in turn, the query tiles of the visit plan
(kernels/visit_plan.py): the element-masked ones first (causal edge, sequence tails), then the
unmasked middle. Item `it` = g * n_tiles + t is tile t of group head g (item_tile).

Grid: (tiles, heads_kv, batch), or for causal bands (heads_kv * batch, tiles): key tile 0 sees
every query (the heaviest) and the GPU starts blocks in grid order, so every head's heaviest tiles
start first (FlashAttention-3's longest-first order for its dK/dV programs).
"""

import triton
import triton.language as tl

from flashtrain.kernels.band import query_block_range
from flashtrain.kernels.common import UNBOUNDED, check_grid, pair_bounds
from flashtrain.kernels.visit_plan import segment_tiles, tile_start

# the slots of a dense visit plan's calls (block-sparse tables are not used here)
_NO_TABLES = tl.constexpr(0)
_LEFT = tl.constexpr(UNBOUNDED)  # the band's left side: no window


def key_tile_grid(batch: int, heads_kv: int, max_seqlen_k: int, heavy_first: bool,
                  block_n: int) -> tuple[int, int, int]:
    """The launch grid key_tile_program reads (see the module docstring for the two orders)."""
    tiles = triton.cdiv(max_seqlen_k, block_n)
    if heavy_first:
        return check_grid((heads_kv * batch, tiles, 1), "kv heads x sequences, key tiles")
    return check_grid((tiles, heads_kv, batch), "key tiles, kv heads, sequences")


@triton.jit
def key_tile_program(CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_kv,
                     window_right, IS_VARLEN: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    """(pid_n, b, h_kv, q_start, seqlen_q, k_start, seqlen_k, band) of this program; band =
    (diag, left, right) of kernels/band.py with left unbounded (causal: right = 0)."""
    if HEAVY_FIRST:
        pid_n = tl.program_id(1)
        h_kv = tl.program_id(0) % heads_kv
        b = tl.program_id(0) // heads_kv
    else:
        pid_n = tl.program_id(0)
        h_kv = tl.program_id(1)
        b = tl.program_id(2)
    q_start, seqlen_q, k_start, seqlen_k = pair_bounds(
        CU_SEQLENS_Q, CU_SEQLENS_K, b, seqlen_q_fixed, seqlen_k_fixed, IS_VARLEN)
    band = (seqlen_k - seqlen_q, _LEFT, window_right)
    return pid_n, b, h_kv, q_start, seqlen_q, k_start, seqlen_k, band


@triton.jit
def key_tile_plan(n0, seqlen_q, seqlen_k, band, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(bounds, n_masked, n_tiles): the query range of key tile n0 (band.query_block_range) and
    how many BLOCK_M-row tiles its plan streams per query head, the first n_masked masked."""
    bounds = query_block_range(n0, seqlen_q, seqlen_k, band, BLOCK_M, BLOCK_N)
    tables = (_NO_TABLES, _NO_TABLES, _NO_TABLES, _NO_TABLES)
    at = (_NO_TABLES, _NO_TABLES)
    n_masked = segment_tiles(bounds, tables, at, 0, False, 1, BLOCK_M)
    n_tiles = n_masked + segment_tiles(bounds, tables, at, 1, False, 1, BLOCK_M)
    return bounds, n_masked, n_tiles


@triton.jit
def plan_tile(bounds, n_masked, t, BLOCK_M: tl.constexpr):
    """(start_m, masked) of tile t of a plan: the masked segment's tiles first, then the middle."""
    tables = (_NO_TABLES, _NO_TABLES, _NO_TABLES, _NO_TABLES)
    at = (_NO_TABLES, _NO_TABLES)
    masked = t < n_masked
    edge = tile_start(bounds, tables, at, 0, t, False, 1, BLOCK_M)
    middle = tile_start(bounds, tables, at, 1, t - n_masked, False, 1, BLOCK_M)
    return tl.where(masked, edge, middle), masked


@triton.jit
def item_tile(it, n_tiles):
    """(g, t) of item `it`: tile t of the plan for the group's query head g (one flat loop over
    GROUP * n_tiles items in every partition; nested loops left the grouped-query kernel a few
    spilled registers on sm_90)."""
    g = it // n_tiles
    return g, it - g * n_tiles


@triton.jit
def ring_slot(it, STAGES: tl.constexpr):
    """(slot, parity) of item `it` in a ring of STAGES buffers: the slot it fills, and the parity
    of that slot's barrier phase it completes (use u of a slot completes phase u; an mbarrier
    starts in phase 0 with the phase before it, parity 1, counted complete)."""
    return it % STAGES, (it // STAGES) & 1


# Columns of the probe's table, one row per (program, item); the header row of a program has
# item = -1 and its n_tiles in the start_m column.
PROBE_COLUMNS = ("b", "h_kv", "n0", "q_start", "seqlen_q", "k_start", "seqlen_k", "item",
                 "head", "start_m", "masked", "slot", "parity", "staged_parity",
                 "ds_pair", "pair_parity")  # fmt: skip


@triton.jit
def schedule_probe_kernel(
    OUT, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_kv, window_right,
    max_items,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
    IS_VARLEN: tl.constexpr, HEAVY_FIRST: tl.constexpr, COLUMNS: tl.constexpr,
):
    """Writes the schedule of the program at this grid position (the Gluon kernel's grid) into
    OUT (programs, max_items + 1, COLUMNS) int32: row 0 the program's header, rows 1.. its items
    in the order every partition walks them. A program whose key tile starts past its sequence
    (it exits at once in the kernel) writes n_tiles = -1."""
    pid_n, b, h_kv, q_start, seqlen_q, k_start, seqlen_k, band = key_tile_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads_kv, window_right,
        IS_VARLEN, HEAVY_FIRST)
    program = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) \
        + tl.program_id(0)
    base = OUT + program.to(tl.int64) * (max_items + 1) * COLUMNS
    n0 = pid_n * BLOCK_N
    bounds, n_masked, n_tiles = key_tile_plan(n0, seqlen_q, seqlen_k, band, BLOCK_M, BLOCK_N)
    n_tiles = tl.where(n0 >= seqlen_k, -1, n_tiles)
    header = (b, h_kv, n0, q_start, seqlen_q, k_start, seqlen_k, -1, -1, n_tiles, -1, -1, -1,
              -1, -1, -1)
    for c in tl.static_range(COLUMNS):
        tl.store(base + c, header[c])
    for it in range(GROUP * tl.maximum(n_tiles, 0)):
        g, t = item_tile(it, n_tiles)
        start_m, masked = plan_tile(bounds, n_masked, t, BLOCK_M)
        slot, parity = ring_slot(it, STAGES)  # the Q / dO / lse / delta ring
        _, staged_parity = ring_slot(it, 1)  # each warpgroup's dQ staging tile
        ds_pair, pair_parity = ring_slot(it, 2)  # the dS^T pair and its ds_ready phase
        row = (b, h_kv, n0, q_start, seqlen_q, k_start, seqlen_k, it, h_kv * GROUP + g,
               start_m, masked.to(tl.int32), slot, parity, staged_parity, ds_pair, pair_parity)
        for c in tl.static_range(COLUMNS):
            tl.store(base + (it + 1) * COLUMNS + c, row[c])
