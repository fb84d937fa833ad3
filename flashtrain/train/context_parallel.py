"""Context parallelism in the trainer: each sequence split over `trainer.context_parallel` ranks.

The world is a device mesh of world_size / cp data-parallel groups of cp ranks, cp the inner
dimension so that a group is consecutive ranks (one node's NVLink domain when cp is at most the
GPUs per node), as torchtitan lays its mesh out. trainer.context_parallel_mode picks how the
group shares attention (docs/context_parallel.md):

- ring: RingAttention over the group: K/V shards travel round it (any head count).
- ulysses: UlyssesAttention: an all-to-all turns sequence shards into head shards around the
  attention op and back (n_head a multiple of cp; K/V heads split or repeated).
- hybrid: Ulysses inside groups of U = trainer.ulysses_size consecutive ranks, the ring across
  the cp / U groups: mesh (dp, cp_ring, cp_ulysses).
A rank of the group (index r * U + u) holds piece u of ring shard r of every sequence
(flashtrain.attention.ring_sharding.take_cp_shard); the model's other layers work per token.

- Data: the loader is built for the data-parallel group (rank dp_rank of dp_size), so every rank
  of a group reads the same batches; each keeps its shard of every sequence along the sequence
  axis (the labels alike) and the shard's positions (`position_ids`: global, or restarting per
  document with document masking, whose table `cu_seqlens` stays whole and on the host).
- Gradients: DDP / FSDP2 over the flattened dp x cp mesh (torchtitan shards FSDP over its
  `dp_shard_cp`). A rank's gradient is the part of the loss's gradient that flows through its own
  tokens (the ops' backwards return dK/dV to their owners), so the full gradient is the sum
  over the group; the trainer weights each rank's loss by its share of the step's targets times
  the world size, and DDP's / FSDP's mean over all ranks is then exactly that sum, averaged
  token-weighted over the data-parallel groups. One all-reduce, not one per dimension.
  trainer.strategy=hsdp lays the same ranks out as (replicate, shard) (distributed.wrap_model):
  a shard group is trainer.shard_group_size consecutive ranks, a multiple of cp, so whole
  context-parallel groups shard together (torchtitan's dp_shard_cp) and the mean is the same.
- Loss, token counts, accuracy: the trainer's all-reduces run over the world, which counts every
  token once (the shards are disjoint). A sequence-level loss (classification, mean pooling over
  the whole sequence) is the same on every rank of a group and is counted once per rank in both
  the loss sum and the target count, so its mean is right too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from flashtrain.attention.ring_sharding import (
    check_cp_sequence_length,
    cp_shard_positions,
    take_cp_shard,
)
from flashtrain.data.module import DataModule
from flashtrain.data.registry import LOADERS
from flashtrain.models import RingAttention, UlyssesAttention, build_model
from flashtrain.models.split_attention import SplitSequenceAttention
from flashtrain.train.config import (
    ConfigError,
    TrainConfig,
    check_context_parallel,
    context_parallel_sizes,
)
from flashtrain.train.distributed import DistEnv

# Batch keys with a sequence axis (dim 1), split like input_ids.
SEQUENCE_KEYS = ("input_ids", "labels", "token_type_ids", "position_ids")
# Document masking's (data/packing.py): the whole batch's table, kept whole and on the host.
DOCUMENT_KEYS = ("cu_seqlens", "max_seqlen")


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in the (dp, cp) grid. size 1: context parallelism is off, every rank
    its own data-parallel group, and every method here leaves things as they are."""

    size: int = 1  # ranks per sequence: ring_size * ulysses_size
    layout: str = "zigzag"  # how the ring splits a sequence (flashtrain.attention.ring_sharding)
    rank: int = 0  # this rank's index in its group: ring index * ulysses_size + ulysses index
    dp_rank: int = 0  # its group's index
    dp_size: int = 1  # the number of groups
    group: dist.ProcessGroup | None = None  # the ranks sharing this rank's sequences
    mesh: Any = None  # DeviceMesh with the flattened "dp_cp", or None
    mode: str = "ring"  # trainer.context_parallel_mode
    ring_size: int = 1
    ulysses_size: int = 1
    ring_group: dist.ProcessGroup | None = None  # hybrid: the ranks holding the same heads
    ulysses_group: dist.ProcessGroup | None = None  # ulysses / hybrid: the all-to-all's ranks

    def __post_init__(self):
        if self.ring_size == self.ulysses_size == 1:  # sizes not given: the ring over them all
            object.__setattr__(self, "ring_size", self.size)
        if self.ring_size * self.ulysses_size != self.size:
            raise ValueError(
                f"ring_size={self.ring_size} x ulysses_size={self.ulysses_size} ranks must make "
                f"the group's size={self.size}"
            )

    @property
    def enabled(self) -> bool:
        return self.size > 1

    @property
    def gradient_mesh(self):
        """The 1-D mesh of every rank (dp x cp flattened) that DDP / FSDP2 reduce gradients
        over (hsdp unflattens it into its shard groups); None without context parallelism (the
        world, as before)."""
        return self.mesh["dp_cp"] if self.mesh is not None else None

    def describe(self) -> str:
        how = {
            "ring": f"ring attention, layout {self.layout}",
            "ulysses": "Ulysses: all-to-all to head shards",
            "hybrid": f"hybrid: Ulysses in groups of {self.ulysses_size}, ring across "
            f"{self.ring_size} groups, layout {self.layout}",
        }[self.mode]
        return (
            f"context parallel: each sequence split over {self.size} ranks ({how}); "
            f"{self.dp_size} data-parallel group(s)"
        )

    # ---- the model

    def attention(self, attention_cfg: Any) -> SplitSequenceAttention:
        """The split attention op of this rank; planned (no mesh, a dry run): its sizes only."""
        if self.mode == "ring":
            op = RingAttention(attention_cfg, group=self.group, layout=self.layout)
        else:
            op = UlyssesAttention(
                attention_cfg, group=self.ulysses_group, ring_group=self.ring_group,
                sequence_group=self.group, layout=self.layout, ring_size=self.ring_size,
                ulysses_size=self.ulysses_size, rank=self.rank,
            )  # fmt: skip
        if self.mesh is None:  # planned for a dry run: no group, no forward; say its sizes
            op.rank, op.ring_size, op.ulysses_size = self.rank, self.ring_size, self.ulysses_size
        return op

    def build_model(self, model_cfg: Any, attention_cfg: Any):
        """build_model with the split attention over the group; what it cannot run (another
        attention impl, attention dropout, heads Ulysses cannot share out) is a ConfigError."""
        if not self.enabled:
            return build_model(model_cfg, attention_cfg)
        try:
            return build_model(model_cfg, self.attention(attention_cfg))
        except ValueError as e:
            raise ConfigError(f"trainer.context_parallel={self.size}: {e}") from None

    # ---- the data

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's shard of x (B, T, ...) along the sequence axis."""
        return take_cp_shard(x, 1, self.rank, self.ring_size, self.ulysses_size, self.layout)

    def shard_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """This rank's shard of a batch of whole sequences: SEQUENCE_KEYS split along dim 1,
        sequence-level labels (B,) kept, an all-ones attention_mask dropped (padding is
        refused), position_ids (B, T / size) int64: the shard's global positions, or with
        document masking its positions inside each document, the table (cu_seqlens, as host
        ints) and max_seqlen kept whole."""
        if not self.enabled:
            return batch
        batch_size, seq_len = batch["input_ids"].shape
        out = {}
        for key, value in batch.items():
            if key == "attention_mask":
                if not bool(value.all()):
                    raise ValueError(SplitSequenceAttention.NO_PADDING)
            elif key == "labels" and value.dim() == 1:  # one label per sequence
                out[key] = value
            elif key in SEQUENCE_KEYS:
                out[key] = self.shard(value)
            elif key == "cu_seqlens":
                out[key] = tuple(int(c) for c in value.tolist())  # host ints: no device sync
            elif key in DOCUMENT_KEYS:
                out[key] = value
            else:
                raise ValueError(
                    f"context parallelism cannot split the batch key {key!r}; it splits "
                    f"{', '.join(SEQUENCE_KEYS)} along the sequence, keeps the document table "
                    f"({', '.join(DOCUMENT_KEYS)}) whole and takes an all-ones attention_mask"
                )
        if "position_ids" not in out:
            positions = cp_shard_positions(seq_len, self.rank, self.ring_size, self.ulysses_size,
                                           layout=self.layout)  # fmt: skip
            out["position_ids"] = positions.expand(batch_size, -1).contiguous()  # (B, T / size)
        return out

    def shard_data(self, data: DataModule) -> DataModule:
        return ShardedSequences(data, self) if self.enabled else data


