"""What a dry run (trainer.max_steps=0) plans for: the world its config needs, and the memory per GPU.

A preset for 8 GPUs with trainer.context_parallel=8 cannot run on one process, but its dry run
can describe it: the world is taken as the smallest multiple of context_parallel at least as
large as this one (saying so), and the batch plan, the context-parallel split and the memory
estimate are for that world. A real run on a world context_parallel does not divide is refused
(config.check_context_parallel). plan_world gives the trainer either world (with its strategy,
batch plan and context-parallel split); dry_run_plan the estimate and the summary's lines.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from flashtrain.train.activation_memory import ActivationPlan, layer_shapes
from flashtrain.train.config import BatchPlan, batch_plan
from flashtrain.train.context_parallel import (
    ContextParallel,
    planned_context_parallel,
    setup_context_parallel,
)
from flashtrain.train.distributed import (
    DistEnv,
    check_shard_group,
    is_sharded,
    resolve_strategy,
    state_shards,
)
from flashtrain.train.memory_estimate import (
    BuildMemory,
    MemoryEstimate,
    estimate_build_memory,
    estimate_memory,
    gib,
)
from flashtrain.train.metrics import lookup_gpu_peak
from flashtrain.utils import format_count

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# What the step-time prediction assumes when the dry run has no GPU to ask: the card the
# presets are sized for, at a utilisation a tuned long-context run reaches (the GPU suite
# measures the real one: docs/benchmarks.md).
ASSUMED_GPU = "H100"
ASSUMED_MFU = 0.40


def planned_world(world_size: int, context_parallel: int) -> int:
    """The world a dry run plans for: this one when context_parallel divides it, else the
    smallest multiple of context_parallel above it (an invalid context_parallel is left for
    check_context_parallel to refuse)."""
    if context_parallel < 1 or world_size % context_parallel == 0:
        return world_size
    return -(-world_size // context_parallel) * context_parallel


class World(NamedTuple):
    """The processes a run is planned for: this launch's, or the world a dry run plans for."""

    size: int
    strategy: str  # trainer.strategy resolved for `size`: single, ddp, fsdp or hsdp
    plan: BatchPlan
    cp: ContextParallel  # this rank's groups, or (a planned world) the sizes alone


def plan_world(cfg: Any, env: DistEnv, dry_run: bool) -> World:
    """This launch's world, context parallelism set up on it; for a dry run whose
    trainer.context_parallel does not divide it, the planned world (planned_world), which this
    process is not part of. Each check refuses as for a real run of that world (hsdp's shard
    group size among them)."""
    t = cfg.trainer
    size = planned_world(env.world_size, t.context_parallel) if dry_run else env.world_size
    strategy = resolve_strategy(t.strategy, size)
    plan = batch_plan(cfg, size, t.context_parallel)
    check_shard_group(t, strategy, size)  # refused here, before the model is built
    if size == env.world_size:
        return World(size, strategy, plan, setup_context_parallel(cfg, env))
    return World(size, strategy, plan, planned_context_parallel(cfg, size))


def assumed_world_line(world_size: int, planned: int, context_parallel: int) -> str | None:
    if planned == world_size:
        return None
    return (
        f"dry run: planned for a world of {planned} processes, not this run's {world_size} "
        f"(trainer.context_parallel={context_parallel} needs a multiple of {context_parallel}; "
        f"a real run here is refused): batch plan and memory below are for {planned}"
    )


def estimate_precision(precision: str) -> str:
    """The precision a GPU run of this config uses (auto: bf16 autocast on CUDA)."""
    return "bf16" if precision == "auto" else precision


def activation_plan(
    model: Any,
    plan: BatchPlan,
    cp: ContextParallel,
    precision: str,
    residual_bytes: int,
) -> ActivationPlan:
    """How a rank of `cp` runs a micro-batch of `plan` with `model`'s recomputation and tiling
    (activation_memory.py), its matmuls in `precision`."""
    cfg = model.config
    return ActivationPlan(
        tokens=plan.micro_batch_size * plan.seq_len // plan.context_parallel,
        batch=plan.micro_batch_size,
        act_bytes=_BYTES[precision],
        residual_bytes=residual_bytes,
        recompute=cfg.recompute,
        recomputed=sum(model.recomputes_block(i) for i in range(cfg.n_layer)),
        tile_tokens=getattr(cfg, "tile_tokens", 0),
        mode=cp.mode if cp.enabled else "none",
        ring_size=cp.ring_size,
        ulysses_size=cp.ulysses_size,
        dropout_masks=cfg.dropout > 0,
    )


def memory_for(
    model: Any, trainer_cfg: Any, plan: BatchPlan, strategy: str, cp: ContextParallel
) -> MemoryEstimate:
    """The per-GPU memory estimate (memory_estimate.py) of `model` (built on the meta device is
    enough) trained with this plan, strategy, context-parallel split and trainer.precision
    (auto: a GPU's bf16)."""
    precision = estimate_precision(trainer_cfg.precision)
    residual = 4  # the residual stream in the weights' dtype: fp32 under autocast
    if is_sharded(strategy):
        param = trainer_cfg.fsdp.param_dtype
        residual = _BYTES[precision if param == "auto" else param]
    gathered = 0.0
    if is_sharded(strategy):  # the block in hand and the one prefetched, and its fp32 gradients
        block = sum(p.numel() for p in model.blocks[0].parameters())
        gathered = block * (2 * residual + 4)
    return estimate_memory(
        params=model.num_parameters(),
        shapes=layer_shapes(model),
        plan=activation_plan(model, plan, cp, precision, residual),
        state_shards=state_shards(strategy, trainer_cfg, plan.world_size),
        precision=precision,
        gathered=gathered,
    )


