"""AdamW with decoupled weight-decay groups, and the learning-rate schedule.

Weight decay goes on the matrices of the linear layers only: biases, normalisation gains and
(unless optim.decay_embeddings) embedding tables are left alone, as in GPT-2/BERT practice.
Tied weights appear once (nn.Module.named_parameters deduplicates them).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from flashtrain.train.config import OptimConfig

_NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.RMSNorm)


def param_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    decay_norm_and_bias: bool = False,
    decay_embeddings: bool = False,
) -> list[dict]:
    """Two AdamW groups: [{"params": decayed, "weight_decay": wd}, {"params": rest, wd 0}].

    Each group also carries "names" (the parameters' qualified names), for logs and tests.
    """
    no_decay_ids: set[int] = set()
    for module in model.modules():
        is_norm = isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()
        is_embedding = isinstance(module, nn.Embedding)
        for p in module.parameters(recurse=False):
            if (is_norm and not decay_norm_and_bias) or (is_embedding and not decay_embeddings):
                no_decay_ids.add(id(p))
    decay, decay_names, rest, rest_names = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = id(p) in no_decay_ids or (p.ndim < 2 and not decay_norm_and_bias)
        if skip:
            rest.append(p)
            rest_names.append(name)
        else:
            decay.append(p)
            decay_names.append(name)
    return [
        {"params": decay, "weight_decay": weight_decay, "names": decay_names},
        {"params": rest, "weight_decay": 0.0, "names": rest_names},
    ]


def build_optimizer(model: nn.Module, optim_cfg: OptimConfig, device: torch.device):
    groups = param_groups(
        model,
        float(optim_cfg.weight_decay),
        decay_norm_and_bias=bool(optim_cfg.decay_norm_and_bias),
        decay_embeddings=bool(optim_cfg.decay_embeddings),
    )
    for g in groups:
        g.pop("names")
    groups = [g for g in groups if g["params"]]
    fused = optim_cfg.fused
    if fused is None:
        fused = device.type == "cuda"
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(
        groups,
        lr=float(optim_cfg.lr),
        betas=(float(optim_cfg.betas[0]), float(optim_cfg.betas[1])),
        eps=float(optim_cfg.eps),
        **kwargs,
    )


def lr_factor(
    step: int,
    *,
    warmup_steps: int,
    decay_steps: int,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.1,
) -> float:
    """Multiplier of the base lr for the update made at optimizer step `step` (0-based).

    Linear warmup from 1/warmup_steps to 1 over `warmup_steps` updates, then `schedule` from 1
    down to `min_lr_ratio` at `decay_steps`, flat afterwards.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, decay_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if schedule == "linear":
        shape = 1.0 - progress
    elif schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown schedule {schedule!r}; use cosine, linear or constant")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def schedule_settings(optim_cfg: OptimConfig, max_steps: int) -> dict[str, Any]:
    """Everything that decides the learning rate at each step (saved with every checkpoint, so
    a resumed run can tell when it would follow a different schedule)."""
    decay_steps = optim_cfg.decay_steps if optim_cfg.decay_steps is not None else max_steps
    return {
        "lr": float(optim_cfg.lr),
        "schedule": optim_cfg.schedule,
        "warmup_steps": int(optim_cfg.warmup_steps),
        "decay_steps": int(decay_steps),
        "min_lr_ratio": float(optim_cfg.min_lr_ratio),
    }


def build_scheduler(optimizer, optim_cfg: OptimConfig, max_steps: int):
    kw = schedule_settings(optim_cfg, max_steps)
    kw.pop("lr")  # the optimizer's param groups hold it
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, **kw))


def describe_schedule_changes(saved: dict, current: dict, decay_steps_set: bool) -> list[str]:
    """One phrase per setting that differs, named by the config key a user changes:
    decay_steps is trainer.max_steps's when optim.decay_steps is null."""
    changes = []
    for key in current:
        if key in saved and saved[key] != current[key]:
            name = f"optim.{key}"
            if key == "decay_steps" and not decay_steps_set:
                name = "trainer.max_steps (optim.decay_steps is null, so the decay ends there)"
            changes.append(f"{name}: {saved[key]} -> {current[key]}")
    return changes


def follow_schedule_from(scheduler, step: int, lr: float) -> None:
    """Make the scheduler's (new) schedule hold from `step` on, as if the run had followed it
    from the start: base lr `lr`, and the lr of the next update = lr * the new factor at `step`.
    (A loaded scheduler otherwise keeps the saved base lr and the optimizer the saved lr.)"""
    optimizer = scheduler.optimizer
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    scheduler.last_epoch = step
    lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, value in zip(optimizer.param_groups, lrs):
        group["initial_lr"] = lr
        group["lr"] = value
    scheduler._last_lr = lrs  # what get_last_lr() reports, as LambdaLR.step() would set it
