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
                 descriptors zero-fill them), held as two 64-key halves; each half's
                 non-finite entries zeroed, a NaN score term on the keys that had one
    per item:    the query tile [start_m, start_m + block_m) of head h (zero past the sequence),
                 its lse and delta read flat (rows past the sequence read the next ones);
                 consumer warpgroup w owns keys [64w, 64w + 64):
                     S^T = K_w Q^T - lse / scale (the accumulator starts there);
                     P^T = exp2(S^T scale log2e); masked tiles keep P where the band allows and
                     the row exists; dV_w += P^T dO; dP^T = V_w dO^T - delta (likewise);
                     dS^T = P^T dP^T, 0 where P is on masked tiles; dK_w += dS^T Q; dS^T into
                     half w of the item's pair of buffers (ds_pair)
                 then warpgroup w's columns [w D/2, (w + 1) D/2) of the dQ tile = dS K[:, cols]
                 over the 128 keys (both halves of dS^T, both of K), added into a float32
                 accumulator in item order (rows past the sequence dropped), as one slice
                 (bulk) or in (8, 32) chunks (atomic)
    epilogue:    dK * scale and dV written for the key rows that exist; then dQ = scale * acc.

Products round their operands to the inputs' dtype where the kernel does (P and dS to the
input dtype before their products) and accumulate in float64: with float64 inputs the mirror is
exact, so a test against the float64 definition sees any index error far above rounding.