def dry_run_plan(
    model: Any,
    world: World,
    launched: int,
    trainer_cfg: Any,
    flops_per_token: float,
    gpu_name: str | None,
) -> tuple[MemoryEstimate, list[str]]:
    """A dry run's memory estimate of `model` in `world`, and the summary's lines for it: the
    planned world first when it is not the `launched` one, the predicted GPU step time last.
    gpu_name: this process's GPU, or None (the prediction then assumes ASSUMED_GPU)."""
    memory = memory_for(model, trainer_cfg, world.plan, world.strategy, world.cp)
    assumed = assumed_world_line(launched, world.size, trainer_cfg.context_parallel)
    shards = state_shards(world.strategy, trainer_cfg, world.plan.world_size)
    lines = memory_lines(memory, model, world.plan, world.strategy, shards)
    lines.append(build_memory_line(build_memory_for(model, world.strategy, shards)))
    precision = estimate_precision(trainer_cfg.precision)
    lines.append(gpu_step_line(flops_per_token, world.plan, precision, gpu_name))
    return memory, ([assumed] if assumed else []) + lines


def build_memory_for(model: Any, strategy: str, shards: int) -> BuildMemory:
    """The build-and-load peak per rank (memory_estimate.estimate_build_memory) of `model`;
    shards: the ranks a sharded strategy splits the weights over (state_shards)."""
    return estimate_build_memory(
        params=model.num_parameters(),
        largest_tensor=max(p.numel() for p in model.parameters()),
        strategy=strategy,
        shards=shards,
    )


def build_memory_line(m: BuildMemory) -> str:
    return (
        f"memory per rank while the model is built and given its initial weights (estimate): "
        f"{gib(m.device)} on the GPU, {gib(m.host)} on the host ({m.how})"
    )


def gpu_step_line(
    flops_per_token: float, plan: BatchPlan, precision: str, gpu_name: str | None
) -> str:
    """The step time on the planned GPUs at ASSUMED_MFU of the card's dense peak: a dry run on a
    CPU says what the GPUs would take, not what this CPU would (that line is about this CPU)."""
    name = gpu_name or ASSUMED_GPU
    peak = lookup_gpu_peak(name, precision)
    if peak is None:
        return f"time per step on the planned GPUs: unknown ({name!r} is not in the peak table)"
    seconds = flops_per_token * plan.tokens_per_step / (plan.world_size * peak * ASSUMED_MFU)
    per_gpu = plan.tokens_per_step / plan.world_size / seconds
    return (
        f"time per step on the planned GPUs (prediction, not a measurement: {ASSUMED_MFU:.0%} MFU "
        f"of {plan.world_size} x {name} at {format_count(peak)}FLOP/s {precision}): ~{seconds:.1f} s, "
        f"{format_count(per_gpu)} tokens/s per GPU"
    )


GPUS_PER_NODE = 8  # the node the host-memory line is for (an H100 / H200 node)


def memory_lines(
    m: MemoryEstimate, model: Any, plan: BatchPlan, strategy: str, shards: int
) -> list[str]:
    """The summary's lines for estimate `m` of `model` under this plan and strategy, its states
    split over `shards` ranks (state_shards)."""
    sharded = is_sharded(strategy)
    cfg = model.config
    split = f" / {shards} FSDP2 shards" if sharded else " (not sharded)"
    if strategy == "hsdp":
        split += " (one shard group; replicated across the groups)"
    tokens = plan.micro_batch_size * plan.seq_len // plan.context_parallel
    tiled = getattr(cfg, "tile_tokens", 0)
    how = f"model.recompute={cfg.recompute}" + (f", MLP tiles of {tiled:,} tokens" if tiled else "")
    terms = ", ".join(f"{name} {gib(v)}" for name, v in m.terms.items() if v)
    lines = [
        f"memory per GPU (estimate: {plan.world_size} GPUs, {strategy}, {m.precision}; "
        "arithmetic, not a measurement):",
        f"  weights + gradients + AdamW states: 16 B x {model.num_parameters():,} params"
        f"{split} = {gib(m.states)}",
        f"  activations of a micro-batch ({tokens:,} tokens per GPU): {gib(m.activations)} "
        f"with {how} ({terms}); {gib(m.activations_other)} with {m.other_recompute}",
    ]
    if sharded:
        lines.append(
            f"  FSDP2's gathered blocks (in hand, prefetched, their gradients): {gib(m.gathered)}"
        )
    lines.append(f"  total: ~{gib(m.total)} (not counted: the allocator's slack, the CUDA context)")
    if m.host_per_rank:
        node = min(plan.world_size, GPUS_PER_NODE)
        lines.append(
            f"  host memory for offloaded block inputs: {gib(m.host_per_rank)} per GPU, "
            f"{gib(m.host_per_rank * node)} per node of {node} GPUs (pinned; plus the "
            "processes' own)"
        )
    return lines
