"""Context parallelism in the trainer: each sequence split over `trainer.context_parallel` ranks.

The world is a 2-D device mesh (dp, cp) of world_size / cp data-parallel groups of cp ranks,
cp the inner dimension so that a group is consecutive ranks (one node's NVLink domain when cp is
at most the GPUs per node), as torchtitan lays its mesh out.

- Attention: RingAttention over the group's process group (the model takes it in place of its
  attention config); the model's other layers work per token and need nothing.
- Data: the loader is built for the data-parallel group (rank dp_rank of dp_size), so every rank
  of a group reads the same batches; each keeps its shard of every sequence (take_shard along the
  sequence axis, the labels alike) and the shard's global positions (`position_ids`).
- Gradients: DDP / FSDP2 over the flattened dp x cp mesh (torchtitan shards FSDP over its
  `dp_shard_cp`). A rank's gradient is the part of the loss's gradient that flows through its own
  tokens (the ring's backward returns dK/dV to their owners), so the full gradient is the sum
  over the group; the trainer weights each rank's loss by its share of the step's targets times
  the world size, and DDP's / FSDP's mean over all ranks is then exactly that sum, averaged
  token-weighted over the data-parallel groups. One all-reduce, not one per dimension.
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

from flashtrain.attention.ring_sharding import check_sequence_length, shard_positions, take_shard
from flashtrain.data.module import DataModule
from flashtrain.data.registry import LOADERS
from flashtrain.models import RingAttention, build_model
from flashtrain.train.config import ConfigError, TrainConfig, check_context_parallel
from flashtrain.train.distributed import DistEnv

# Batch keys with a sequence axis (dim 1), split like input_ids.
SEQUENCE_KEYS = ("input_ids", "labels", "token_type_ids")


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in the (dp, cp) grid. size 1: context parallelism is off, every rank
    its own data-parallel group, and every method here leaves things as they are."""

    size: int = 1  # ranks per sequence
    layout: str = "zigzag"  # how a sequence is split (flashtrain.attention.ring_sharding)
    rank: int = 0  # this rank's index in its group
    dp_rank: int = 0  # its group's index
    dp_size: int = 1  # the number of groups
    group: dist.ProcessGroup | None = None  # the ranks sharing this rank's sequences
    mesh: Any = None  # DeviceMesh (dp, cp) with the flattened "dp_cp", or None

    @property
    def enabled(self) -> bool:
        return self.size > 1

    @property
    def gradient_mesh(self):
        """The 1-D mesh of every rank (dp x cp flattened) that DDP / FSDP2 reduce gradients
        over; None without context parallelism (the world, as before)."""
        return self.mesh["dp_cp"] if self.mesh is not None else None

    def describe(self) -> str:
        return (
            f"context parallel: each sequence split over {self.size} ranks (ring attention, "
            f"layout {self.layout}); {self.dp_size} data-parallel group(s)"
        )

    # ---- the model

    def build_model(self, model_cfg: Any, attention_cfg: Any):
        """build_model with ring attention over the group; what the ring cannot run (another
        attention impl, attention dropout, a [CLS] head) is a ConfigError naming it."""
        if not self.enabled:
            return build_model(model_cfg, attention_cfg)
        try:
            ring = RingAttention(attention_cfg, group=self.group, layout=self.layout)
            if self.mesh is None:  # planned for a dry run: no group, no forward; say its size
                ring.rank, ring.size = self.rank, self.size
            return build_model(model_cfg, ring)
        except ValueError as e:
            raise ConfigError(f"trainer.context_parallel={self.size}: {e}") from None

    # ---- the data

    def shard_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's shard of a batch of whole sequences: SEQUENCE_KEYS split along dim 1,
        sequence-level labels (B,) kept, an all-ones attention_mask dropped (padding is
        refused), and position_ids (B, T / size) int64: the shard's global positions."""
        if not self.enabled:
            return batch
        batch_size, seq_len = batch["input_ids"].shape
        out = {}
        for key, value in batch.items():
            if key == "attention_mask":
                if not bool(value.all()):
                    raise ValueError(RingAttention.NO_PADDING)
            elif key == "labels" and value.dim() == 1:  # one label per sequence
                out[key] = value
            elif key in SEQUENCE_KEYS:
                out[key] = take_shard(value, 1, self.rank, self.size, self.layout)
            else:
                raise ValueError(
                    f"context parallelism cannot split the batch key {key!r} (packed documents "
                    f"and document masks are not supported); it splits {', '.join(SEQUENCE_KEYS)} "
                    "along the sequence and takes an all-ones attention_mask"
                )
        positions = shard_positions(seq_len, self.rank, self.size, layout=self.layout)
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
    limits are checked when it is built): a seq_len the layout cannot split evenly, and data
    whose batches are padded."""
    size, layout = cfg.trainer.context_parallel, cfg.trainer.cp_layout
    if size == 1:
        return
    try:
        check_sequence_length(cfg.seq_len, size, layout, "seq_len")
    except ValueError as e:
        raise ConfigError(f"trainer.context_parallel={size}: {e}") from None
    if LOADERS[cfg.data.loader].pads_sequences:
        raise ConfigError(
            f"trainer.context_parallel={size}: data loader {cfg.data.loader!r} pads short "
            f"sequences, and {RingAttention.NO_PADDING}"
        )


def planned_context_parallel(cfg: TrainConfig, world_size: int) -> ContextParallel:
    """The split of a world this process is not part of (a dry run planning for the world its
    config needs, dry_run.py): the sizes, checked as for a real run, and no process groups."""
    size, layout = cfg.trainer.context_parallel, cfg.trainer.cp_layout
    check_context_parallel(size, world_size)
    check_supported(cfg)
    return ContextParallel(size=size, layout=layout, dp_size=world_size // size)


def setup_context_parallel(cfg: TrainConfig, env: DistEnv) -> ContextParallel:
    """The (dp, cp) mesh and this rank's groups for trainer.context_parallel (checked against
    the world size and the config first)."""
    size, layout = cfg.trainer.context_parallel, cfg.trainer.cp_layout
    check_context_parallel(size, env.world_size)
    check_supported(cfg)
    if size == 1:
        return ContextParallel(layout=layout, dp_rank=env.rank, dp_size=env.world_size)
    from torch.distributed.device_mesh import init_device_mesh

    dp_size = env.world_size // size
    mesh = init_device_mesh(env.device.type, (dp_size, size), mesh_dim_names=("dp", "cp"))
    mesh["dp", "cp"]._flatten(mesh_dim_name="dp_cp")  # the gradients' mesh (torchtitan's way)
    return ContextParallel(
        size=size,
        layout=layout,
        rank=mesh.get_local_rank("cp"),
        dp_rank=mesh.get_local_rank("dp"),
        dp_size=dp_size,
        group=mesh.get_group("cp"),
        mesh=mesh,
    )
