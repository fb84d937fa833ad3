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

With a document table (cu_seqlens) tokens attend only within their document: each step's work
is then a few varlen calls planned on the host (flashtrain.attention.ring_documents), over the
same ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flashtrain.attention import validation
from flashtrain.attention.api import flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.ops import AttentionArgs, attention_backward
from flashtrain.attention.ring_documents import (
    DocumentPlan,
    VarlenCall,
    document_table,
    plan_steps,
)
from flashtrain.attention.ring_sharding import chunks_per_rank, group_rank_and_size

# P2P tags: gloo matches messages by tag, so a K/V block and a dK/dV block in flight between
# the same two ranks cannot be confused (NCCL matches in posting order, the same on all ranks).
_TAG_KV, _TAG_DKV = 0, 1
_ALL = slice(None)


# ---- The one adapter to the attention op layer: every kernel call of the ring goes here. ----


def _local_forward(q, k, v, causal: bool, scale: float):
    """(out like q, lse (B, H, Sq) fp32) of q against one K/V block."""
    return flash_attn_func(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)


def _local_varlen_forward(q, k, v, call: VarlenCall, cu_q, cu_k, scale: float):
    """(out like q, lse (H, total_q) fp32) of packed q (total_q, H, D) against packed k, v:
    the sequences of one planned call, cu_q / cu_k its int32 tables on q's device."""
    return flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, call.max_q, call.max_k, causal=call.causal, softmax_scale=scale,
        return_lse=True,
    )  # fmt: skip


