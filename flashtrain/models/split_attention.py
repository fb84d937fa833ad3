"""Attention over sequences split across the ranks of a context-parallel group: the impls the
trainer builds for trainer.context_parallel > 1 (flashtrain/train/context_parallel.py), from the
user's flash config, never picked by attention.impl.

    RingAttention     trainer.context_parallel_mode=ring: K/V shards travel round the ring
                      (flashtrain.attention.ring_attn_func); P2P traffic, any head count
    UlyssesAttention  ulysses: an all-to-all from sequence shards to head shards around the
                      attention op (flashtrain.attention.ulysses_attn_func); hybrid: Ulysses
                      inside groups of U ranks, the ring across the P / U groups

q, k, v (B, T_local, H, D) are this rank's shard of every sequence
(flashtrain.attention.ring_sharding: take_cp_shard); the result is exact over the whole
sequence. Document masking: AttentionContext.documents, the whole batch's table as host ints.
Refused, naming the reason: padded batches (no key-padding mask), attention dropout, a sliding
window or score softcap (the split ops have neither), other impls (block-sparse layouts and the
sdpa / reference baselines attend over the whole sequence at once).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn

from flashtrain.attention import ring_attn_func
from flashtrain.attention.ring_sharding import check_layout, group_rank_and_size
from flashtrain.attention.ulysses import ulysses_attn_func
from flashtrain.models.attention_layers import (
    Attention,
    AttentionContext,
    FlashAttentionConfig,
    attention_config,
)


class SplitSequenceAttention(Attention):
    """What the split impls share: the checks, the refusals and the whole-sequence mean.

    ring_size x ulysses_size ranks hold the shards (ring: P x 1, ulysses: 1 x P, hybrid R x U);
    sequence_group spans all of them (None: the world). rank: this rank's index in the group."""

    Config = FlashAttentionConfig
    runs_our_kernels = True
    splits_sequence = True
    mode: ClassVar[str]
    NO_PADDING = (
        "context parallelism has no key-padding mask: batches must be unpadded (attention_mask "
        "all ones), as LM windows and Pathfinder images are; documents packed in a window are "
        "masked with data.document_masking=true"
    )

    def __init__(
        self,
        cfg: Any,
        *,
        layout: str,
        sequence_group: dist.ProcessGroup | None,
        ring_size: int,
        ulysses_size: int,
        rank: int,
    ):
        cfg = attention_config(cfg)
        if not isinstance(cfg, FlashAttentionConfig):
            raise ValueError(
                f"context parallelism runs on the flash kernels; attention impl {cfg.impl!r} "
                "cannot be split over ranks (block-sparse layouts and the sdpa / reference "
                "baselines attend over the whole sequence at once): use attention=flash"
            )
        check_layout(layout)
        super().__init__(cfg)
        self.layout, self.sequence_group = layout, sequence_group
        self.ring_size, self.ulysses_size, self.rank = ring_size, ulysses_size, rank

    @property
    def size(self) -> int:
        """The ranks one sequence is split over."""
        return self.ring_size * self.ulysses_size

    def describe(self) -> str:
        return f"context parallelism ({self.mode})"

    def check_model(self, config) -> None:
        super().check_model(config)
        if config.attn_dropout > 0:
            raise ValueError(
                f"{self.describe()} has no attention dropout: set model.attn_dropout=0 (got "
                f"{config.attn_dropout}); model.dropout still applies"
            )

    def padded_context(self, x, mask, **ctx_kwargs):
        raise ValueError(self.NO_PADDING)

    def check_call(self, ctx: AttentionContext, dropout_p: float) -> None:
        if ctx.packed or ctx.key_padding_mask is not None:
            raise ValueError(self.NO_PADDING)
        if dropout_p > 0.0:
            raise ValueError(f"{self.describe()} has no attention dropout")

    def sequence_mean(self, x: torch.Tensor) -> torch.Tensor:
        """The mean over every rank's shard: a differentiable all-reduce of the local sums
        (its backward sums every rank's gradient, as the shards' contributions to the mean)."""
        if self.size == 1:
            return super().sequence_mean(x)
        group = self.sequence_group if self.sequence_group is not None else dist.group.WORLD
        total = dist_nn.all_reduce(x.sum(dim=1), group=group)  # (B, C)
        return total / (x.shape[1] * self.size)


class RingAttention(SplitSequenceAttention):
    """The ring over `group` (None: the world; without torch.distributed, this process)."""

    mode = "ring"

    def __init__(self, cfg: Any, *, group: dist.ProcessGroup | None, layout: str = "zigzag"):
        rank, size = group_rank_and_size(group)
        super().__init__(cfg, layout=layout, sequence_group=group, ring_size=size,
                         ulysses_size=1, rank=rank)  # fmt: skip
        self.group = group

    def extra_repr(self) -> str:
        return f"impl=flash, ring over {self.size} ranks, layout={self.layout}"

    def forward(self, q, k, v, ctx: AttentionContext, dropout_p: float = 0.0) -> torch.Tensor:
        self.check_call(ctx, dropout_p)
        return ring_attn_func(q, k, v, group=self.group, causal=ctx.causal, layout=self.layout,
                              cu_seqlens=ctx.documents)  # fmt: skip


class UlyssesAttention(SplitSequenceAttention):
    """Ulysses over `group` (U ranks), and the ring over `ring_group` (R ranks holding the same
    heads, None: R = 1) for hybrid. Needs n_head % U == 0 and the K/V heads split or repeated
    evenly over U (checked by the op)."""

    mode = "ulysses"

    def __init__(
        self,
        cfg: Any,
        *,
        group: dist.ProcessGroup | None,
        ring_group: dist.ProcessGroup | None,
        sequence_group: dist.ProcessGroup | None,
        layout: str = "zigzag",
        ring_size: int,
        ulysses_size: int,
        rank: int,
    ):
        super().__init__(cfg, layout=layout, sequence_group=sequence_group, ring_size=ring_size,
                         ulysses_size=ulysses_size, rank=rank)  # fmt: skip
        self.group, self.ring_group = group, ring_group
        if ring_size > 1:
            self.mode = "hybrid"

    def extra_repr(self) -> str:
        ring = (
            f", ring over {self.ring_size} groups, layout={self.layout}"
            if self.ring_size > 1
            else ""
        )
        return f"impl=flash, ulysses over {self.ulysses_size} ranks{ring}"

    def check_model(self, config) -> None:
        super().check_model(config)
        heads, kv_heads, u = (
            config.n_head,
            getattr(config, "n_kv_head", config.n_head),
            self.ulysses_size,
        )
        if heads % u or (kv_heads % u and u % kv_heads):
            raise ValueError(
                f"{self.describe()} shares the heads out over {u} ranks: model.n_head={heads} "
                f"must be a multiple of {u}, and model.n_kv_head={kv_heads} a multiple or a "
                f"divisor of {u}; use a smaller Ulysses group (trainer.ulysses_size) or "
                "trainer.context_parallel_mode=ring"
            )

    def forward(self, q, k, v, ctx: AttentionContext, dropout_p: float = 0.0) -> torch.Tensor:
        self.check_call(ctx, dropout_p)
        return ulysses_attn_func(q, k, v, group=self.group, ring_group=self.ring_group,
                                 causal=ctx.causal, layout=self.layout,
                                 cu_seqlens=ctx.documents)  # fmt: skip
