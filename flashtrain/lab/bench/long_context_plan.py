"""What the long-context benchmark (long_context.py) measures, as arithmetic: the layers' shape,
the context-parallel mode, each rank's attention calls (the shapes the trainer's ring and Ulysses
ops launch) and their FLOPs, and the rows a run or the GPU suite plans."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from flashtrain.lab.bench.flops import attention_flops

RECOMPUTE = ("none", "all", "offload")
LAYOUTS = ("zigzag", "contiguous")


# ---- What is measured: the layers' shape, the mode, one row ----------------------------------


@dataclass(frozen=True)
class BlockShape:
    d_model: int
    n_head: int
    n_kv_head: int
    d_ff: int
    layers: int  # >= 2 for offload to move anything: the last block's input stays on the device

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def matmul_params(self) -> int:
        """One block's matmul weights: q, k, v, o and SwiGLU's gate, up, down."""
        attn = 2 * self.d_model**2 + 2 * self.d_model * self.n_kv_head * self.head_dim
        return attn + 3 * self.d_model * self.d_ff


LLAMA3_8B = BlockShape(d_model=4096, n_head=32, n_kv_head=8, d_ff=14336, layers=2)
DRY_SHAPE = BlockShape(d_model=64, n_head=4, n_kv_head=2, d_ff=128, layers=2)


@dataclass(frozen=True)
class Mode:
    """How P = ring * ulysses ranks share one sequence (ring: P x 1, ulysses: 1 x P)."""

    ring: int
    ulysses: int

    @property
    def ranks(self) -> int:
        return self.ring * self.ulysses

    @property
    def name(self) -> str:
        return "ring" if self.ulysses == 1 else "ulysses" if self.ring == 1 else "hybrid"

    @property
    def label(self) -> str:
        return f"hybrid {self.ring}x{self.ulysses}" if self.name == "hybrid" else self.name


def parse_mode(text: str, ranks: int) -> Mode:
    """ring | ulysses | hybrid (2 x P/2) | hybrid:RxU (R ring groups of U Ulysses ranks)."""
    if ranks < 2:
        raise ValueError(f"ranks P must be >= 2 (one rank splits nothing), got {ranks}")
    if text == "ring":
        return Mode(ranks, 1)
    if text == "ulysses":
        return Mode(1, ranks)
    if text == "hybrid":
        text = f"hybrid:2x{ranks // 2}"
    name, _, split = text.partition(":")
    ring, _, ulysses = split.partition("x")
    if name != "hybrid" or not (ring.isdigit() and ulysses.isdigit()):
        raise ValueError(f"mode {text!r}: allowed are ring, ulysses, hybrid, hybrid:RxU (e.g. 2x4)")
    mode = Mode(int(ring), int(ulysses))
    if mode.ring < 2 or mode.ulysses < 2 or mode.ranks != ranks:
        raise ValueError(
            f"mode {text!r}: hybrid needs R >= 2 ring groups of U >= 2 ranks with R * U = P = "
            f"{ranks}"
        )
    return mode


@dataclass(frozen=True)
class RowSpec:
    mode: Mode
    tokens: int  # per GPU (rank)
    recompute: str  # all | offload (none: nothing recomputed)
    tile_tokens: int  # 0: the MLP over all tokens at once

    @property
    def context(self) -> int:
        return self.tokens * self.mode.ranks

    @property
    def name(self) -> str:
        tile = f" tile={self.tile_tokens}" if self.tile_tokens else ""
        return f"{self.mode.label} P={self.mode.ranks} T={self.tokens} {self.recompute}{tile}"


# ---- One rank's attention calls (pure arithmetic: the FLOP estimates and the tests) ----------


@dataclass(frozen=True)
class AttentionCall:
    q_len: int
    k_len: int
    q_heads: int
    kv_heads: int
    causal: bool  # only on a diagonal block, where q_len == k_len

    def flops(self, head_dim: int, mode: str = "fwd") -> float:
        return attention_flops(1, self.q_heads, self.q_len, self.k_len, head_dim,
                               causal=self.causal, mode=mode)  # fmt: skip


def ulysses_heads(heads: int, kv_heads: int, ulysses: int) -> tuple[int, int]:
    """(query heads, K/V heads) each of U Ulysses ranks attends with: Hq / U query heads; Hkv / U
    K/V heads, or 1 where U is a multiple of Hkv (each K/V head then repeated U / Hkv times)."""
    if heads % ulysses:
        raise ValueError(f"{heads} query heads cannot be shared by U={ulysses} Ulysses ranks: "
                         "n_head must be a multiple of U")  # fmt: skip
    if kv_heads % ulysses == 0:
        return heads // ulysses, kv_heads // ulysses
    if ulysses % kv_heads == 0:
        return heads // ulysses, 1
    raise ValueError(f"{kv_heads} K/V heads cannot be shared by U={ulysses} Ulysses ranks: "
                     "n_kv_head must be a multiple or a divisor of U")  # fmt: skip


def busiest_ring_rank(ring: int, layout: str) -> int:
    """The ring rank with the most causal work (the step waits for it): zigzag balances them
    all (rank 0), contiguous gives the last rank every earlier block whole."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: allowed are {', '.join(LAYOUTS)}")
    return ring - 1 if layout == "contiguous" else 0