class ShardedSequences(DataModule):
    """A DataModule built for a data-parallel group, seen by one rank of the group: the same
    batches, as this rank's context-parallel shards. Everything else (the stream position,
    task, vocab_size, loss_bounds, ...) is the wrapped module's."""

    def __init__(self, data: DataModule, cp: ContextParallel):
        self.data, self.cp = data, cp

    def __getattr__(self, name: str):
        if name == "data":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.data, name)

    def train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        return map(self.cp.shard_batch, self.data.train_batches())

    def val_batches(self) -> Iterable[dict[str, torch.Tensor]]:
        return _MappedBatches(self.data.val_batches(), self.cp.shard_batch)

    def loss_bounds(self):
        return self.data.loss_bounds()

    def state_dict(self) -> dict:
        return self.data.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.data.load_state_dict(state)


class _MappedBatches:
    """A re-iterable view of `batches` with fn applied to each (val_batches stays re-iterable)."""

    def __init__(self, batches: Iterable, fn):
        self.batches, self.fn = batches, fn

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return map(self.fn, self.batches)


# ---- set-up ------------------------------------------------------------------------------------


def check_supported(cfg: TrainConfig) -> None:
    """What trainer.context_parallel > 1 cannot run, from the config alone (the model's own
    limits are checked when it is built): a seq_len the mode cannot split evenly, and data
    whose batches are padded."""
    size, layout = cfg.trainer.context_parallel, cfg.trainer.cp_layout
    if size == 1:
        return
    ring, ulysses = context_parallel_sizes(cfg.trainer)
    try:
        check_cp_sequence_length(cfg.seq_len, ring, ulysses, layout, "seq_len")
    except ValueError as e:
        raise ConfigError(f"trainer.context_parallel={size}: {e}") from None
    if LOADERS[cfg.data.loader].pads_sequences:
        raise ConfigError(
            f"trainer.context_parallel={size}: data loader {cfg.data.loader!r} pads short "
            f"sequences, and {SplitSequenceAttention.NO_PADDING}"
        )


