"""torch.distributed setup: process group from torchrun's environment, DDP and FSDP2 wrapping.

torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) starts
one process per device; `setup_distributed` joins them with NCCL on GPUs and gloo on CPUs. Without
those variables the run is a single process and nothing is initialised.

Strategies: single, ddp (every rank holds the whole model), fsdp (FSDP2 shards the parameters,
gradients and optimizer states over every rank) and hsdp (FSDP2 on a 2-D mesh: sharded within
shard groups of trainer.shard_group_size consecutive ranks, replicated across the groups, so the
per-layer all-gathers stay inside a group: a node's, by default). fsdp and hsdp are the sharded
ones (`is_sharded`), and write the same checkpoints.
"""

from __future__ import annotations

import datetime
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from flashtrain.train.config import ConfigError

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHARDED_STRATEGIES = ("fsdp", "hsdp")  # FSDP2 shards the parameters: over the world / in groups


def local_ranks() -> int:
    """Processes of this launch on this node (torchrun sets LOCAL_WORLD_SIZE): they share its
    cores and its memory."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()


def resolve_device(spec: str, local_rank: int) -> torch.device:
    spec = str(spec)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda but no CUDA device is visible")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    try:
        device = torch.device(spec)
    except RuntimeError as e:
        raise ConfigError(f"trainer.device={spec!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={spec} but no CUDA device is visible")
    return device


def setup_distributed(
    device_spec: str = "auto", timeout_s: int = 1800, *, need_group: bool = False
) -> DistEnv:
    """Initialise the process group when launched by torchrun; pick this process's device.

    need_group=True makes a one-process group when there is no launcher (FSDP2 needs a mesh).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_spec, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if device.type == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(backend=backend, **kwargs)
    elif need_group and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def teardown_distributed(barrier: bool = False) -> None:
    """Leave the process group; barrier=True first waits for every rank (a clean finish), so
    no rank tears its connections down while a peer still uses them."""
    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def resolve_strategy(strategy: str, world_size: int) -> str:
    if strategy == "auto":
        return "ddp" if world_size > 1 else "single"
    if strategy == "single" and world_size > 1:
        raise ConfigError(
            f"trainer.strategy=single with {world_size} processes; use ddp, fsdp or hsdp under "
            "torchrun"
        )
    return strategy


def is_sharded(strategy: str) -> bool:
    """Whether FSDP2 shards the parameters (fsdp over the world, hsdp within shard groups): the
    model is sharded before its weights are placed, its forward passes are collectives, its
    checkpoints are written through torch.distributed.checkpoint."""
    return strategy in SHARDED_STRATEGIES


def shard_group_size(trainer_cfg: Any, world_size: int) -> int:
    """hsdp's shard group: the consecutive ranks one copy of the parameters is sharded over.
    trainer.shard_group_size, or (null) the ranks per node (local_ranks()), raised to a multiple
    of trainer.context_parallel when a context-parallel group spans nodes (their lcm): a
    context-parallel group lies inside one shard group (torchtitan's dp_shard_cp). ConfigError
    unless it is a multiple of trainer.context_parallel that divides the world size."""
    cp, given = trainer_cfg.context_parallel, trainer_cfg.shard_group_size
    size = given if given is not None else math.lcm(local_ranks(), cp)
    if size >= 1 and world_size % size == 0 and size % cp == 0:
        return size
    if given is None:
        raised = f", raised to a multiple of trainer.context_parallel: {size}"
        value = (
            f"null (the ranks per node, {local_ranks()}{raised if size != local_ranks() else ''})"
        )
    else:
        value = str(given)
    if size < 1:
        why = "is less than 1"
    elif world_size % size:
        why = f"does not divide the world size {world_size}"
    else:
        why = f"is not a multiple of trainer.context_parallel={cp} (a sequence's ranks shard together)"
    allowed = [n for n in range(cp, world_size + 1, cp) if world_size % n == 0]
    raise ConfigError(
        f"trainer.shard_group_size={value} {why}; allowed with world size {world_size} and "
        f"trainer.context_parallel={cp}: {', '.join(map(str, allowed))}"
    )


def check_shard_group(trainer_cfg: Any, strategy: str, world_size: int) -> None:
    """At start: hsdp's shard group size (shard_group_size's checks); the other strategies
    refuse a trainer.shard_group_size rather than ignore it."""
    if strategy == "hsdp":
        shard_group_size(trainer_cfg, world_size)
    elif trainer_cfg.shard_group_size is not None:
        raise ConfigError(
            f"trainer.shard_group_size={trainer_cfg.shard_group_size} applies to "
            f"trainer.strategy=hsdp only (this run's: {strategy}); drop it, or use "
            "trainer.strategy=hsdp"
        )


