"""The trainer's config schema, its validation, and the batch-size arithmetic.

Hydra composes configs/train.yaml; `validate_config` then merges the result into the typed schema
below, so an unknown key (`trainer.max_step=10`) or a wrong type (`trainer.max_steps=ten`) fails at
start with OmegaConf's own message instead of deep inside the run. The model, data and attention
groups belong to their factories (flashtrain.models / flashtrain.data), which check their own keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what is wrong and how to fix it."""


class Strategy(str, Enum):
    auto = "auto"  # ddp when launched with more than one process, else single
    single = "single"
    ddp = "ddp"
    fsdp = "fsdp"


class Precision(str, Enum):
    auto = "auto"  # bf16 autocast on CUDA, fp32 on CPU
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"  # autocast + dynamic loss scaling


class OnNonFinite(str, Enum):
    stop = "stop"  # stop the run, naming the step; the last good checkpoint stays
    skip = "skip"  # drop the update and go on (up to trainer.max_skipped_steps in a row)


class ProgressMode(str, Enum):
    auto = "auto"  # a tqdm bar on a terminal, plain lines otherwise
    bar = "bar"
    lines = "lines"
    none = "none"


class Schedule(str, Enum):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"


@dataclass
class DDPConfig:
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = True
    static_graph: bool = False


@dataclass
class FSDPConfig:
    reshard_after_forward: bool = True
    param_dtype: str = "auto"  # auto (= the trainer's precision) | fp32 | bf16 | fp16
    reduce_dtype: str = "fp32"


@dataclass
class TrainerConfig:
    max_steps: int = 150  # optimizer steps; 0 builds everything, prints the summary and exits
    device: str = "auto"  # auto | cpu | cuda | cuda:<i>
    strategy: Strategy = Strategy.auto
    precision: Precision = Precision.auto
    compile: bool = False  # torch.compile each transformer block (model.blocks)
    grad_clip: float | None = 1.0  # max global grad norm; null or 0 = no clipping
    log_interval: int = 10
    eval_interval: int = 50  # 0 = only at the end
    eval_batches: int | None = 8  # cap on validation batches per eval (null = all)
    eval_at_end: bool = True
    ckpt_interval: int = 50  # 0 = only at the end
    ckpt_at_end: bool = True
    keep_last: int = 3  # checkpoints kept on disk (0 = keep all)
    ckpt_dir: str | None = None  # null = <run dir>/checkpoints
    resume: str | None = None  # null | auto | <checkpoint dir or checkpoints root>
    on_nonfinite: OnNonFinite = OnNonFinite.stop
    max_skipped_steps: int = 10
    progress: ProgressMode = ProgressMode.auto
    metrics_file: str | None = "metrics.jsonl"  # in the run dir, rank 0; null = none
    peak_flops: float | None = None  # device peak FLOP/s for MFU; null = look it up
    allow_slow_cpu: bool = False
    cpu_step_time_limit_s: float = 120.0  # refuse CPU runs estimated slower per step than this
    dist_timeout_s: int = 1800
    deterministic: bool = False  # torch.use_deterministic_algorithms(True)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_norm_and_bias: bool = False  # biases and norm gains get weight decay too
    decay_embeddings: bool = False  # token/position embeddings get weight decay too
    fused: bool | None = None  # null = fused AdamW on CUDA, foreach elsewhere
    schedule: Schedule = Schedule.cosine
    warmup_steps: int = 15
    decay_steps: int | None = None  # null = trainer.max_steps
    min_lr_ratio: float = 0.1  # final lr = lr * min_lr_ratio


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "flashtrain"
    entity: str | None = None
    mode: str = "offline"  # online | offline | disabled
    run_name: str | None = None  # null = the run's name
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str | None = None
    dir: str | None = None  # null = the run dir


@dataclass
class TrainConfig:
    name: str | None = None  # run name (wandb, summary); null = derived from model/data/seq_len
    seed: int = 1234
    seq_len: int = 256
    global_batch_size: int | None = None  # sequences per optimizer step, all ranks together
    global_batch_tokens: int | None = None  # alternatively tokens per step (a multiple of seq_len)
    micro_batch_size: int = 8  # sequences per device per forward/backward
    model: Any = None
    attention: Any = None
    data: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


_ENUMS = (Strategy, Precision, OnNonFinite, ProgressMode, Schedule)


def validate_config(cfg: DictConfig) -> DictConfig:
    """Type-check `cfg` against the schema and return it resolved, with enums as plain strings.

    Raises omegaconf's ValidationError / ConfigKeyError (unknown key, wrong type, bad choice) or
    ConfigError (values that type-check but cannot work together).
    """
    if "hydra" in cfg:  # composed with return_hydra_config=True
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
    plain = OmegaConf.to_container(merged, resolve=True, enum_to_str=True)
    out = OmegaConf.create(plain)
    _check_values(out)
    OmegaConf.set_struct(out, True)
    return out


