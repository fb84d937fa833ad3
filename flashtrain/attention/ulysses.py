"""Ulysses (DeepSpeed-Ulysses) context parallelism, alone or inside a ring (hybrid).

Each of the U ranks of a Ulysses group holds a piece of every sequence with all its heads. One
all-to-all inside the group turns that into the group's whole (ring shard of the) sequence with
a 1/U share of the heads; attention runs there (flash_attn_func, or ring_attn_func across the R
groups of a hybrid layout), and a second all-to-all brings the output back to the pieces.
The backward of each all-to-all is the reverse all-to-all. Who holds which tokens:
flashtrain.attention.ring_sharding (take_cp_shard, cp_shard_positions).

Per call and rank: an all-to-all each for q, k, v and the output (B * S_local tokens of all
their heads each; the backward the same in reverse), whatever U is: one tensor's buffers at a
time, since at a million tokens per GPU the buffers, not the message count, set the limit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from flashtrain.attention import validation
from flashtrain.attention.api import flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.ring import ring_attn_func
from flashtrain.attention.ring_documents import document_table
from flashtrain.attention.ring_sharding import check_cp_sequence_length, group_rank_and_size

# ---- Heads: which share of the query and K/V heads each rank of the group attends with. ----


def ulysses_kv_repeats(heads_q: int, heads_kv: int, ulysses_size: int) -> int:
    """How many times each K/V head is repeated before the heads are split over U ranks.

    Query heads split evenly (Hq % U == 0). K/V heads too where they can (Hkv % U == 0: 1, no
    copy); with fewer K/V heads than ranks (U % Hkv == 0) each is repeated U / Hkv times, so every
    rank gets exactly the one K/V head its Hq / U query heads read (query head h reads K/V head
    h // (Hq / Hkv), as in flash_attn_func). Anything else is a ValueError.
    """
    if heads_q % ulysses_size != 0:
        raise ValueError(
            f"heads_q={heads_q} must be a multiple of the Ulysses group size U={ulysses_size}: "
            "each rank attends with Hq / U of the query heads"
        )
    if heads_kv % ulysses_size == 0:
        return 1
    if ulysses_size % heads_kv == 0:
        return ulysses_size // heads_kv
    raise ValueError(
        f"heads_kv={heads_kv} (heads_q={heads_q}) cannot be shared by U={ulysses_size} ranks: "
        "allowed are heads_kv a multiple of U, or a divisor of U (each K/V head then repeated)"
    )


# ---- The all-to-all: (sequence pieces, all heads) <-> (whole sequence, a share of the heads). ----


def _heads_to_sequence(tensors: Sequence[torch.Tensor], group, size: int) -> list[torch.Tensor]:
    """[(B, S, U * h_i, D)] -> [(B, U * S, h_i, D)]: this rank's head group of the pieces of
    every rank of `group`, piece u = rank u's tokens. One all-to-all per tensor, so that at most
    one tensor's send and receive buffers exist at a time (memory, not messages, is what limits
    the context)."""
    return [_one_heads_to_sequence(t, group, size) for t in tensors]


def _one_heads_to_sequence(x: torch.Tensor, group, size: int) -> torch.Tensor:
    batch, seq, heads, dim = x.shape
    h = heads // size
    send = (
        x.reshape(batch, seq, size, h, dim).permute(2, 0, 1, 3, 4).contiguous()
    )  # (U, B, S, h, D)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)  # block i: rank i's tokens
    del send
    return received.transpose(0, 1).reshape(batch, size * seq, h, dim)  # (B, U * S, h, D)


def _sequence_to_heads(tensors: Sequence[torch.Tensor], group, size: int) -> list[torch.Tensor]:
    """[(B, U * S, h_i, D)] -> [(B, S, U * h_i, D)]: the inverse of _heads_to_sequence, one
    all-to-all per tensor likewise."""
    return [_one_sequence_to_heads(t, group, size) for t in tensors]


def _one_sequence_to_heads(x: torch.Tensor, group, size: int) -> torch.Tensor:
    batch, seq_total, h, dim = x.shape
    seq = seq_total // size
    send = x.reshape(batch, size, seq, h, dim).transpose(0, 1).contiguous()  # (U, B, S, h, D)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)  # block i: head group i
    del send
    return received.permute(1, 2, 0, 3, 4).reshape(batch, seq, size * h, dim)  # (B, S, U * h, D)


class _HeadsToSequence(torch.autograd.Function):
    """Forward _heads_to_sequence; backward its inverse (a permutation's adjoint)."""

    @staticmethod
    def forward(ctx, group, size, *tensors):
        ctx.group, ctx.size = group, size
        return tuple(_heads_to_sequence(tensors, group, size))

    @staticmethod
    def backward(ctx, *grads):
        return None, None, *_sequence_to_heads(grads, ctx.group, ctx.size)


class _SequenceToHeads(torch.autograd.Function):
    """Forward _sequence_to_heads; backward _heads_to_sequence."""

    @staticmethod
    def forward(ctx, group, size, *tensors):
        ctx.group, ctx.size = group, size
        return tuple(_sequence_to_heads(tensors, group, size))

    @staticmethod
    def backward(ctx, *grads):
        return None, None, *_heads_to_sequence(grads, ctx.group, ctx.size)


# ---- Documents: the global table (checked by ring_documents.document_table, cached). ----


@functools.lru_cache(maxsize=64)  # a model calls once per layer with the same table
def _longest_document(table: tuple[int, ...]) -> int:
    return max(b - a for a, b in zip(table, table[1:]))


@functools.lru_cache(maxsize=64)
def _device_table(table: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The int32 table the varlen kernels read, on the inputs' device, built once."""
    return torch.tensor(table, dtype=torch.int32, device=device)


# ---- The op. ----


def _attend(q, k, v, ring_group, ring_size, causal, scale, layout, table):
    """(out (B, S_ring, h, D), lse (B, h, S_ring) fp32) over the group's tokens; table: the
    checked document table or None."""
    if ring_size > 1:
        return ring_attn_func(
            q, k, v, group=ring_group, causal=causal, softmax_scale=scale, layout=layout,
            return_lse=True, cu_seqlens=table,
        )  # fmt: skip
    if table is None:
        return flash_attn_func(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
    batch, seq, heads, dim = q.shape
    cu = _device_table(table, q.device)
    longest = _longest_document(table)
    q, k, v = (t.reshape(batch * seq, t.shape[2], dim) for t in (q, k, v))  # (B * S, h, D)
    out, lse = flash_attn_varlen_func(
        q, k, v, cu, cu, longest, longest, causal=causal, softmax_scale=scale, return_lse=True
    )  # out (B * S, h, D), lse (h, B * S)
    return out.reshape(batch, seq, heads, dim), lse.reshape(heads, batch, seq).transpose(0, 1)


@torch.compiler.disable  # collectives inside a traced graph are not supported
def ulysses_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    ring_group: dist.ProcessGroup | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    layout: str = "zigzag",
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    return_lse: bool = False,
):
    """Exact attention over sequences split across a Ulysses group of U ranks (`group`, default
    the world), and with `ring_group` (the R ranks with this rank's Ulysses index, one per group)
    across a ring of such groups: P = R * U ranks in all.

    q: (B, S_local, Hq, D), k, v: (B, S_local, Hkv, D), this rank's tokens as take_cp_shard(x, 1,
    r * U + u, R, U, layout) gives them (layout matters only with a ring). Hq % U == 0; Hkv a
    multiple or a divisor of U (ulysses_kv_repeats). cu_seqlens: None, or the whole batch's
    document table as one process would pass it to flash_attn_varlen_func: host ints (a tuple, or
    a CPU tensor), prefix sums over the flattened (B * S_global) tokens, every multiple of
    S_global a boundary; tokens attend only within their document. Every rank of both groups
    calls this with the same shapes and table.
    Returns this rank's output (B, S_local, Hq, D), and with return_lse also its lse
    (B, Hq, S_local) fp32: flash_attn_func (or the varlen call) on the full batch, sharded.
    Differentiable in q, k and v.
    """
    validation.check_qkv(q, k, v)
    validation.check_scale(softmax_scale)
    validation.check_split_sequence(q, k, "Ulysses attention")
    _, size = group_rank_and_size(group)
    ring_size = 1 if ring_group is None else group_rank_and_size(ring_group)[1]
    if dist.is_initialized() and size * ring_size > dist.get_world_size():
        raise ValueError(
            f"the Ulysses group has U={size} ranks and the ring group R={ring_size}: R * U must "
            f"not exceed the world's {dist.get_world_size()} ranks (pass group= the Ulysses group)"
        )
    batch, local_len = q.shape[:2]
    seq_len = local_len * size * ring_size
    check_cp_sequence_length(seq_len, ring_size, size, layout, "the global sequence length")
    repeats = ulysses_kv_repeats(q.shape[2], k.shape[2], size)
    table = None if cu_seqlens is None else document_table(cu_seqlens, batch, seq_len)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if repeats > 1:  # query head h reads K/V head h // (Hq / Hkv): consecutive copies
        k, v = k.repeat_interleave(repeats, dim=2), v.repeat_interleave(repeats, dim=2)
    if size > 1:
        q, k, v = _HeadsToSequence.apply(group, size, q, k, v)  # (B, U * S_local, H / U, D)
    out, lse = _attend(q, k, v, ring_group, ring_size, causal, float(scale), layout, table)
    if size > 1:
        (out,) = _SequenceToHeads.apply(group, size, out)  # (B, S_local, Hq, D)
        if return_lse:  # lse as (B, S, h, 1) rides the same all-to-all, without a gradient
            (lse,) = _sequence_to_heads([lse.detach().transpose(1, 2)[..., None]], group, size)
            lse = lse[..., 0].transpose(1, 2).contiguous()  # (B, Hq, S_local)
    return (out, lse) if return_lse else out