def state_shards(strategy: str, trainer_cfg: Any, world_size: int) -> int:
    """The ranks one copy of the weights, gradients and optimizer states is split over (for the
    memory estimates): the world under fsdp, a shard group under hsdp, 1 otherwise (whole on
    every rank)."""
    if strategy == "hsdp":
        return shard_group_size(trainer_cfg, world_size)
    return world_size if strategy == "fsdp" else 1


def describe_strategy(strategy: str, trainer_cfg: Any, world_size: int) -> str:
    """The summary's word for the strategy: hsdp says how its ranks are grouped."""
    if strategy != "hsdp":
        return strategy
    group = shard_group_size(trainer_cfg, world_size)
    if group == world_size:
        ranks = f"{world_size} rank{'s' if world_size > 1 else ''}"
        return f"hsdp (one shard group of all {ranks}: the same as fsdp)"
    return (
        f"hsdp (sharded in {world_size // group} groups of {group} consecutive ranks, "
        "replicated across them)"
    )


def resolve_precision(precision: str, device: torch.device, strategy: str) -> str:
    """trainer.precision for this device and strategy (auto: bf16 autocast on CUDA, fp32 on
    CPU); ConfigError for a combination that cannot run."""
    p = precision
    if p == "auto":
        p = "bf16" if device.type == "cuda" else "fp32"
    if p == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("this GPU has no bf16; use trainer.precision=fp16 (or fp32)")
    if p == "fp16" and is_sharded(strategy):
        raise ConfigError(
            "trainer.precision=fp16 is not supported with FSDP2 here; use bf16 (or fp32)"
        )
    if p == "fp16" and device.type != "cuda":
        raise ConfigError("trainer.precision=fp16 needs a CUDA device; use bf16 or fp32")
    return p


def wrap_model(
    model: nn.Module,
    strategy: str,
    env: DistEnv,
    *,
    precision: str,
    trainer_cfg: Any,
    mesh: Any = None,
) -> nn.Module:
    """DDP, or FSDP2 `fully_shard` on every block of model.blocks and then on the root.

    mesh: the 1-D DeviceMesh whose ranks reduce gradients (context parallelism: dp x cp
    flattened, see context_parallel.py); None = every rank of the world. hsdp lays those ranks
    out as a 2-D (replicate, shard) mesh, a shard group being shard_group_size consecutive ranks
    (whole context-parallel groups, as the dp x cp mesh puts cp innermost); FSDP2 then
    reduce-scatters within a group and all-reduces across the groups."""
    if strategy == "single":
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not dist.is_initialized():
            return model  # one process: DDP adds nothing
        d = trainer_cfg.ddp
        return DDP(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            process_group=mesh.get_group() if mesh is not None else None,
            bucket_cap_mb=d.bucket_cap_mb,
            find_unused_parameters=d.find_unused_parameters,
            gradient_as_bucket_view=d.gradient_as_bucket_view,
            static_graph=d.static_graph,
        )
    if is_sharded(strategy):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if not hasattr(model, "blocks"):
            raise ConfigError(f"trainer.strategy={strategy} needs a model with .blocks to shard")
        f = trainer_cfg.fsdp
        param_dtype = precision if f.param_dtype == "auto" else f.param_dtype
        mp = MixedPrecisionPolicy(
            param_dtype=_DTYPES[param_dtype], reduce_dtype=_DTYPES[f.reduce_dtype]
        )
        if mesh is None:  # named: hsdp unflattens it by its dimension
            mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("world",))
        if strategy == "hsdp":
            group = shard_group_size(trainer_cfg, mesh.size())
            names = ("replicate", "shard")
            mesh = mesh._unflatten(0, (mesh.size() // group, group), names)
        blocks = list(model.blocks)
        for i, block in enumerate(blocks):
            # The last block's parameters are needed again at once by backward: keep them.
            reshard = f.reshard_after_forward and i < len(blocks) - 1
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=f.reshard_after_forward)
        return model
    raise ConfigError(f"unknown trainer.strategy {strategy!r}; use auto, single, ddp, fsdp or hsdp")


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under DDP (FSDP2 shards in place, so it is the module itself)."""
    return model.module if hasattr(model, "module") and hasattr(model, "no_sync") else model