def ring_blocks(ring: int, length: int, layout: str, rank: int) -> list[tuple[int, int, bool]]:
    """(query rows, key rows, causal) of each causal ring step of `rank` that computes anything,
    each rank holding `length` tokens: step 0 is its own block (the diagonal, causal); then the
    block of rank rank - s. Zigzag (chunks r and 2R-1-r, each half a shard): an earlier rank's
    early chunk for all our rows, a later rank's whole shard for our late chunk only. Contiguous:
    an earlier rank's block whole, a later one's nothing."""
    if layout == "zigzag" and length % 2:
        raise ValueError(f"zigzag holds two equal chunks per rank: {length} tokens is odd")
    blocks = [(length, length, True)]
    for step in range(1, ring):
        source = (rank - step) % ring
        if layout == "contiguous":
            if source < rank:
                blocks.append((length, length, False))
        elif source < rank:
            blocks.append((length, length // 2, False))
        else:
            blocks.append((length // 2, length, False))
    return blocks


def rank_calls(mode: Mode, tokens: int, shape: BlockShape, layout: str) -> list[AttentionCall]:
    """The causal attention calls the busiest rank of `mode` makes per layer (forward): Ulysses
    turns its T tokens x Hq heads into T * U tokens (its ring shard) x Hq / U heads; the ring
    runs its steps over those (R = 1: one causal call)."""
    if tokens < 1:
        raise ValueError(f"tokens per GPU must be >= 1, got {tokens}")
    q_heads, kv_heads = ulysses_heads(shape.n_head, shape.n_kv_head, mode.ulysses)
    length = tokens * mode.ulysses
    if mode.ring == 1:
        return [AttentionCall(length, length, q_heads, kv_heads, True)]
    blocks = ring_blocks(mode.ring, length, layout, busiest_ring_rank(mode.ring, layout))
    return [AttentionCall(q, k, q_heads, kv_heads, causal) for q, k, causal in blocks]


def row_flops(spec: RowSpec, shape: BlockShape, layout: str) -> tuple[float, float]:
    """(model FLOPs, executed FLOPs) of one forward + backward of the stack. Model: 6 N T plus the
    attention's forward + backward (3.5x its forward), what MFU counts; executed adds what
    recompute runs again (the block forward: 2 N T and the attention's forward) and the tiled
    MLP's own recompute of its forward in its backward (2 N_mlp T)."""
    tokens, layers = spec.tokens, shape.layers
    attn = sum(c.flops(shape.head_dim) for c in rank_calls(spec.mode, tokens, shape, layout))
    model = layers * (6 * shape.matmul_params * tokens + 3.5 * attn)
    again = 2 * shape.matmul_params * tokens + attn if spec.recompute != "none" else 0.0
    tiled = 2 * 3 * shape.d_model * shape.d_ff * tokens if spec.tile_tokens else 0.0
    return model, model + layers * (again + tiled)


def plan_rows(modes, tokens, recompute, tiles, shape: BlockShape, layout: str) -> list[RowSpec]:
    """Every (tokens, recompute, tile, mode) row, smallest context first; each one checked."""
    rows = []
    for t, r, tile, mode in itertools.product(tokens, recompute, tiles, modes):
        if r not in RECOMPUTE:
            raise ValueError(f"recompute {r!r}: allowed are {', '.join(RECOMPUTE)}")
        if tile < 0:
            raise ValueError(f"tile tokens must be >= 0 (0: off), got {tile}")
        rank_calls(mode, t, shape, layout)  # heads and lengths this mode can split
        rows.append(RowSpec(mode, t, r, tile))
    return rows


def suite_rows(ranks: int, tokens, tile: int) -> list[RowSpec]:
    """The GPU suite's rows in order of value, per length: ring, ulysses and hybrid 2 x P/2
    with offload and tiling (what long-context training runs), then ring with recompute=all
    untiled (what they save)."""
    modes = [parse_mode(m, ranks) for m in ("ring", "ulysses", "hybrid")]
    rows = []
    for t in tokens:
        rows += [RowSpec(m, t, "offload", tile) for m in modes] + [RowSpec(modes[0], t, "all", 0)]
    return rows
