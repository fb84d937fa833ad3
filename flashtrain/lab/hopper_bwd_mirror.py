"""A PyTorch mirror of the warp-specialized Gluon backward (kernels/hopper/flash_bwd_ws.py), for
the CPU, where the Gluon kernel cannot run (no interpreter for Gluon).

The mirror computes dQ, dK and dV the way the kernel does, step for step, from the kernel's own
schedule: `probe_schedule` runs kernels/hopper/schedule.py's `schedule_probe_kernel` (a plain
Triton kernel, so the interpreter runs it on the CPU), which calls the very functions every
partition of the Gluon kernel calls to place its program and walk its items. A wrong index in
them (the visit plan, the item order, a ring slot, a barrier parity) changes the table and, with
it, the mirror's gradients or its protocol check. What the mirror restates rather than shares is
the kernel's arithmetic inside a tile, line for line:

    per program: the key tile [n0, n0 + 128) of kv head h_kv, rows past the sequence zero (the
                 descriptors zero-fill them); K's non-finite entries zeroed, a NaN score term on
                 the keys that had one
    per item:    the query tile [start_m, start_m + block_m) of head h (zero past the sequence),
                 its lse and delta read flat (rows past the sequence read the next ones);
                 consumer warpgroup w owns keys [64w, 64w + 64):
                     S^T = K_w Q^T; P^T = exp2(S^T scale log2e - lse log2e); masked tiles keep
                     P where the band allows and the row exists; dV_w += P^T dO;
                     dP^T = V_w dO^T; dS^T = P^T (dP^T - delta), 0 where P is on masked tiles;
                     dK_w += dS^T Q; dS^T into buffer ds_buffer
                 dQ tile = dS K (the 128 keys), split between the warpgroups as the kernel's
                 accumulator layout splits it, added into a float32 accumulator in item order
                 (rows past the sequence dropped), as one tile (bulk) or in (8, 32) chunks (atomic)
    epilogue:    dK * scale and dV written for the key rows that exist; then dQ = scale * acc.

Products round their operands to the inputs' dtype where the kernel does (P and dS to the
input dtype before their products) and accumulate in float64: with float64 inputs the mirror is
exact, so a test against the float64 definition sees any index error far above rounding.

`simulate_protocol` plays one program's three partitions (loader, consumers, dQ writer) against
each other with the kernel's mbarrier waits and arrivals, in a random order of a seed, with
mbarriers that behave as the hardware's (phase parity, arrival counts, TMA transfer bytes) and
buffers that remember which item they hold: a deadlock, a slot overwritten while in use, or an
item reading another item's data raises ProtocolError.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import triton

from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.hopper.schedule import PROBE_COLUMNS, key_tile_grid, schedule_probe_kernel

BLOCK_N = 128  # the kernel's key tile
HALF = 64  # keys a consumer warpgroup owns
DQ_CHUNK = (8, 32)  # rows, columns of the per-element dQ writer's chunks (Triton 3.6)


@dataclass(frozen=True)
class Item:
    """One query tile a program streams past its key tile (a row of the probe's table)."""

    it: int
    head: int
    start_m: int
    masked: bool
    slot: int  # its slot of the Q / dO / lse / delta ring
    parity: int  # the phase parity it completes on that slot's barriers
    staged_parity: int  # the phase parity of the dQ staging tile's barriers
    ds_buffer: int  # which of the two dS^T buffers it writes


@dataclass(frozen=True)
class Program:
    """One program of the kernel's grid: a key tile of one kv head of one sequence."""

    b: int
    h_kv: int
    n0: int
    q_start: int
    seqlen_q: int
    k_start: int
    seqlen_k: int
    exits: bool  # its key tile starts past the sequence: the kernel returns at once
    items: tuple[Item, ...] = field(default_factory=tuple)


def probe_schedule(*, batch: int, heads_kv: int, group: int, max_seqlen_q: int,
                   max_seqlen_k: int, causal: bool, block_m: int, stages: int,
                   cu_seqlens_q: torch.Tensor | None = None,
                   cu_seqlens_k: torch.Tensor | None = None,
                   device: str | torch.device = "cpu") -> list[Program]:  # fmt: skip
    """Every program of the Gluon kernel's grid for a call, with its items in order, as
    kernels/hopper/schedule.py computes them (under TRITON_INTERPRET=1 on the CPU). batch: the
    number of sequences (a packed call's cu_seqlens have batch + 1 entries)."""
    heavy = causal  # the kernel's grid: heaviest key tiles first for causal bands
    grid = key_tile_grid(batch, heads_kv, max_seqlen_k, heavy, BLOCK_N)
    max_items = group * triton.cdiv(max_seqlen_q, block_m) + group
    columns = len(PROBE_COLUMNS)
    table = torch.full((math.prod(grid), max_items + 1, columns), -2, dtype=torch.int32,
                       device=device)  # fmt: skip
    varlen = cu_seqlens_q is not None
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if varlen else (table, table)
    schedule_probe_kernel[grid](
        table, cu_q, cu_k, max_seqlen_q, max_seqlen_k, heads_kv, 0 if causal else UNBOUNDED,
        max_items, GROUP=group, BLOCK_M=block_m, BLOCK_N=BLOCK_N, STAGES=stages,
        IS_VARLEN=varlen, HEAVY_FIRST=heavy, COLUMNS=columns,
    )  # fmt: skip
    return [_program(rows) for rows in table.cpu().tolist()]


def _program(rows: list[list[int]]) -> Program:
    named = [dict(zip(PROBE_COLUMNS, row)) for row in rows]
    head = named[0]
    n_tiles = head["start_m"]  # the header's n_tiles column
    items = tuple(
        Item(r["item"], r["head"], r["start_m"], bool(r["masked"]), r["slot"], r["parity"],
             r["staged_parity"], r["ds_buffer"])
        for r in named[1:] if r["item"] >= 0
    )  # fmt: skip
    return Program(head["b"], head["h_kv"], head["n0"], head["q_start"], head["seqlen_q"],
                   head["k_start"], head["seqlen_k"], n_tiles < 0, items)  # fmt: skip


# ------------------------------------------------------------------ the arithmetic
def _rows(x4: torch.Tensor, b: int, start: int, n_rows: int, first: int, count: int, head: int):
    """Rows [first, first + count) of head `head` of sequence b (starting at `start`, n_rows
    long) of a (B, S, H, D) tensor, zero past n_rows: what a per-sequence descriptor reads."""
    out = x4.new_zeros(count, x4.shape[-1])
    have = max(0, min(count, n_rows - first))
    if have:
        out[:have] = x4[b, start + first : start + first + have, head]
    return out


def _product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b with both operands rounded to `dtype` (the tensor cores' inputs), in float64."""
    return a.to(dtype).double() @ b.to(dtype).double()


def _flat(stats: torch.Tensor, at: int, count: int) -> torch.Tensor:
    """count values of a flat float32 buffer from `at`, zero past its end (a 1-d descriptor)."""
    flat = stats.reshape(-1)
    out = flat.new_zeros(count, dtype=torch.float64)
    have = max(0, min(count, flat.numel() - at))
    if have:
        out[:have] = flat[at : at + have].double()
    return out


def _dq_split(block_m: int) -> str:
    """How the kernel's dQ accumulator layout splits a (block_m, head_dim) tile between its two
    warpgroups: by rows while each keeps >= 64 of them, else by columns (_acc_layout)."""
    return "rows" if block_m >= 2 * HALF else "columns"


def mirror_backward(q4, k4, v4, do4, lse, delta, programs: list[Program], *,
                    softmax_scale: float, causal: bool, block_m: int,
                    dq_adds: str = "bulk") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) as the kernel computes them for (B, S, H, D) views (packed: a batch of one)
    and lse, delta laid out as the kernel reads them (contiguous: (B, Hq, Sq) or (Hq, total)).
    dq_adds: "bulk" (one tile a reduce-add) or "atomic" (Triton 3.6's per-element chunks).
    Rows of dk and dv no program writes stay NaN (a test sees a key tile no program held)."""
    if dq_adds not in ("bulk", "atomic"):
        raise ValueError(f"dq_adds must be 'bulk' or 'atomic', got {dq_adds!r}")
    dtype = q4.dtype
    scale_log2 = softmax_scale * math.log2(math.e)
    right = 0 if causal else UNBOUNDED
    packed = lse.dim() == 2  # (Hq, total): one packed batch, sequences by their offsets
    lse_strides = (0, lse.shape[-1]) if packed else (lse.shape[1] * lse.shape[2], lse.shape[2])
    dq_acc = torch.zeros(q4.shape, dtype=torch.float64)
    dk = torch.full(k4.shape, float("nan"), dtype=torch.float64)
    dv = torch.full(k4.shape, float("nan"), dtype=torch.float64)
    for prog in programs:
        if prog.exits:
            continue
        if packed:  # the kernel's batch stride is 0: every sequence lives in batch 0
            prog = Program(**{**prog.__dict__, "b": 0})
        tiles = _program_tiles(prog, q4, k4, v4, do4, lse, delta, lse_strides, dq_acc, dtype,
                               scale_log2, right, block_m, dq_adds)  # fmt: skip
        dk_tile, dv_tile = tiles
        keep = max(0, min(BLOCK_N, prog.seqlen_k - prog.n0))  # the key rows that exist
        rows = slice(prog.k_start + prog.n0, prog.k_start + prog.n0 + keep)
        dk[prog.b, rows, prog.h_kv] = (dk_tile[:keep] * softmax_scale).to(dtype).double()
        dv[prog.b, rows, prog.h_kv] = dv_tile[:keep].to(dtype).double()
    dq = (dq_acc.float() * softmax_scale).to(dtype)
    return dq, dk.to(dtype), dv.to(dtype)


def _program_tiles(prog: Program, q4, k4, v4, do4, lse, delta, lse_strides, dq_acc, dtype,
                   scale_log2, right, block_m, dq_adds):  # fmt: skip
    """One program: its dK and dV tiles (128, head_dim) in float64; adds its dQ tiles."""
    head_dim = q4.shape[-1]
    k = _rows(k4, prog.b, prog.k_start, prog.seqlen_k, prog.n0, BLOCK_N, prog.h_kv).double()
    v = _rows(v4, prog.b, prog.k_start, prog.seqlen_k, prog.n0, BLOCK_N, prog.h_kv).double()
    finite = torch.isfinite(k)  # the consumers clean K in shared memory once
    key_bad = ~finite.all(dim=1)
    k = torch.where(finite, k, torch.zeros((), dtype=k.dtype))
    key_term = torch.where(key_bad, float("nan"), 0.0).double()
    offs_n = prog.n0 + torch.arange(BLOCK_N)
    diag = prog.seqlen_k - prog.seqlen_q
    dk_tile = torch.zeros(BLOCK_N, head_dim, dtype=torch.float64)
    dv_tile = torch.zeros(BLOCK_N, head_dim, dtype=torch.float64)
    ds_buffers = [torch.zeros(BLOCK_N, block_m, dtype=torch.float64) for _ in range(2)]
    for item in prog.items:
        q = _rows(q4, prog.b, prog.q_start, prog.seqlen_q, item.start_m, block_m, item.head)
        do = _rows(do4, prog.b, prog.q_start, prog.seqlen_q, item.start_m, block_m, item.head)
        at = prog.b * lse_strides[0] + item.head * lse_strides[1] + prog.q_start + item.start_m
        lse_t = _flat(lse, at, block_m)
        lse_t = torch.where(lse_t == float("-inf"), float("inf"), lse_t) * math.log2(math.e)
        delta_t = _flat(delta, at, block_m)
        offs_m = item.start_m + torch.arange(block_m)
        seen = ((offs_n[:, None] < prog.seqlen_k) & (offs_n[:, None] <= offs_m[None, :] + diag + right)
                & (offs_m[None, :] < prog.seqlen_q))  # fmt: skip
        for w in range(BLOCK_N // HALF):  # the two consumer warpgroups
            keys = slice(w * HALF, (w + 1) * HALF)
            s_t = _product(k[keys], q.T, dtype)  # (64, block_m)
            if bool(key_bad.any()):
                s_t = s_t + key_term[keys, None]
            p_t = torch.exp2(s_t * scale_log2 - lse_t[None, :])
            if item.masked:
                p_t = torch.where(seen[keys], p_t, 0.0)
            dv_tile[keys] += _product(p_t, do, dtype)
            dp_t = _product(v[keys], do.T, dtype)
            ds_t = p_t * (dp_t - delta_t[None, :])
            if item.masked:
                ds_t = torch.where(p_t == 0.0, 0.0, ds_t)
            ds_t = ds_t.to(dtype).double()
            dk_tile[keys] += _product(ds_t, q, dtype)
            ds_buffers[item.ds_buffer][keys] = ds_t
        dq_tile = _dq_tile(ds_buffers[item.ds_buffer], k, dtype, block_m)
        _add_dq(dq_acc, dq_tile, prog, item, dq_adds)
    return dk_tile, dv_tile


def _dq_tile(ds_t: torch.Tensor, k: torch.Tensor, dtype, block_m: int) -> torch.Tensor:
    """dQ tile = dS K (block_m, head_dim) from both warpgroups' dS^T halves, each warpgroup its
    share of the output as the accumulator layout assigns it."""
    head_dim = k.shape[-1]
    tile = torch.empty(block_m, head_dim, dtype=torch.float64)
    if _dq_split(block_m) == "rows":
        for w in range(2):
            rows = slice(w * block_m // 2, (w + 1) * block_m // 2)
            tile[rows] = _product(ds_t.T[rows], k, dtype)
    else:
        for w in range(2):
            cols = slice(w * head_dim // 2, (w + 1) * head_dim // 2)
            tile[:, cols] = _product(ds_t.T, k[:, cols], dtype)
    return tile.float().double()  # the staging tile is float32


def _add_dq(dq_acc, tile, prog: Program, item: Item, dq_adds: str) -> None:
    """The dQ writer: the tile's rows that exist added into the accumulator, whole (a bulk
    reduce-add drops rows past the sequence) or in (8, 32) chunks masked the same way."""
    block_m, head_dim = tile.shape
    first = prog.q_start + item.start_m
    keep = max(0, min(block_m, prog.seqlen_q - item.start_m))
    if dq_adds == "bulk":
        dq_acc[prog.b, first : first + keep, item.head] += tile[:keep]
        return
    rows, cols = DQ_CHUNK
    for r in range(0, block_m, rows):
        have = max(0, min(rows, keep - r))
        for c in range(0, head_dim, cols):
            dq_acc[prog.b, first + r : first + r + have, item.head, c : c + cols] += tile[
                r : r + have, c : c + cols
            ]


# ------------------------------------------------------------------ the protocol
class ProtocolError(AssertionError):
    """The partitions deadlocked, or a buffer was used out of turn."""


class MBarrier:
    """An mbarrier as the hardware keeps it: arrivals expected per phase, transfer bytes still
    to land, and the phase in progress. wait(parity) passes once the phase of that parity
    has completed: while the current phase's parity differs from it (a fresh barrier is in
    phase 0, so wait(1) passes at once)."""

    def __init__(self, name: str, count: int = 1):
        self.name, self.count = name, count
        self.pending, self.tx, self.phase = count, 0, 0

    def passes(self, parity: int) -> bool:
        return self.phase % 2 != parity

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending < 0:
            raise ProtocolError(f"{self.name}: more arrivals than its count in phase {self.phase}")
        self._complete_if_done()

    def expect(self, transfers: int) -> None:
        """mbarrier.expect: transfers to land (one per TMA copy here), and one arrival."""
        self.tx += transfers
        self.arrive()

    def landed(self) -> None:
        self.tx -= 1
        self._complete_if_done()

    def _complete_if_done(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count


@dataclass(frozen=True)
class Rules:
    """The parities the kernel's partitions wait with, as functions of an item's table row:
    the kernel's rules by default; a test plants a wrong one to see the simulation fail."""

    loader_slot_free: Callable[[Item], int] = lambda item: item.parity ^ 1
    consumer_slot_ready: Callable[[Item], int] = lambda item: item.parity
    consumer_staging_free: Callable[[Item], int] = lambda item: item.staged_parity ^ 1
    writer_staging_ready: Callable[[Item], int] = lambda item: item.staged_parity