def _local_backward(dout, q, k, v, out, lse, causal: bool, scale: float, packing=None):
    """(dq, dk, dv) of one block, recomputed from the given (global) out and lse.

    packing: None for dense blocks (B, S, H, D), or (cu_q, cu_k, max_q, max_k) for packed ones
    (total, H, D) with lse (H, total_q)."""
    cu_q, cu_k, max_q, max_k = packing or (None, None, q.shape[1], k.shape[1])
    no_dropout_seed = torch.zeros(1, dtype=torch.int64, device=q.device)
    args = AttentionArgs(
        q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=max_q, max_seqlen_k=max_k, softmax_scale=scale,
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


# ---- What each step computes: partial results for some query rows from some key rows. ----


class _DenseSteps:
    """Attention over the whole sequence: per step at most one block, _Ring.block's rows x cols."""

    def __init__(self, ring: _Ring, scale: float):
        self.ring, self.scale = ring, scale

    def backward_inputs(self, dout, out, lse):
        """(dout, out, lse) as backward takes them."""
        return dout, out, lse

    def forward(self, step: int, q, k, v) -> list:
        """[(query rows, out (B, rows, H, D), lse (B, H, rows))] of this step's block."""
        block = self.ring.block(step, q.shape[1])
        if block is None:
            return []
        rows, cols, causal = block
        return [(rows, *_local_forward(q[:, rows], k[:, cols], v[:, cols], causal, self.scale))]

    def backward(self, step: int, dout, q, k, v, out, lse) -> list:
        """[(query rows, key rows, dq, dk, dv)] of this step's block."""
        block = self.ring.block(step, q.shape[1])
        if block is None:
            return []
        rows, cols, causal = block
        grads = _local_backward(
            dout[:, rows], q[:, rows], k[:, cols], v[:, cols], out[:, rows], lse[:, :, rows],
            causal, self.scale,
        )  # fmt: skip
        return [(rows, cols, *grads)]


class _DocumentSteps:
    """Attention within documents: each step's varlen calls (ring_documents.plan_steps) over
    the whole flattened shards, their int32 tables copied to the device once per ring call."""

    def __init__(self, plan: DocumentPlan, device: torch.device, scale: float):
        self.plan, self.scale = plan, scale
        self.tables = plan.device_tables(device)

    def _calls(self, step: int):
        return zip(self.plan.steps[step], self.tables[step])

    def backward_inputs(self, dout, out, lse):
        """dout contiguous (viewed packed) and lse (B, H, S) as the varlen backward's (H, B * S),
        once per backward rather than once per call."""
        return dout.contiguous(), out, lse.transpose(0, 1).reshape(lse.shape[1], -1)

    def forward(self, step: int, q, k, v) -> list:
        """[(all rows, out (B, S, H, D), lse (B, H, S))] per call of this step."""
        batch, local_len, heads = q.shape[:3]
        results = []
        for call, (cu_q, cu_k) in self._calls(step):
            out, lse = _local_varlen_forward(
                _packed(q), _packed(k), _packed(v), call, cu_q, cu_k, self.scale
            )
            lse = lse.view(heads, batch, local_len).transpose(0, 1)
            results.append((_ALL, out.view(q.shape), lse))
        return results

    def backward(self, step: int, dout, q, k, v, out, lse) -> list:
        """[(all rows, all key rows, dq, dk, dv)] per call of this step; lse (H, B * S)."""
        results = []
        for call, (cu_q, cu_k) in self._calls(step):
            grads = _local_backward(
                _packed(dout), _packed(q), _packed(k), _packed(v), _packed(out), lse,
                call.causal, self.scale, packing=(cu_q, cu_k, call.max_q, call.max_k),
            )  # fmt: skip
            dq, dk, dv = (grad.view(x.shape) for grad, x in zip(grads, (q, k, v)))
            results.append((_ALL, _ALL, dq, dk, dv))
        return results


def _packed(x: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) -> (B * S, H, D), a view: callers pass contiguous tensors."""
    return x.view(-1, *x.shape[2:])


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


def _ring_forward(q, k, v, ring: _Ring, exchange: _Exchange | None, steps):
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
        for rows, block_out, block_lse in steps.forward(step, q, kv[0], kv[1]):
            _merge(out[:, rows], lse[:, :, rows], block_out, block_lse)
        if not last:
            exchange.wait()
            kv, kv_next = kv_next, kv
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, ring: _Ring, exchange: _Exchange | None, steps):
    """(dq, dk, dv) of this rank's shards: dq accumulates here, each block's dK/dV (fp32,
    stacked (2, B, S_local, Hkv, D)) travels one step behind its K/V and ends at its owner."""
    dout, out, lse = steps.backward_inputs(dout, out, lse)
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
        grads = steps.backward(step, dout, q, kv[0], kv[1], out, lse)  # before the wait: overlap
        for rows, _, dq_block, _, _ in grads:
            dq[:, rows] += dq_block
        if transfers:
            exchange.wait()
            if step < ring.size - 1:
                kv, kv_next = kv_next, kv
            if step > 0:
                dkv, dkv_next = dkv_next, dkv
        for _, cols, _, dk_block, dv_block in grads:  # the block in hand's accumulator, now
            dkv[0, :, cols] += dk_block
            dkv[1, :, cols] += dv_block
    if ring.size > 1:  # the block in hand is rank r+1's: send it home, receive ours
        exchange.start([(dkv, dkv_next, _TAG_DKV)])
        exchange.wait()
        dkv = dkv_next
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, ring, steps):
        exchange = _Exchange(group, ring) if ring.size > 1 else None
        out, lse = _ring_forward(q, k, v, ring, exchange, steps)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.ring, ctx.steps = group, ring, steps
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        exchange = _Exchange(ctx.group, ctx.ring) if ctx.ring.size > 1 else None
        dq, dk, dv = _ring_backward(dout, q, k, v, out, lse, ctx.ring, exchange, ctx.steps)
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
    cu_seqlens: tuple[int, ...] | torch.Tensor | None = None,
):
    """Exact attention over a sequence split across the ranks of `group` (default: the world;
    without torch.distributed initialized, this process alone).

    q: (B, S_local, Hq, D), k, v: (B, S_local, Hkv, D), this rank's shard in `layout` (see
    flashtrain.attention.ring_sharding; shard_sequence makes one). Every rank of the group calls
    this with the same shapes. Returns this rank's shard of the output (B, S_local, Hq, D), and
    with return_lse also its lse (B, Hq, S_local) fp32; equal to flash_attn_func on the full
    sequence, sharded. Differentiable in q, k and v.

    cu_seqlens: None, or document masking: the GLOBAL document table, the same on every rank,
    as flash_attn_varlen_func takes it for the full sequence flattened to (B * S_global) tokens
    (S_global = P * S_local): a tuple of ints (a list, or a CPU integer tensor, is read once;
    a GPU tensor is refused: the steps are planned on the host). Starts at 0, ends at
    B * S_global, non-decreasing (empty documents are allowed), and has every multiple of
    S_global as an entry (no document joins two rows). The result then equals
    flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, ...) on the full sequence, sharded.
    The plan of each table is cached: pass the same tuple to every layer.
    """
    validation.check_qkv(q, k, v)
    validation.check_scale(softmax_scale)
    validation.check_split_sequence(q, k, "ring attention")
    per_rank = chunks_per_rank(layout)  # checks the layout's name
    if q.shape[1] % per_rank != 0:
        raise ValueError(
            f"the local shard has {q.shape[1]} tokens; layout={layout!r} holds {per_rank} equal "
            f"chunks per rank, so it must be a multiple of {per_rank}"
        )
    rank, size = group_rank_and_size(group)
    ring = _Ring(rank=rank, size=size, layout=layout, causal=bool(causal))
    scale = float(softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if cu_seqlens is None:
        q = q if q.stride(-1) == 1 else q.contiguous()  # the backward hands q to the kernels as is
        steps = _DenseSteps(ring, scale)
    else:
        batch, local_len = q.shape[:2]
        table = document_table(cu_seqlens, batch, local_len * size)
        plan = plan_steps(table, rank, size, layout, ring.causal, local_len, batch)
        q = q.contiguous()  # the varlen calls take (B * S_local, H, D) views
        steps = _DocumentSteps(plan, q.device, scale)
    out, lse = _RingAttention.apply(q, k, v, group, ring, steps)
    return (out, lse) if return_lse else out