`simulate_protocol` plays one program's four partitions (the loader, consumer warpgroups 0 and
1, the dQ writer) against each other with the kernel's mbarrier waits and arrivals, in a random
order of a seed, with mbarriers that behave as the hardware's (phase parity, arrival counts, TMA
transfer bytes), buffers that remember which item they hold, and the dQ products in flight
between their issue and the wait that retires them: a deadlock, a buffer overwritten while a
partition still needs it, or an item reading another item's data raises ProtocolError.
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
    staged_parity: int  # the phase parity of each warpgroup's dQ staging tile's barriers
    ds_pair: int  # which pair of dS^T buffers its two halves go to
    pair_parity: int  # the phase parity it completes on that pair's ds_ready


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
             r["staged_parity"], r["ds_pair"], r["pair_parity"])
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
    scale = scale_log2 / math.log2(math.e)
    k = _rows(k4, prog.b, prog.k_start, prog.seqlen_k, prog.n0, BLOCK_N, prog.h_kv).double()
    v = _rows(v4, prog.b, prog.k_start, prog.seqlen_k, prog.n0, BLOCK_N, prog.h_kv).double()
    finite = torch.isfinite(k)  # each consumer cleans its half of K in shared memory once
    key_bad = ~finite.all(dim=1)
    k = torch.where(finite, k, torch.zeros((), dtype=k.dtype))
    key_term = torch.where(key_bad, float("nan"), 0.0).double()
    offs_n = prog.n0 + torch.arange(BLOCK_N)
    diag = prog.seqlen_k - prog.seqlen_q
    dk_tile = torch.zeros(BLOCK_N, head_dim, dtype=torch.float64)
    dv_tile = torch.zeros(BLOCK_N, head_dim, dtype=torch.float64)
    # the two pairs of dS^T buffers, a 64-key half from each warpgroup: [pair][w]
    ds_buffers = [[torch.zeros(HALF, block_m, dtype=torch.float64) for _ in range(2)]
                  for _ in range(2)]  # fmt: skip
    for item in prog.items:
        q = _rows(q4, prog.b, prog.q_start, prog.seqlen_q, item.start_m, block_m, item.head)
        do = _rows(do4, prog.b, prog.q_start, prog.seqlen_q, item.start_m, block_m, item.head)
        at = prog.b * lse_strides[0] + item.head * lse_strides[1] + prog.q_start + item.start_m
        lse_t = _flat(lse, at, block_m)
        lse_t = torch.where(lse_t == float("-inf"), float("inf"), lse_t) / scale
        delta_t = _flat(delta, at, block_m)
        offs_m = item.start_m + torch.arange(block_m)
        seen = ((offs_n[:, None] < prog.seqlen_k)
                & (offs_n[:, None] <= offs_m[None, :] + diag + right)
                & (offs_m[None, :] < prog.seqlen_q))  # fmt: skip
        for w in range(BLOCK_N // HALF):  # the two consumer warpgroups
            keys = slice(w * HALF, (w + 1) * HALF)
            s_t = _product(k[keys], q.T, dtype) - lse_t[None, :]  # (64, block_m)
            if bool(key_bad.any()):
                s_t = s_t + key_term[keys, None]
            p_t = torch.exp2(s_t * scale_log2)
            if item.masked:
                p_t = torch.where(seen[keys], p_t, 0.0)
            dv_tile[keys] += _product(p_t, do, dtype)
            dp_t = _product(v[keys], do.T, dtype) - delta_t[None, :]
            ds_t = p_t * dp_t
            if item.masked:
                ds_t = torch.where(p_t == 0.0, 0.0, ds_t)
            ds_t = ds_t.to(dtype).double()
            dk_tile[keys] += _product(ds_t, q, dtype)
            ds_buffers[item.ds_pair][w] = ds_t
        for w in range(2):  # each warpgroup's columns of the dQ tile, from both halves
            cols = slice(w * head_dim // 2, (w + 1) * head_dim // 2)
            tile = sum(_product(ds_buffers[item.ds_pair][h].T, k[h * HALF : (h + 1) * HALF, cols],
                                dtype) for h in range(2))  # fmt: skip
            _add_dq(dq_acc, tile.float().double(), prog, item, cols, dq_adds)  # staged float32
    return dk_tile, dv_tile


def _add_dq(dq_acc, tile, prog: Program, item: Item, cols: slice, dq_adds: str) -> None:
    """The dQ writer: one warpgroup's columns `cols` of the tile, the rows that exist added
    into the accumulator, whole (a bulk reduce-add drops rows past the sequence) or in (8, 32)
    chunks masked the same way."""
    block_m, width = tile.shape
    first = prog.q_start + item.start_m
    keep = max(0, min(block_m, prog.seqlen_q - item.start_m))
    target = dq_acc[prog.b, first : first + keep, item.head, cols]
    if dq_adds == "bulk":
        target += tile[:keep]
        return
    rows, chunk = DQ_CHUNK
    for r in range(0, block_m, rows):
        have = max(0, min(rows, keep - r))
        for c in range(0, width, chunk):
            target[r : r + have, c : c + chunk] += tile[r : r + have, c : c + chunk]


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
    """The parities the kernel's partitions wait with, as functions of an item's table row, and
    the kernel's orderings: the kernel's by default; a test plants a wrong one to see the
    simulation fail. A parity of None skips that wait."""

    loader_slot_free: Callable[[Item], int | None] = lambda item: item.parity ^ 1
    consumer_slot_ready: Callable[[Item], int | None] = lambda item: item.parity
    ds_pair: Callable[[Item], int] = lambda item: item.ds_pair  # the dS^T pair it writes
    consumer_ds_ready: Callable[[Item], int | None] = lambda item: item.pair_parity
    consumer_staging_free: Callable[[Item], int | None] = lambda item: item.staged_parity ^ 1
    writer_staging_ready: Callable[[Item], int | None] = lambda item: item.staged_parity
    keys_done_waited: bool = True  # dK overwrites K's half only once both are done with K
    slot_after_products: bool = True  # a slot released only once the item's products retired


class _Buffer:
    """A shared-memory buffer: the tag of what it holds and the products reading it now."""

    def __init__(self, name: str):
        self.name, self.holds, self.readers = name, None, 0

    def write(self, tag, by: str) -> None:
        if self.readers:
            raise ProtocolError(f"{by} overwrote {self.name} (holding {self.holds}) while "
                                f"{self.readers} product(s) read it")  # fmt: skip
        self.holds = tag

    def read(self, tag, by: str) -> None:
        if self.holds != tag:
            raise ProtocolError(f"{by} read {self.name} for {tag}: it holds {self.holds}")


def simulate_protocol(prog: Program, stages: int, seed: int, rules: Rules = Rules()) -> int:
    """Play one program's partitions in a random order (seeded); the steps taken. Raises
    ProtocolError on a deadlock or a buffer used out of turn."""
    kv_ready, keys_done = MBarrier("kv_ready"), MBarrier("keys_done", 2)
    q_ready = [MBarrier(f"q_ready[{s}]") for s in range(stages)]
    q_empty = [MBarrier(f"q_empty[{s}]", 2) for s in range(stages)]  # both consumers
    ds_ready = [MBarrier(f"ds_ready[{p}]", 2) for p in range(2)]
    dq_ready = [MBarrier(f"dq_ready[{w}]") for w in range(2)]
    dq_empty = [MBarrier(f"dq_empty[{w}]") for w in range(2)]
    slots = [_Buffer(f"Q / dO slot {s}") for s in range(stages)]
    in_use = [0] * stages  # consumers whose products may still read a slot
    k_halves = [_Buffer(f"K half {w}") for w in range(2)]
    ds = [[_Buffer(f"dS^T pair {p} half {w}") for w in range(2)] for p in range(2)]
    staging = [_Buffer(f"dQ staging {w}") for w in range(2)]
    in_flight: list[tuple[int, int]] = []  # (slot, item) of TMA copies not yet landed

    def wait(bar: MBarrier, parity: int | None) -> Iterator[Callable[[], bool]]:
        if parity is not None:
            yield lambda: bar.passes(parity)

    def loader() -> Iterator[Callable[[], bool]]:
        kv_ready.expect(1)
        in_flight.append((-1, -1))  # K and V, both halves
        for item in prog.items:
            yield from wait(q_empty[item.slot], rules.loader_slot_free(item))
            if in_use[item.slot]:
                raise ProtocolError(f"the loader overwrote slot {item.slot} while "
                                    f"{in_use[item.slot]} consumer(s) read it (item {item.it})")  # fmt: skip
            slots[item.slot].holds = None  # undefined until the copy lands
            q_ready[item.slot].expect(1)
            in_flight.append((item.slot, item.it))

    def consumer(w: int) -> Iterator[Callable[[], bool]]:
        by = f"consumer {w}"
        yield lambda: kv_ready.passes(0)
        k_halves[w].write(("K", w, "cleaned"), by)  # its half of K cleaned in place
        for item in prog.items:
            yield from wait(q_ready[item.slot], rules.consumer_slot_ready(item))
            slots[item.slot].read(("Q", item.it), by)
            in_use[item.slot] += 1  # S^T, dP^T, dV, dK read Q and dO until the item's drain
            pair = ds[rules.ds_pair(item)]
            pair[w].write(("dS", item.it), by)
            ds_ready[rules.ds_pair(item)].arrive()
            if not rules.slot_after_products:  # the planted bug: released with dK in flight
                q_empty[item.slot].arrive()
            yield from wait(ds_ready[rules.ds_pair(item)], rules.consumer_ds_ready(item))
            # dQ's two products read both halves of the pair and both halves of K
            reads = [(pair[h], ("dS", item.it)) for h in range(2)]
            reads += [(k_halves[h], ("K", h, "cleaned")) for h in range(2)]
            for buf, tag in reads:
                buf.read(tag, by)
                buf.readers += 1
            yield lambda: True  # the products run: the others may move meanwhile
            for buf, _ in reads:  # wait(0): dK and dQ retired
                buf.readers -= 1
            in_use[item.slot] -= 1
            yield from wait(dq_empty[w], rules.consumer_staging_free(item))
            staging[w].write(("dQ", item.it), by)
            dq_ready[w].arrive()
            if rules.slot_after_products:
                q_empty[item.slot].arrive()
        keys_done.arrive()
        if rules.keys_done_waited:
            yield lambda: keys_done.passes(0)
        k_halves[w].write(("dK", w), by)

    def writer() -> Iterator[Callable[[], bool]]:
        for item in prog.items:
            for w in range(2):
                yield from wait(dq_ready[w], rules.writer_staging_ready(item))
                staging[w].read(("dQ", item.it), "the dQ writer")
                staging[w].holds = None  # added: the consumer may stage its next tile
                dq_empty[w].arrive()

    def land(index: int) -> None:
        slot, it = in_flight.pop(index)
        if slot < 0:
            kv_ready.landed()
        else:
            slots[slot].holds = ("Q", it)
            q_ready[slot].landed()

    rng = random.Random(seed)
    actors = {"loader": loader(), "consumer 0": consumer(0), "consumer 1": consumer(1),
              "writer": writer()}  # fmt: skip
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