def _check_values(cfg: DictConfig) -> None:
    t = cfg.trainer
    problems = []
    if cfg.seq_len <= 0:
        problems.append(f"seq_len must be positive, got {cfg.seq_len}")
    if cfg.micro_batch_size <= 0:
        problems.append(f"micro_batch_size must be positive, got {cfg.micro_batch_size}")
    if t.max_steps < 0:
        problems.append(f"trainer.max_steps must be >= 0, got {t.max_steps}")
    for key in ("log_interval",):
        if t[key] <= 0:
            problems.append(f"trainer.{key} must be positive, got {t[key]}")
    for key in ("eval_interval", "ckpt_interval", "keep_last"):
        if t[key] < 0:
            problems.append(f"trainer.{key} must be >= 0, got {t[key]}")
    if cfg.logger.name not in ("wandb", "none"):
        problems.append(f"logger.name must be wandb or none, got {cfg.logger.name!r}")
    if cfg.logger.name == "wandb" and cfg.logger.mode not in ("online", "offline", "disabled"):
        problems.append(f"logger.mode must be online, offline or disabled, got {cfg.logger.mode!r}")
    if cfg.optim.name != "adamw":
        problems.append(f"optim.name: only adamw is implemented, got {cfg.optim.name!r}")
    if len(cfg.optim.betas) != 2:
        problems.append(f"optim.betas must have two values, got {list(cfg.optim.betas)}")
    if not 0.0 <= cfg.optim.min_lr_ratio <= 1.0:
        problems.append(f"optim.min_lr_ratio must be in [0, 1], got {cfg.optim.min_lr_ratio}")
    if cfg.optim.warmup_steps < 0:
        problems.append(f"optim.warmup_steps must be >= 0, got {cfg.optim.warmup_steps}")
    for key in ("param_dtype", "reduce_dtype"):
        if t.fsdp[key] not in ("auto", "fp32", "bf16", "fp16"):
            problems.append(f"trainer.fsdp.{key} must be auto|fp32|bf16|fp16, got {t.fsdp[key]!r}")
    model_len = _select(cfg.model, "max_seq_len")
    if isinstance(model_len, int) and model_len < cfg.seq_len:
        problems.append(
            f"seq_len={cfg.seq_len} is longer than the model takes (model.max_seq_len="
            f"{model_len}); lower seq_len or raise model.max_seq_len"
        )
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _select(node: Any, key: str) -> Any:
    if isinstance(node, DictConfig):
        return node.get(key)
    return None


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's global batch is split over ranks and micro-batches."""

    seq_len: int
    micro_batch_size: int
    world_size: int
    grad_accum: int

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.world_size * self.grad_accum

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


def batch_plan(cfg: DictConfig, world_size: int) -> BatchPlan:
    """Gradient accumulation steps from the global batch (sequences or tokens) and the world size."""
    seq_len, mbs = int(cfg.seq_len), int(cfg.micro_batch_size)
    gbs = cfg.get("global_batch_size")
    tokens = cfg.get("global_batch_tokens")
    if tokens is not None:
        if tokens % seq_len:
            raise ConfigError(
                f"global_batch_tokens={tokens} is not a multiple of seq_len={seq_len}; "
                f"use e.g. global_batch_tokens={max(1, round(tokens / seq_len)) * seq_len}"
            )
        from_tokens = tokens // seq_len
        if gbs is not None and gbs != from_tokens:
            raise ConfigError(
                f"global_batch_size={gbs} and global_batch_tokens={tokens} disagree "
                f"(seq_len={seq_len} gives {from_tokens} sequences); set only one of them"
            )
        gbs = from_tokens
    if gbs is None:
        gbs = mbs * world_size
    per_pass = mbs * world_size
    if gbs <= 0 or gbs % per_pass:
        lower = max(per_pass, gbs // per_pass * per_pass)
        raise ConfigError(
            f"the global batch of {gbs} sequences is not a multiple of micro_batch_size={mbs} x "
            f"world_size={world_size} = {per_pass}; use global_batch_size={lower} or change "
            f"micro_batch_size"
        )
    return BatchPlan(seq_len, mbs, world_size, gbs // per_pass)


def on_rank0(value: Any, other: Any = None) -> Any:
    """OmegaConf resolver `${ft_rank0:a,b}`: a in the launching process / rank 0, b elsewhere.

    configs/train.yaml uses it so that under torchrun only rank 0 makes Hydra's run directory,
    its .hydra/ files and its log file; the other ranks learn the directory from rank 0.
    """
    return value if os.environ.get("RANK", "0") == "0" else other


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("ft_rank0"):
        OmegaConf.register_new_resolver("ft_rank0", on_rank0)


register_resolvers()
