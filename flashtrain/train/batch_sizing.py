"""micro_batch_size=auto: the largest micro-batch the memory plan fits in the GPU.

The plan is the dry run's per-GPU estimate (dry_run.memory_for: weights, gradients and AdamW
states, plus one micro-batch's activations, arithmetic from the shapes). A candidate fits when
ESTIMATE_FACTOR times its estimate is within (1 - MARGIN) of the device's free memory. The
candidates are the divisors of a rank's share of the global batch (so that gradient accumulation
cuts the share evenly, as batch_plan does for a configured micro_batch_size); the estimate grows
with the micro-batch, so the largest fitting one is found by bisection. Every rank takes the
smallest of the ranks' choices (a GPU shared with another job has less free memory).

A GPU run that is not sized (a CPU run) uses config.AUTO_MICRO_BATCH_CPU. A dry run on a CPU
sizes for ASSUMED_GPU_MEMORY, the card the dry run's step-time line assumes, and says so.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from flashtrain.collectives import gather_objects
from flashtrain.train.config import AUTO_MICRO_BATCH_CPU, batch_plan
from flashtrain.train.memory_estimate import GIB, gib

# The estimate leaves out the allocator's slack and compile's buffers; the largest shortfall
# measured: Llama-125M at 16K, eager, on an H200: 10.42 GiB allocated for 8.9 GiB estimated
# (benchmarks/results/gpu-suite-2026-11-27-nvidia-h200), x1.17; 1.25 covers it with room.
ESTIMATE_FACTOR = 1.25
# Device memory left out of the plan: the CUDA context, cuBLAS / cuDNN workspaces, NCCL buffers.
MARGIN = 0.10
# A rank's share when the config sets no global batch (global_batch_size=null and no
# global_batch_tokens): one micro-batch per rank per step, at most this many sequences.
UNBOUNDED_SHARE = 1024
# What a dry run without a GPU sizes for: dry_run.ASSUMED_GPU's memory (an H100 SXM's 80 GB).
ASSUMED_GPU_MEMORY = 80e9


@dataclass(frozen=True)
class DeviceMemory:
    free: float  # bytes the run may use on one GPU
    what: str  # where the figure comes from, for the summary


@dataclass(frozen=True)
class AutoMicroBatch:
    """micro_batch_size=auto's choice and why."""

    micro_batch_size: int
    share: int  # a rank's sequences per step: the cap
    needs: float  # the chosen micro-batch's estimated bytes per GPU (before ESTIMATE_FACTOR)
    refused: tuple[int, float] | None  # the next larger candidate and its estimate, if any
    device: DeviceMemory

    @property
    def fits(self) -> bool:
        return self.needs * ESTIMATE_FACTOR <= self.device.free * (1 - MARGIN)

    def describe(self) -> str:
        budget = f"{1 - MARGIN:.0%} of {self.device.what}"
        chosen = f"micro_batch_size=auto: {self.micro_batch_size}"
        if not self.fits:
            return (
                f"{chosen} (even one sequence's estimate, {gib(self.needs)} x {ESTIMATE_FACTOR}, "
                f"is over {budget}: it may not fit; see model.recompute=all, "
                "trainer.strategy=fsdp or a shorter seq_len)"
            )
        why = f"estimate {gib(self.needs)} x {ESTIMATE_FACTOR} within {budget}"
        if self.refused is None:
            return f"{chosen} (a rank's whole share of the global batch; {why})"
        size, needs = self.refused
        return f"{chosen} (the largest that fits: {why}; {size} would need {gib(needs)})"


def choose_micro_batch(
    share: int, needs: Callable[[int], float], device: DeviceMemory
) -> AutoMicroBatch:
    """The largest divisor of `share` whose estimate `needs(micro)` (bytes, growing with micro)
    fits `device`; 1 when none does (the choice says it may not fit)."""
    budget = device.free * (1 - MARGIN) / ESTIMATE_FACTOR
    candidates = [d for d in range(1, share + 1) if share % d == 0]
    estimates: dict[int, float] = {}  # index -> bytes, each plan estimated once

    def estimate(i: int) -> float:
        if i not in estimates:
            estimates[i] = needs(candidates[i])
        return estimates[i]

    # the first candidate that does not fit (the estimates grow with the micro-batch)
    first_too_big = bisect.bisect_left(
        range(len(candidates)), True, key=lambda i: estimate(i) > budget
    )
    chosen = max(first_too_big - 1, 0)
    refused = None
    if chosen < first_too_big < len(candidates):
        refused = (candidates[first_too_big], estimate(first_too_big))
    return AutoMicroBatch(candidates[chosen], share, estimate(chosen), refused, device)


def cuda_memory(device: torch.device) -> DeviceMemory:
    """The free memory of this rank's GPU, the smallest over the ranks (one choice for all)."""
    free, total = torch.cuda.mem_get_info(device)
    smallest = min(gather_objects(float(free)))
    name = torch.cuda.get_device_name(device)
    return DeviceMemory(smallest, f"{name}'s {gib(smallest)} free (of {gib(total)})")


def assumed_gpu_memory(gpu: str) -> DeviceMemory:
    return DeviceMemory(
        ASSUMED_GPU_MEMORY, f"an {gpu}'s {ASSUMED_GPU_MEMORY / GIB:.1f} GiB (assumed: no GPU here)"
    )


def auto_micro_batch(cfg: Any, world: Any, memory_of: Callable, device: DeviceMemory):
    """The world with its batch plan at the auto micro-batch, and the choice.

    world: dry_run.World; memory_of(plan) -> dry_run's MemoryEstimate of a plan."""
    cp = cfg.trainer.context_parallel
    whole = batch_plan(cfg, world.size, cp, micro_batch_size=UNBOUNDED_SHARE)
    share = whole.micro_batch_size * whole.grad_accum  # a rank's sequences per step

    def needs(micro: int) -> float:
        return memory_of(batch_plan(cfg, world.size, cp, micro_batch_size=micro)).total

    choice = choose_micro_batch(share, needs, device)
    plan = batch_plan(cfg, world.size, cp, micro_batch_size=choice.micro_batch_size)
    return world._replace(plan=plan), choice


def size_micro_batch(cfg: Any, world: Any, model: Any, device: torch.device, dry_run: bool):
    """(world, choice): micro_batch_size=auto sized for this rank's GPU, or for the planned GPUs
    of a dry run without one (ASSUMED_GPU_MEMORY); (world, None) when nothing is sized (a number
    configured, or a CPU run: AUTO_MICRO_BATCH_CPU)."""
    from flashtrain.train.dry_run import ASSUMED_GPU, memory_for

    if cfg.micro_batch_size != "auto" or (device.type != "cuda" and not dry_run):
        return world, None
    memory = cuda_memory(device) if device.type == "cuda" else assumed_gpu_memory(ASSUMED_GPU)

    def memory_of(plan):
        return memory_for(model, cfg.trainer, plan, world.strategy, world.cp)

    return auto_micro_batch(cfg, world, memory_of, memory)


def cpu_auto_line() -> str:
    return (
        f"micro_batch_size=auto: {AUTO_MICRO_BATCH_CPU} (a CPU run; on a GPU auto is the largest "
        "micro-batch the memory plan fits)"
    )
