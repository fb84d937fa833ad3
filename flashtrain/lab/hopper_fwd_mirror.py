"""A PyTorch mirror of the warp-specialized Gluon forward (kernels/hopper/flash_fwd_ws.py), for
the CPU, where the Gluon kernel cannot run (no interpreter for Gluon).

The mirror computes out and lse the way the kernel does, step for step, from the kernel's own
schedule: `probe_schedule` runs kernels/hopper/fwd_schedule.py's `schedule_probe_kernel` (a
plain Triton kernel, so the interpreter runs it on the CPU), which calls the very functions every
partition of the Gluon kernel calls to take its items and walk their key tiles (work_item,
query_tile_plan, plan_key_tile); `probe_turn_parity` runs the kernel's turn_parity. A wrong index
there changes the table and, with it, the mirror's output or its protocol check. What the mirror
restates rather than shares is the kernel's arithmetic inside a tile, line for line:

    reads:    each tensor through one descriptor over the whole batch, a (B * S or total, H * D)
              matrix: position p of sequence b is row b * S + p (fixed length) or q_start + p
              (packed); rows past the matrix are zero, rows past a sequence but inside the
              matrix are the next sequence's (real data, maybe non-finite)
    per item: the 128 query rows from m0 of head h; consumer warpgroup w owns [64w, 64w + 64),
              with m = -inf, l = 0, acc = 0; per key tile (start_n, masked) of kv head h // GROUP:
                  masked: V's non-finite entries zeroed (once, shared), a NaN score term on the
                          keys that had one; S = Q_w K^T + term, -inf where the band forbids
                  m_new = max(m, rowmax(S) scale log2e); P = exp2(S scale log2e - m_shift)
                  (m_shift = m_new, or 0 where it is -inf); alpha = exp2(m - m_shift);
                  l = l alpha + rowsum(P); acc = acc alpha + P V
    epilogue: out = acc / l, lse = (m + log2 l) ln2; rows that saw no key 0 and -inf; only
              rows inside the sequence written (the kernel stores a half wholly inside it with
              one TMA store, a tail half with row-masked pointer stores: a TMA store over the
              whole batch's matrix would write the next sequence's rows)

Products round their operands to the inputs' dtype (P too) and accumulate in float64; the state
is float32, or float64 with float64 inputs: then the mirror is exact, and a test against the
float64 definition sees any index error far above rounding.

`simulate_protocol` plays one program's three partitions (the loader, consumer warpgroups 0 and
1) against each other with the kernel's mbarrier waits and arrivals, in a random order of a seed,
with mbarriers as the hardware keeps them (hopper_bwd_mirror.MBarrier), asynchronous GEMMs that
complete in issue order, TMA copies and stores that complete whenever, and buffers that remember
which item or tile they hold and which reads they still owe. It follows the kernel's pipelines:
K and V in rings of their own (k_ready / k_empty, v_ready / v_empty), an item's first S issued
outside the ping-pong and every other product inside it, K released once its S retired, V once
its P V did, Q once the item's last S did, each consumer's output staged in its own tile whose
TMA store is waited for only before the tile is written again and before the consumer ends. A
deadlock, a buffer overwritten while needed, a read of another item's or tile's data, the
ping-pong order broken, or a consumer ending with its store in flight raises ProtocolError.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flashtrain.kernels.common import UNBOUNDED, heavy_first
from flashtrain.kernels.hopper import fwd_schedule
from flashtrain.kernels.hopper.fwd_schedule import PROBE_COLUMNS, persistent_grid
from flashtrain.lab.hopper_bwd_mirror import MBarrier, ProtocolError

BLOCK_M = 128  # a work item's query rows
BLOCK_N = 128  # a key tile
HALF = 64  # query rows a consumer warpgroup owns
Q_BUFFERS = fwd_schedule.Q_BUFFERS.value


@dataclass(frozen=True)
class KeyTile:
    """One key tile an item streams (a kind-1 row of the probe's table)."""

    kv: int  # key tiles the program streamed before it: what its K and V ring slots hold
    start_n: int
    masked: bool
    kv_slot: int  # its slot in the K ring and in the V ring
    kv_parity: int
    turn: int  # the ping-pong turn of its P V issue (with the next tile's S, or alone)
    clean_slot: int  # its key_term buffer and cleaned barrier (-1 unmasked)
    clean_parity: int


@dataclass(frozen=True)
class Item:
    """One work item, a 128-row query tile of one head (a kind-0 row), with its key tiles."""

    local: int  # items the program took before it: what its Q buffer holds
    item: int
    b: int
    h: int
    m0: int
    q_start: int
    seqlen_q: int
    k_start: int
    seqlen_k: int
    n_tiles: int
    q_slot: int
    q_parity: int
    turn: int  # its first ping-pong turn (its first S is issued outside the ping-pong)
    tiles: tuple[KeyTile, ...]


@dataclass(frozen=True)
class Program:
    """One persistent program: its items in the order every partition walks them."""

    pid: int
    items: tuple[Item, ...]


def probe_schedule(*, batch: int, heads_q: int, max_seqlen_q: int, max_seqlen_k: int,
                   window_right: int, sms: int, stages: int,
                   cu_seqlens_q: torch.Tensor | None = None,
                   cu_seqlens_k: torch.Tensor | None = None) -> list[Program]:  # fmt: skip
    """Every program of the Gluon kernel's persistent grid on `sms` SMs, as fwd_schedule.py
    walks them (under TRITON_INTERPRET=1 on the CPU). batch: the number of sequences (a packed
    call's cu_seqlens have batch + 1 entries); window_right: 0 causal, UNBOUNDED full."""
    items = triton.cdiv(max_seqlen_q, BLOCK_M) * heads_q * batch
    (programs,) = persistent_grid(items, sms)
    max_rows = triton.cdiv(items, programs) * (2 + triton.cdiv(max_seqlen_k, BLOCK_N))
    columns = len(PROBE_COLUMNS)
    table = torch.zeros((programs, max_rows + 1, columns), dtype=torch.int32)
    varlen = cu_seqlens_q is not None
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if varlen else (table, table)
    fwd_schedule.schedule_probe_kernel[(programs,)](
        table, cu_q, cu_k, max_seqlen_q, max_seqlen_k, heads_q, batch, window_right, max_rows,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=stages, IS_VARLEN=varlen,
        HEAVY_FIRST=heavy_first(UNBOUNDED, window_right), COLUMNS=columns,
    )  # fmt: skip
    return [_program(pid, rows) for pid, rows in enumerate(table.tolist())]


def _program(pid: int, rows: list[list[int]]) -> Program:
    if not 0 <= rows[0][1] < len(rows):
        raise ValueError(f"program {pid} wrote {rows[0][1]} rows into a table of {len(rows) - 1}")
    named = [dict(zip(PROBE_COLUMNS, row)) for row in rows[1 : 1 + rows[0][1]]]
    headers: list[dict] = []
    tiles: list[list[KeyTile]] = []
    for r in named:
        if r["kind"] == 0:
            headers.append({f: r[f] for f in Item.__dataclass_fields__ if f in r})
            tiles.append([])
            continue
        if not headers or r["item"] != headers[-1]["item"]:
            raise ValueError(f"program {pid}: a key tile row outside its item: {r}")
        tiles[-1].append(KeyTile(sum(map(len, tiles)), r["start_n"], bool(r["masked"]),
                                 r["kv_slot"], r["kv_parity"], r["turn"], r["clean_slot"],
                                 r["clean_parity"]))  # fmt: skip
    return Program(pid, tuple(Item(**header, local=i, tiles=tuple(t))
                              for i, (header, t) in enumerate(zip(headers, tiles))))  # fmt: skip


@triton.jit
def _turn_parity_probe(OUT):
    turn = tl.program_id(0)
    tl.store(OUT + 2 * turn, fwd_schedule.turn_parity(turn, 0))
    tl.store(OUT + 2 * turn + 1, fwd_schedule.turn_parity(turn, 1))


def probe_turn_parity(turns: int) -> list[tuple[int, int]]:
    """The parities warpgroups 0 and 1 wait for before ping-pong issue `turn`, for turn <
    turns, as the kernel's fwd_schedule.turn_parity computes them."""
    out = torch.zeros(turns, 2, dtype=torch.int32)
    _turn_parity_probe[(turns,)](out)
    return [tuple(row) for row in out.tolist()]


# ------------------------------------------------------------------ the arithmetic
def _rows(x2: torch.Tensor, first: int, head: int) -> torch.Tensor:
    """BLOCK_N rows of head `head` of a (rows, H, D) matrix from row `first`, zero past its
    end: what the descriptor over the whole batch reads."""
    out = x2.new_zeros(BLOCK_N, x2.shape[-1])
    have = max(0, min(BLOCK_N, x2.shape[0] - first))
    out[:have] = x2[first : first + have, head]
    return out


def _product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b with both operands rounded to `dtype` (the tensor cores' inputs), in float64."""
    return a.to(dtype).double() @ b.to(dtype).double()


def _clean_values(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A masked tile's V (128, D) with its non-finite entries zeroed, and the score term
    (128,): NaN on the keys that had one (so a row that sees one turns NaN), else 0."""
    finite = torch.isfinite(v)
    key_term = torch.where(finite.all(dim=1), 0.0, float("nan")).double()
    return torch.where(finite, v, torch.zeros((), dtype=v.dtype)), key_term


def mirror_forward(q4, k4, v4, programs: list[Program], *, softmax_scale: float,
                   window_right: int, group: int,
                   packed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(out, lse) as the kernel computes them for q4 (B, Sq, Hq, D), k4 and v4 (B, Sk, Hkv, D);
    packed: B = 1 views of (total, H, D), the sequences at the table's offsets. lse: (B, Hq, Sq),
    or (Hq, total) packed. Rows no item writes stay NaN (a test sees an item missing)."""
    dtype = q4.dtype
    state = torch.float64 if dtype == torch.float64 else torch.float32
    batch, seqlen_q, heads_q, _ = q4.shape
    q2, k2, v2 = (x.reshape(-1, *x.shape[2:]) for x in (q4, k4, v4))  # (rows, H, D)
    out2 = torch.full(q2.shape, float("nan"), dtype=dtype)
    lse = torch.full((heads_q, q2.shape[0]) if packed else (batch, heads_q, seqlen_q),
                     float("nan"), dtype=state)  # fmt: skip
    for item in (item for prog in programs for item in prog.items):
        q_base = item.q_start + (0 if packed else item.b * seqlen_q)
        k_base = item.k_start + (0 if packed else item.b * k4.shape[1])
        q = _rows(q2, q_base + item.m0, item.h)
        halves = [_Half(item, q[w * HALF : (w + 1) * HALF], w, state) for w in range(2)]
        for tile in item.tiles:
            k, v = (_rows(x2, k_base + tile.start_n, item.h // group) for x2 in (k2, v2))
            key_term = None
            if tile.masked:  # once a tile, shared by both warpgroups (consumer 0 cleans)
                v, key_term = _clean_values(v)
            for half in halves:
                half.step(tile, k, v, key_term, softmax_scale, window_right)
        for w, half in enumerate(halves):
            rows, lse_rows = half.epilogue()
            first = item.m0 + w * HALF
            keep = max(0, min(HALF, item.seqlen_q - first))  # the store clips at the sequence
            out2[q_base + first : q_base + first + keep, item.h] = rows[:keep].to(dtype)
            if packed:
                lse[item.h, q_base + first : q_base + first + keep] = lse_rows[:keep]
            else:
                lse[item.b, item.h, first : first + keep] = lse_rows[:keep]
    return out2.reshape(q4.shape), lse


class _Half:
    """One consumer warpgroup's 64 rows of an item and its online-softmax state."""

    def __init__(self, item: Item, q: torch.Tensor, w: int, state: torch.dtype):
        self.item, self.q, self.state = item, q, state
        self.rows = item.m0 + w * HALF + torch.arange(HALF)  # positions in the sequence
        self.m = torch.full((HALF,), float("-inf"), dtype=state)
        self.l = torch.zeros(HALF, dtype=state)
        self.acc = torch.zeros(HALF, q.shape[-1], dtype=state)

    def step(self, tile: KeyTile, k, v, key_term, scale: float, window_right: int) -> None:
        s = _product(self.q, k.T, self.q.dtype).to(self.state)  # (64, 128)
        if tile.masked:  # kernels/band.py `allowed`, the left side unbounded
            cols = tile.start_n + torch.arange(BLOCK_N)[None, :]
            pos = self.rows[:, None] + self.item.seqlen_k - self.item.seqlen_q
            allowed = (cols < self.item.seqlen_k) & (cols <= pos + window_right) & (
                cols >= pos - UNBOUNDED)  # fmt: skip
            s = torch.where(allowed, s + key_term.to(self.state)[None, :], float("-inf"))
        scale_log2 = scale * math.log2(math.e)
        m_new = torch.maximum(self.m, s.amax(dim=1) * scale_log2)
        m_shift = torch.where(m_new == float("-inf"), 0.0, m_new)
        p = torch.exp2(s * scale_log2 - m_shift[:, None])
        alpha = torch.exp2(self.m - m_shift)
        self.l = self.l * alpha + p.sum(dim=1)
        self.acc = self.acc * alpha[:, None] + _product(p, v, self.q.dtype).to(self.state)
        self.m = m_new

    def epilogue(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out rows (64, D), lse (64,)): 0 and -inf on rows that saw no key."""
        empty = self.l == 0
        l_safe = torch.where(empty, 1.0, self.l)
        lse = torch.where(empty, float("-inf"), (self.m + torch.log2(l_safe)) * math.log(2.0))
        return self.acc / l_safe[:, None], lse


# ------------------------------------------------------------------ the protocol
def _turn_parity(turn: int, w: int) -> int:
    return (turn & 1) ^ 1 if w == 0 else turn & 1  # fwd_schedule.turn_parity, restated


@dataclass(frozen=True)
class Rules:
    """The kernel's waits and arrivals, as functions of the table's rows: the kernel's by
    default; a test plants a wrong one to see the simulation fail. A parity of None skips the
    wait."""

    loader_q_free: Callable[[Item], int | None] = lambda item: item.q_parity ^ 1
    consumer_q_ready: Callable[[Item], int | None] = lambda item: item.q_parity
    loader_k_free: Callable[[KeyTile], int | None] = lambda tile: tile.kv_parity ^ 1
    loader_v_free: Callable[[KeyTile], int | None] = lambda tile: tile.kv_parity ^ 1
    consumer_k_ready: Callable[[KeyTile], int | None] = lambda tile: tile.kv_parity  # S
    consumer_v_ready: Callable[[KeyTile], int | None] = lambda tile: tile.kv_parity  # P V
    clean_v_ready: Callable[[KeyTile], int | None] = lambda tile: tile.kv_parity  # consumer 0
    turn_parity: Callable[[int, int], int | None] = _turn_parity
    clean_slot: Callable[[KeyTile], int] = lambda tile: tile.clean_slot
    clean_ready: Callable[[KeyTile], int | None] = lambda tile: tile.clean_parity  # consumer 1
    first_s_in_turn: bool = False  # an item's first S outside the ping-pong (not counted)
    k_after_s: bool = True  # k_empty arrived only once the S reading the slot retired
    v_after_pv: bool = True  # v_empty arrived only once the P V reading the slot retired
    q_after_last_s: bool = True  # q_empty arrived only once the item's last S retired
    o_store_waited: bool = True  # the output tile written only once its last store read it
    final_store_wait: bool = True  # a consumer ends only once its last store read the tile


class _Buffer:
    """A shared-memory buffer: the tag of what it holds (an item's or a tile's), the reads its
    contents still owe (an overwrite before them is caught where it happens), the asynchronous
    reads of it in flight (GEMMs, TMA stores) and whether a TMA copy into it is in flight."""

    def __init__(self, name: str):
        self.name, self.holds, self.owed, self.busy, self.loading = name, None, 0, 0, False

    def write(self, tag, owed: int, by: str) -> None:
        """A store into it (owed: the reads the new contents owe)."""
        if self.loading or self.busy or self.owed:
            copying = ", a copy in flight" if self.loading else ""
            raise ProtocolError(f"{by} overwrote {self.name} (holding {self.holds}, owing "
                                f"{self.owed} reads, {self.busy} in flight{copying}) with "
                                f"{tag}")  # fmt: skip
        self.holds, self.owed = tag, owed

    def read(self, tag, by: str, owed: int = 1, in_flight: bool = False) -> None:
        """A read of it for `tag`: one of the reads it owes (owed 0: the owner looking),
        in_flight: by an asynchronous GEMM or store."""
        if self.loading or self.holds != tag:
            raise ProtocolError(f"{by} read {self.name} for {tag}: it holds {self.holds}"
                                f"{' (a copy in flight)' if self.loading else ''}")  # fmt: skip
        self.owed -= owed
        self.busy += in_flight


class _Async:
    """A GEMM or TMA store in flight: the buffers it reads stay busy until it completes."""

    def __init__(self, bufs: tuple[_Buffer, ...]):
        self.bufs, self.done = bufs, False

    def complete(self) -> None:
        self.done = True
        for buf in self.bufs:
            buf.busy -= 1


def simulate_protocol(program: Program, stages: int, seed: int, rules: Rules = Rules()) -> int:
    """Play one program's partitions in a random order (seeded); the steps taken. Raises
    ProtocolError on a deadlock, a buffer overwritten while needed or read for the wrong item
    or tile, the consumers' ping-pong issues out of turn, or a consumer ending with its output
    store still reading its staging tile."""
    q_ready = [MBarrier(f"q_ready[{s}]") for s in range(Q_BUFFERS)]
    q_empty = [MBarrier(f"q_empty[{s}]", 2) for s in range(Q_BUFFERS)]
    k_ready = [MBarrier(f"k_ready[{s}]") for s in range(stages)]
    k_empty = [MBarrier(f"k_empty[{s}]", 2) for s in range(stages)]
    v_ready = [MBarrier(f"v_ready[{s}]") for s in range(stages)]
    v_empty = [MBarrier(f"v_empty[{s}]", 2) for s in range(stages)]
    turn = [MBarrier(f"turn[{w}]") for w in range(2)]
    cleaned = [MBarrier(f"cleaned[{c}]") for c in range(2)]
    q_bufs = [[_Buffer(f"Q[{s}] half {w}") for w in range(2)] for s in range(Q_BUFFERS)]
    k_bufs = [_Buffer(f"K[{s}]") for s in range(stages)]
    v_bufs = [_Buffer(f"V[{s}]") for s in range(stages)]
    o_bufs = [_Buffer(f"O staging {w}") for w in range(2)]
    key_terms = [_Buffer(f"key_term[{c}]") for c in range(2)]
    copies: list[tuple[_Buffer, tuple, int, MBarrier]] = []  # TMA loads not yet landed
    gemms: list[list[_Async]] = [[], []]  # per consumer, in issue order (wgmma completes so)
    stores: list[list[_Async]] = [[], []]  # per consumer, its TMA stores still reading
    issues = [0, 0]  # ping-pong issues per consumer
    in_turn = [False, False]

    def wait(bar: MBarrier, parity: int | None) -> Iterator[Callable[[], bool]]:
        if parity is not None:
            yield lambda: bar.passes(parity)

    def copy(buf: _Buffer, tag: tuple, owed: int, bar: MBarrier) -> None:
        buf.write(tag, 0, "the loader")
        buf.holds, buf.loading = None, True  # undefined until the copy lands
        copies.append((buf, tag, owed, bar))

    def loader() -> Iterator[Callable[[], bool]]:
        for item in program.items:
            yield from wait(q_empty[item.q_slot], rules.loader_q_free(item))
            q_ready[item.q_slot].expect(2)  # the two 64-row halves
            for half in q_bufs[item.q_slot]:  # each read by its consumer's S GEMMs
                copy(half, ("Q", item.local), item.n_tiles, q_ready[item.q_slot])
            for tile in item.tiles:  # K read by both consumers' S, V by both P V products
                yield from wait(k_empty[tile.kv_slot], rules.loader_k_free(tile))
                k_ready[tile.kv_slot].expect(1)
                copy(k_bufs[tile.kv_slot], ("K", tile.kv), 2, k_ready[tile.kv_slot])
                yield from wait(v_empty[tile.kv_slot], rules.loader_v_free(tile))
                v_ready[tile.kv_slot].expect(1)
                copy(v_bufs[tile.kv_slot], ("V", tile.kv, False), 2, v_ready[tile.kv_slot])

    def gemm(w: int, reads: list[tuple[_Buffer, tuple]]) -> _Async:
        """One asynchronous product reading `reads`, queued behind this consumer's others."""
        for buf, tag in reads:
            buf.read(tag, f"consumer {w}", in_flight=True)
        op = _Async(tuple(buf for buf, _ in reads))
        gemms[w].append(op)
        return op

    def take_turn(w: int, at: int) -> Iterator[Callable[[], bool]]:
        """Wait for ping-pong turn `at`, then check it is this consumer's: 0 issues its k-th
        after 1's (k - 1)-th is done, 1 its k-th after 0's k-th, never both in a turn at once."""
        yield from wait(turn[w], rules.turn_parity(at, w))
        if in_turn[1 - w] or issues[w] != issues[1 - w] - w:
            raise ProtocolError(f"consumer {w} took its ping-pong issue {issues[w]} out of turn "
                                f"(consumer {1 - w} has issued {issues[1 - w]}"
                                f"{' and holds its turn' if in_turn[1 - w] else ''})")  # fmt: skip
        in_turn[w] = True

    def end_turn(w: int) -> None:
        in_turn[w], issues[w] = False, issues[w] + 1
        turn[1 - w].arrive()

    def clean(w: int, tile: KeyTile) -> Iterator[Callable[[], bool]]:
        """The cleaned-V handshake of a masked tile: consumer 0 waits for V, cleans it in its
        ring slot and writes the score term; consumer 1 waits for both."""
        slot, by, v = rules.clean_slot(tile), f"consumer {w}", v_bufs[tile.kv_slot]
        if w == 0:
            yield from wait(v_ready[tile.kv_slot], rules.clean_v_ready(tile))
            v.read(("V", tile.kv, False), by, owed=0)
            if v.busy:
                raise ProtocolError(f"consumer 0 cleaned {v.name} while a GEMM read it")
            v.holds = ("V", tile.kv, True)  # in place: the reads it owes stay
            key_terms[slot].write(("term", tile.kv), 1, by)
            cleaned[slot].arrive()
        else:
            yield from wait(cleaned[slot], rules.clean_ready(tile))
            key_terms[slot].read(("term", tile.kv), by)

    def tiles(w: int, item: Item) -> Iterator[Callable[[], bool]]:
        """An item's products: S_0 alone outside the ping-pong, then S_t with P_{t-1} V_{t-1}
        a turn (K_t and V_{t-1} waited for before it), then the last P V alone; K released once
        its S retired, V once its P V did, Q once the last S did."""
        q_half = q_bufs[item.q_slot][w]
        first, last = item.tiles[0], item.tiles[-1]
        yield from wait(k_ready[first.kv_slot], rules.consumer_k_ready(first))
        if rules.first_s_in_turn:  # the planted bug: a turn the table does not count
            yield from take_turn(w, item.turn)
        reads = [(q_half, ("Q", item.local)), (k_bufs[first.kv_slot], ("K", first.kv))]
        s = gemm(w, reads)
        if rules.first_s_in_turn:
            end_turn(w)
        prev = None
        for tile in item.tiles:
            if prev is not None:  # S_tile with P_prev V_prev, on prev's turn
                yield from wait(k_ready[tile.kv_slot], rules.consumer_k_ready(tile))
                yield from wait(v_ready[prev.kv_slot], rules.consumer_v_ready(prev))
                yield from take_turn(w, prev.turn)
                s = gemm(w, [(q_half, ("Q", item.local)), (k_bufs[tile.kv_slot], ("K", tile.kv))])
                pv = gemm(w, [(v_bufs[prev.kv_slot], ("V", prev.kv, prev.masked))])
                end_turn(w)
            if not rules.k_after_s:
                k_empty[tile.kv_slot].arrive()  # the planted bug: before S is done
            if tile is last and not rules.q_after_last_s:
                q_empty[item.q_slot].arrive()  # the planted bug: before the last S is done
            yield lambda s=s: s.done
            if rules.k_after_s:
                k_empty[tile.kv_slot].arrive()
            if tile.masked:
                yield from clean(w, tile)
            if prev is not None:
                if not rules.v_after_pv:
                    v_empty[prev.kv_slot].arrive()  # the planted bug: before P V is done
                yield lambda pv=pv: pv.done
                if rules.v_after_pv:
                    v_empty[prev.kv_slot].arrive()
            prev = tile
        if rules.q_after_last_s:
            q_empty[item.q_slot].arrive()
        yield from wait(v_ready[last.kv_slot], rules.consumer_v_ready(last))
        yield from take_turn(w, last.turn)  # the last P V alone
        pv = gemm(w, [(v_bufs[last.kv_slot], ("V", last.kv, last.masked))])
        end_turn(w)
        yield lambda: pv.done
        v_empty[last.kv_slot].arrive()

    def stored(w: int) -> Callable[[], bool]:
        return lambda: not stores[w]

    def consumer(w: int) -> Iterator[Callable[[], bool]]:
        by = f"consumer {w}"
        for item in program.items:
            yield from wait(q_ready[item.q_slot], rules.consumer_q_ready(item))
            if item.tiles:
                yield from tiles(w, item)
            else:
                q_empty[item.q_slot].arrive()  # no key: nothing reads Q
            # epilogue: a half wholly inside the sequence through the staging tile and a TMA
            # store, waited for before the tile is written again; a tail half by pointer stores
            if w * HALF + HALF <= item.seqlen_q - item.m0:
                if rules.o_store_waited:
                    yield stored(w)
                o_bufs[w].write(("O", item.local), 1, by)
                o_bufs[w].read(("O", item.local), by, in_flight=True)
                stores[w].append(_Async((o_bufs[w],)))
        if rules.final_store_wait:
            yield stored(w)

    rng = random.Random(seed)
    actors = {"loader": loader(), "consumer 0": consumer(0), "consumer 1": consumer(1)}
    waiting: dict[str, Callable[[], bool]] = {name: (lambda: True) for name in actors}
    # each seed makes some partitions and some kinds of asynchronous work up to 100x slower
    # than others: a store or copy then stays in flight across many steps of the rest
    pace = {kind: 10 ** rng.uniform(-2, 0) for kind in (*actors, "land", "store", "gemm")}
    steps = 0
    while actors or copies or any(stores) or any(gemms):
        choices: list[tuple[str, int]] = [(name, 0) for name in actors if waiting[name]()]
        choices += [("land", i) for i in range(len(copies))]
        choices += [("store", w) for w in range(2) if stores[w]]
        choices += [("gemm", w) for w in range(2) if gemms[w]]
        if not choices:
            raise ProtocolError(f"deadlock after {steps} steps: {sorted(actors)} wait")
        kind, index = rng.choices(choices, [pace[kind] for kind, _ in choices])[0]
        steps += 1
        if kind == "land":
            buf, tag, owed, bar = copies.pop(index)
            buf.holds, buf.owed, buf.loading = tag, owed, False
            bar.landed()
        elif kind == "store":  # (with the waits, a consumer has at most one in flight)
            stores[index].pop(rng.randrange(len(stores[index]))).complete()
        elif kind == "gemm":
            gemms[index].pop(0).complete()
        else:
            try:
                waiting[kind] = next(actors[kind])
            except StopIteration:
                del actors[kind], waiting[kind]
                w = int(kind[-1]) if kind.startswith("consumer") else None
                if w is not None and stores[w]:
                    raise ProtocolError(
                        f"{kind} ended while its output store still reads {o_bufs[w].name}"
                    ) from None
    return steps
