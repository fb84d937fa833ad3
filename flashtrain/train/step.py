"""One optimizer step's device work: the micro-batches' forward and backward, the step's one
all-reduce, the gradient clip and the one device-to-host copy (trainer.py takes the update).

Each micro-batch's loss is weighted by its share of the step's targets over all ranks and
micro-batches, so the update is the exact token-weighted mean gradient of the global batch.
Nothing here waits for the device but `host_values`, once per step: target counts come from the
host (the prefetcher), losses, hits and the stop vote stay on the device until that copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashtrain.collectives import all_reduce_sum
from flashtrain.train.distributed import DistEnv, is_sharded
from flashtrain.train.prefetch import StepBatches, to_device


def host_values(values: torch.Tensor) -> list[float]:
    """The one device-to-host copy of a training step (everything the host needs from it).
    Nothing else in a step waits for the device; tests count the calls of this function."""
    return values.tolist()


def autocast(precision: str, strategy: str, device: torch.device):
    """bf16 / fp16 autocast, except under FSDP2 (its mixed-precision policy casts instead)."""
    if precision in ("bf16", "fp16") and not is_sharded(strategy):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device.type, dtype=dtype)
    return contextlib.nullcontext()


def gradient_sync(model: torch.nn.Module, strategy: str, sync: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of a step."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if is_sharded(strategy):
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


@dataclass(frozen=True)
class StepValues:
    """What the host learns from a step, in its one copy."""

    loss: float  # the token-weighted mean loss over the global batch
    grad_norm: float  # before clipping
    correct: float  # hits over the global batch (models that report them)
    has_correct: bool
    stop_votes: float  # ranks asked to stop (SIGTERM)
    targets: float  # the global batch's targets


def forward_backward(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step_input: StepBatches,
    env: DistEnv,
    *,
    precision: str,
    strategy: str,
    scaler: torch.amp.GradScaler | None,
    stop_requested: Callable[[], bool],
    grad_clip: float | None,
) -> StepValues:
    """Accumulate the step's gradients over its micro-batches, clip them, and read the step's
    values in one copy. The caller steps (or skips) the optimizer.
    stop_requested(): whether this rank was asked to stop (its vote in the step's all-reduce)."""
    counts = step_input.targets
    if env.world_size > 1:  # the step's targets over all ranks: a device tensor, no wait
        local = torch.tensor([float(sum(counts))], dtype=torch.float64)
        global_targets = all_reduce_sum(local.to(env.device, non_blocking=True))[0]
    else:
        global_targets = torch.tensor(float(sum(counts)), dtype=torch.float64)
        global_targets = global_targets.to(env.device, non_blocking=True)
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
    correct_sum = torch.zeros((), dtype=torch.float64, device=env.device)
    has_correct = False
    for i, batch in enumerate(step_input.batches):
        batch = to_device(batch, env.device)
        with gradient_sync(model, strategy, i == len(step_input.batches) - 1):
            with autocast(precision, strategy, env.device):
                out = model(**batch)
            n = counts[i]
            if n > 0:  # weight: this micro-batch's share of the global step's targets
                weight = (n * env.world_size / global_targets).float()
                loss = out.loss.float() * weight
                loss_sum += out.loss.detach().double() * n
            else:  # keep every rank's backward in step (DDP/FSDP collectives)
                loss = torch.nan_to_num(out.loss.float()) * 0.0
            if out.correct is not None:
                has_correct = True
                correct_sum += out.correct.detach().double()
            (scaler.scale(loss) if scaler is not None else loss).backward()
    # One all-reduce for the step's loss, accuracy and the ranks' stop requests (SIGTERM, asked
    # after the micro-batches: a signal during them stops after this step)
    stop_vote = torch.tensor(float(stop_requested()), dtype=torch.float64)
    stop_vote = stop_vote.to(env.device, non_blocking=True)
    stats = all_reduce_sum(torch.stack([loss_sum, correct_sum, stop_vote]))
    mean_loss = stats[0] / global_targets.clamp(min=1.0)
    if scaler is not None:
        scaler.unscale_(optimizer)
    max_norm = float(grad_clip) if grad_clip else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    # The one device-to-host copy of the step: everything the host needs.
    loss_value, norm_value, correct, stop_votes, targets = host_values(
        torch.stack([mean_loss, grad_norm.double().to(env.device), *stats[1:], global_targets])
    )
    return StepValues(loss_value, norm_value, correct, has_correct, stop_votes, targets)
