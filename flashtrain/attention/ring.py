"""Ring attention (context parallelism): one sequence split over the ranks of a process group.

Each rank keeps its query shard; the K/V shards travel round the ring (rank r sends to r+1 and
receives from r-1, with torch.distributed P2P started before each step's compute and waited
after it). At step s rank r holds the K/V of rank src = r - s (mod P), attends to the part of
it that its queries may see with the project's kernels, and merges the partial result into a
running (out, lse) exactly through the log-sum-exp.

The backward runs the same ring. Each step recomputes its attention from the rank's GLOBAL
(merged) out and lse, which makes every partial gradient exact; dQ stays on its rank, and the
fp32 dK/dV of each block travel with it and arrive back at their owner after the last step.
Memory per rank is O(S/P): two K/V buffers and two dK/dV buffers of the local shard's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flashtrain.attention import validation
from flashtrain.attention.api import flash_attn_func
from flashtrain.attention.ops import AttentionArgs, attention_backward
from flashtrain.attention.ring_sharding import chunks_per_rank, group_rank_and_size

# P2P tags: gloo matches messages by tag, so a K/V block and a dK/dV block in flight between
# the same two ranks cannot be confused (NCCL matches in posting order, the same on all ranks).
_TAG_KV, _TAG_DKV = 0, 1
_ALL = slice(None)


# ---- The one adapter to the attention op layer: every kernel call of the ring goes here. ----


def _local_forward(q, k, v, causal: bool, scale: float):
    """(out like q, lse (B, H, Sq) fp32) of q against one K/V block."""
    return flash_attn_func(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)


def _local_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    """(dq, dk, dv) of one block, recomputed from the given (global) out and lse."""
    no_dropout_seed = torch.zeros(1, dtype=torch.int64, device=q.device)
    args = AttentionArgs(
        q=q, k=k, v=v, cu_seqlens_q=None, cu_seqlens_k=None,
        max_seqlen_q=q.shape[1], max_seqlen_k=k.shape[1], softmax_scale=scale,
        window_left=-1, window_right=0 if causal else -1, dropout_p=0.0, softcap=0.0,
        alibi_slopes=None, deterministic=True, block_mask=None, block_tables=[], block_size=0,
    )  # fmt: skip
    return attention_backward(dout, out, lse.contiguous(), no_dropout_seed, *args)


# ---- Which part of the K/V block in hand this rank's queries attend to. ----


@dataclass(frozen=True)
class _Ring:
    """This rank's place in the ring (group rank and size) and what its queries may see."""

    rank: int
    size: int
    layout: str
    causal: bool

    def source(self, step: int) -> int:
        """The rank whose K/V block this rank holds at `step`."""
        return (self.rank - step) % self.size

    def block(self, step: int, local_len: int) -> tuple[slice, slice, bool] | None:
        """(query rows, key rows, causal) of this step's attention, None if nothing is visible.

        Causal, contiguous: earlier ranks' blocks are wholly in the past, later ones wholly in
        the future. Causal, zigzag (rank r holds chunks r and 2P-1-r, each half a shard): from
        an earlier rank only its early chunk is in the past, for both of ours; from a later
        rank both of its chunks are in the past of our late chunk only. Either way a step is
        half a shard by a whole one, so every rank does the same work.
        """
        src = self.source(step)
        if not self.causal:
            return _ALL, _ALL, False
        if src == self.rank:
            return _ALL, _ALL, True  # our own block: the diagonal, in increasing position order
        if chunks_per_rank(self.layout) == 1:
            return (_ALL, _ALL, False) if src < self.rank else None
        half = local_len // 2
        if src < self.rank:
            return _ALL, slice(0, half), False
        return slice(half, None), _ALL, False


class _Exchange:
    """One step's transfers to the next rank and from the previous, started and waited as one."""

    def __init__(self, group: dist.ProcessGroup | None, ring: _Ring):
        group = group if group is not None else dist.group.WORLD
        self.group = group
        self.next = dist.get_global_rank(group, (ring.rank + 1) % ring.size)
        self.prev = dist.get_global_rank(group, (ring.rank - 1) % ring.size)
        self._works = []

    def start(self, transfers: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
        """transfers: (tensor to send, buffer to receive into, tag); every rank posts the same list."""
        ops = []
        for send, recv, tag in transfers:
            ops.append(dist.P2POp(dist.isend, send, self.next, self.group, tag))
            ops.append(dist.P2POp(dist.irecv, recv, self.prev, self.group, tag))
        self._works = dist.batch_isend_irecv(ops)

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works = []


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor):
    """Fold a partial result into the running one, in place, in fp32.

    out (B, S, H, D) fp32, lse (B, H, S) fp32; block_out (B, S, H, D), block_lse (B, H, S).
    Rows that have seen no key yet (lse -inf on both sides) stay 0 / -inf.
    """
    new_lse = torch.logaddexp(lse, block_lse)
    finite = new_lse.masked_fill(torch.isneginf(new_lse), 0.0)  # exp(-inf - 0) = 0, not nan
    keep_old = torch.exp(lse - finite).transpose(1, 2).unsqueeze(-1)  # (B, S, H, 1)
    take_new = torch.exp(block_lse - finite).transpose(1, 2).unsqueeze(-1)
    out.mul_(keep_old).add_(block_out.float() * take_new)
    lse.copy_(new_lse)