def planned_context_parallel(cfg: TrainConfig, world_size: int) -> ContextParallel:
    """The split of a world this process is not part of (a dry run planning for the world its
    config needs, dry_run.py): the sizes, checked as for a real run, and no process groups."""
    t = cfg.trainer
    check_context_parallel(t.context_parallel, world_size)
    check_supported(cfg)
    ring, ulysses = context_parallel_sizes(t)
    return ContextParallel(size=t.context_parallel, layout=t.cp_layout,
                           dp_size=world_size // t.context_parallel, mode=t.context_parallel_mode,
                           ring_size=ring, ulysses_size=ulysses)  # fmt: skip


def setup_context_parallel(cfg: TrainConfig, env: DistEnv) -> ContextParallel:
    """The device mesh and this rank's groups for trainer.context_parallel (checked against
    the world size and the config first): (dp, cp) for ring and ulysses, (dp, cp_ring,
    cp_ulysses) for hybrid, the Ulysses groups innermost (consecutive ranks)."""
    t = cfg.trainer
    size, layout, mode = t.context_parallel, t.cp_layout, t.context_parallel_mode
    check_context_parallel(size, env.world_size)
    check_supported(cfg)
    if size == 1:
        return ContextParallel(layout=layout, dp_rank=env.rank, dp_size=env.world_size, mode=mode)
    from torch.distributed.device_mesh import init_device_mesh

    dp_size = env.world_size // size
    ring, ulysses = context_parallel_sizes(t)
    if mode != "hybrid":
        mesh = init_device_mesh(env.device.type, (dp_size, size), mesh_dim_names=("dp", "cp"))
        mesh["dp", "cp"]._flatten(mesh_dim_name="dp_cp")  # the gradients' mesh (torchtitan's way)
        group = mesh.get_group("cp")
        return ContextParallel(
            size=size, layout=layout, rank=mesh.get_local_rank("cp"),
            dp_rank=mesh.get_local_rank("dp"), dp_size=dp_size, group=group, mesh=mesh,
            mode=mode, ring_size=ring, ulysses_size=ulysses,
            ulysses_group=group if mode == "ulysses" else None,
        )  # fmt: skip
    names = ("dp", "cp_ring", "cp_ulysses")
    mesh = init_device_mesh(env.device.type, (dp_size, ring, ulysses), mesh_dim_names=names)
    mesh["cp_ring", "cp_ulysses"]._flatten(mesh_dim_name="cp")  # each sequence's ranks
    mesh[names]._flatten(mesh_dim_name="dp_cp")
    rank = mesh.get_local_rank("cp_ring") * ulysses + mesh.get_local_rank("cp_ulysses")
    return ContextParallel(
        size=size, layout=layout, rank=rank, dp_rank=mesh.get_local_rank("dp"),
        dp_size=dp_size, group=mesh.get_group("cp"), mesh=mesh, mode=mode, ring_size=ring,
        ulysses_size=ulysses, ring_group=mesh.get_group("cp_ring"),
        ulysses_group=mesh.get_group("cp_ulysses"),
    )  # fmt: skip