def simulate_protocol(prog: Program, stages: int, seed: int, rules: Rules = Rules()) -> int:
    """Play one program's partitions in a random order (seeded); the steps taken. Raises
    ProtocolError on a deadlock or a buffer used out of turn."""
    kv_ready = MBarrier("kv_ready")
    q_ready = [MBarrier(f"q_ready[{s}]") for s in range(stages)]
    q_empty = [MBarrier(f"q_empty[{s}]") for s in range(stages)]
    dq_ready, dq_empty = MBarrier("dq_ready"), MBarrier("dq_empty")
    slots: list[int | None] = [None] * stages  # the item whose Q / dO a slot holds
    in_use: list[int | None] = [None] * stages  # the item the consumers read from a slot
    staging: list[int | None] = [None]  # the item whose dQ tile the staging buffer holds
    in_flight: list[tuple[int, int]] = []  # (slot, item) of TMA copies not yet landed

    def loader() -> Iterator[Callable[[], bool]]:
        kv_ready.expect(1)
        in_flight.append((-1, -1))  # K and V
        for item in prog.items:
            yield lambda item=item: q_empty[item.slot].passes(rules.loader_slot_free(item))
            if in_use[item.slot] is not None:
                raise ProtocolError(f"the loader overwrote slot {item.slot} while item "
                                    f"{in_use[item.slot]} was in use (item {item.it})")  # fmt: skip
            q_ready[item.slot].expect(1)
            in_flight.append((item.slot, item.it))

    def consumers() -> Iterator[Callable[[], bool]]:
        yield lambda: kv_ready.passes(0)
        for item in prog.items:
            yield lambda item=item: q_ready[item.slot].passes(rules.consumer_slot_ready(item))
            if slots[item.slot] != item.it:
                raise ProtocolError(f"item {item.it} read slot {item.slot} holding item "
                                    f"{slots[item.slot]}")  # fmt: skip
            in_use[item.slot] = item.it
            yield lambda item=item: dq_empty.passes(rules.consumer_staging_free(item))
            if staging[0] is not None:
                raise ProtocolError(f"item {item.it} overwrote the dQ staging tile of item "
                                    f"{staging[0]} before the writer added it")  # fmt: skip
            staging[0] = item.it
            in_use[item.slot] = None
            q_empty[item.slot].arrive()
            dq_ready.arrive()

    def writer() -> Iterator[Callable[[], bool]]:
        for item in prog.items:
            yield lambda item=item: dq_ready.passes(rules.writer_staging_ready(item))
            if staging[0] != item.it:
                raise ProtocolError(f"the dQ writer took item {staging[0]} as item {item.it}")
            staging[0] = None
            dq_empty.arrive()

    def land(index: int) -> None:
        slot, it = in_flight.pop(index)
        if slot < 0:
            kv_ready.landed()
        else:
            slots[slot] = it
            q_ready[slot].landed()

    rng = random.Random(seed)
    actors = {"loader": loader(), "consumers": consumers(), "writer": writer()}
    waiting: dict[str, Callable[[], bool]] = {name: (lambda: True) for name in actors}
    steps = 0
    while actors or in_flight:
        runnable = [name for name in actors if waiting[name]()]
        choices = runnable + [f"land {i}" for i in range(len(in_flight))]
        if not choices:
            raise ProtocolError(f"deadlock after {steps} steps: {sorted(actors)} wait")
        choice = rng.choice(choices)
        steps += 1
        if choice.startswith("land "):
            land(int(choice.split()[1]))
            continue
        try:
            waiting[choice] = next(actors[choice])
        except StopIteration:
            del actors[choice], waiting[choice]
    return steps