def _ring_forward(q, k, v, ring: _Ring, exchange: _Exchange | None, scale: float):
    """(out like q, lse (B, H, S_local) fp32) of the local queries against the whole sequence."""
    batch, local_len, heads, head_dim = q.shape
    out = torch.zeros(batch, local_len, heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, heads, local_len), -math.inf, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v))  # (2, B, S_local, Hkv, D): one contiguous message per step
    kv_next = torch.empty_like(kv) if ring.size > 1 else None
    for step in range(ring.size):
        last = step == ring.size - 1
        if not last:
            exchange.start([(kv, kv_next, _TAG_KV)])
        block = ring.block(step, local_len)
        if block is not None:
            rows, cols, causal = block
            block_out, block_lse = _local_forward(q[:, rows], kv[0, :, cols], kv[1, :, cols],
                                                  causal, scale)  # fmt: skip
            _merge(out[:, rows], lse[:, :, rows], block_out, block_lse)
        if not last:
            exchange.wait()
            kv, kv_next = kv_next, kv
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, ring: _Ring, exchange: _Exchange | None, scale):
    """(dq, dk, dv) of this rank's shards: dq accumulates here, each block's dK/dV (fp32,
    stacked (2, B, S_local, Hkv, D)) travels one step behind its K/V and ends at its owner."""
    local_len = q.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v))
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)  # block in hand's dK/dV
    kv_next = torch.empty_like(kv) if ring.size > 1 else None
    dkv_next = torch.empty_like(dkv) if ring.size > 1 else None
    for step in range(ring.size):
        transfers = []
        if step < ring.size - 1:
            transfers.append((kv, kv_next, _TAG_KV))
        if step > 0:  # the dK/dV of last step's block follow it; the new block's arrive
            transfers.append((dkv, dkv_next, _TAG_DKV))
        if transfers:
            exchange.start(transfers)
        block = ring.block(step, local_len)
        if block is not None:
            rows, cols, causal = block
            dq_block, dk_block, dv_block = _local_backward(
                dout[:, rows], q[:, rows], kv[0, :, cols], kv[1, :, cols], out[:, rows],
                lse[:, :, rows], causal, scale,
            )  # fmt: skip
            dq[:, rows] += dq_block
        if transfers:
            exchange.wait()
            if step < ring.size - 1:
                kv, kv_next = kv_next, kv
            if step > 0:
                dkv, dkv_next = dkv_next, dkv
        if block is not None:
            dkv[0, :, cols] += dk_block
            dkv[1, :, cols] += dv_block
    if ring.size > 1:  # the block in hand is rank r+1's: send it home, receive ours
        exchange.start([(dkv, dkv_next, _TAG_DKV)])
        exchange.wait()
        dkv = dkv_next
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, ring, scale):
        exchange = _Exchange(group, ring) if ring.size > 1 else None
        out, lse = _ring_forward(q, k, v, ring, exchange, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.ring, ctx.scale = group, ring, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        exchange = _Exchange(ctx.group, ctx.ring) if ctx.ring.size > 1 else None
        dq, dk, dv = _ring_backward(dout, q, k, v, out, lse, ctx.ring, exchange, ctx.scale)
        return dq, dk, dv, None, None, None


@torch.compiler.disable  # P2P inside a traced graph is not supported: compiled models break here
def ring_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    layout: str = "zigzag",
    return_lse: bool = False,
):
    """Exact attention over a sequence split across the ranks of `group` (default: the world;
    without torch.distributed initialized, this process alone).

    q: (B, S_local, Hq, D), k, v: (B, S_local, Hkv, D), this rank's shard in `layout` (see
    flashtrain.attention.ring_sharding; shard_sequence makes one). Every rank of the group calls
    this with the same shapes. Returns this rank's shard of the output (B, S_local, Hq, D), and
    with return_lse also its lse (B, Hq, S_local) fp32; equal to flash_attn_func on the full
    sequence, sharded. Differentiable in q, k and v.
    """
    validation.check_qkv(q, k, v)
    validation.check_scale(softmax_scale)
    if q.shape[1] != k.shape[1]:
        raise ValueError(
            f"q has {q.shape[1]} tokens and k/v {k.shape[1]}: ring attention takes shards of one "
            "sequence, so seqlen_q must equal seqlen_k"
        )
    per_rank = chunks_per_rank(layout)  # checks the layout's name
    if q.shape[1] % per_rank != 0:
        raise ValueError(
            f"the local shard has {q.shape[1]} tokens; layout={layout!r} holds {per_rank} equal "
            f"chunks per rank, so it must be a multiple of {per_rank}"
        )
    rank, size = group_rank_and_size(group)
    ring = _Ring(rank=rank, size=size, layout=layout, causal=bool(causal))
    q = q if q.stride(-1) == 1 else q.contiguous()  # the backward hands q to the kernels as is
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse = _RingAttention.apply(q, k, v, group, ring, float(scale))
    return (out, lse) if return_lse else out
