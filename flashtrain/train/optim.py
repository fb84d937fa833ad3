"""AdamW with decoupled weight-decay groups, and the learning-rate schedule.

Weight decay goes on the matrices of the linear layers only: biases, normalisation gains and
(unless optim.decay_embeddings) embedding tables are left alone, as in GPT-2/BERT practice.
Tied weights appear once (nn.Module.named_parameters deduplicates them).
"""

from __future__ import annotations

import dataclasses
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


# What a resume does with the other optimizer settings (docs/training.md, "Resume rules"). The
# keys that decide which parameters form each AdamW group, or the optimizer itself, are refused:
# the checkpoint's optimizer state is laid out in its groups (and the schedule's state has one
# entry a group). Every other setting is a value each group holds, taken from this run's config.
GROUPING_KEYS = ("name", "decay_norm_and_bias", "decay_embeddings")
# A group's entries that are not its settings: its parameters, and the lr the schedule owns
# (restored, or changed only with trainer.allow_schedule_change: run_state._restore_schedule).
_NOT_SETTINGS = frozenset({"params", "lr", "initial_lr"})
# Settings that change how AdamW computes, not what: put back without a line in the log.
_ROUTE_SETTINGS = frozenset({"foreach", "fused", "capturable", "differentiable"})
_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(OptimConfig))


def describe_regrouping(saved: dict, optim_cfg: OptimConfig) -> list[tuple[str, str, str]]:
    """(config key, saved value, this run's value) of each grouping key (GROUPING_KEYS) whose
    value differs from `saved`, the optim section of the checkpoint's config.yaml (a key it
    lacks is not compared), the values spelled as overrides."""
    return [
        (f"optim.{key}", _plain(saved[key]), _plain(getattr(optim_cfg, key)))
        for key in GROUPING_KEYS
        if key in saved and saved[key] != getattr(optim_cfg, key)
    ]


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's settings (weight_decay, betas, eps, ...) but its lr: this run's, as
    built from its config, to put back once a resume has loaded the saved ones."""
    return [
        {key: value for key, value in group.items() if key not in _NOT_SETTINGS}
        for group in optimizer.param_groups
    ]


def apply_group_settings(optimizer: torch.optim.Optimizer, settings: list[dict]) -> list[str]:
    """Give each param group this run's `settings` (group_settings before the load: loading an
    optimizer state_dict overwrites them with the saved ones). Returns one phrase per setting
    that changed, named by its config key: "optim.weight_decay: 0.1 -> 0.0"."""
    changes = []
    for group, mine in zip(optimizer.param_groups, settings, strict=True):
        for key, value in mine.items():
            was = group.get(key)
            group[key] = value
            if key in _ROUTE_SETTINGS or _same(was, value):
                continue
            name = f"optim.{key}" if key in _CONFIG_KEYS else f"AdamW's {key}"
            phrase = f"{name}: {_plain(was)} -> {_plain(value)}"
            if phrase not in changes:  # betas and eps are each group's: one line for all
                changes.append(phrase)
    _place_steps(optimizer)
    return changes


def _place_steps(optimizer: torch.optim.Optimizer) -> None:
    """Each parameter's step count where its group's (possibly changed) settings need it, as
    torch places it on a load: on the parameter's device in float32 for fused or capturable
    AdamW (its kernels read it there), on the host otherwise (the loaded one follows the saved
    settings, so a CPU run's checkpoint resumed with fused AdamW on a GPU would fail)."""
    for group in optimizer.param_groups:
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            step = state.get("step")
            if torch.is_tensor(step):
                state["step"] = (
                    step.to(device=p.device, dtype=torch.float32) if on_device else step.cpu()
                )


def _same(a: Any, b: Any) -> bool:
    """Equal, a tuple and a list alike (betas come back from a checkpoint as either)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def _plain(value: Any) -> str:
    """A value as an override spells it: true/false, [0.9, 0.95]."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    return str(value)
