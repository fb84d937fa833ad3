"""The run's typed config: the trainer's, optimizer's and logger's dataclasses, the root
TrainConfig holding every group, and the batch-size arithmetic.

Hydra composes configs/train.yaml on these schemas (config_store.py registers them), so a typo
in a YAML file or an override fails while composing; `validate_config` then makes the result a
TrainConfig of dataclasses (model, attention and data through their packages' own configs), which
fails on anything left, naming the key and the allowed ones, and checks the values.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from flashtrain.attention.ring_sharding import LAYOUTS
from flashtrain.data.config import DataConfig
from flashtrain.data.registry import DATA, data_config
from flashtrain.models import MODEL_CONFIGS, TransformerConfig, model_config
from flashtrain.models.attention_layers import AttentionConfig, attention_config
from flashtrain.train.tokenizer_default import tokenizer_from_init, vocabulary_from_tokenizer
from flashtrain.typed_config import ConfigError, check_choice, to_dataclass

CP_MODES = ("ring", "ulysses", "hybrid")  # trainer.context_parallel_mode
STRATEGIES = ("auto", "single", "ddp", "fsdp", "hsdp")  # auto: ddp under torchrun, else single
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # auto: bf16 autocast on CUDA, fp32 on CPU
DTYPES = ("auto", "fp32", "bf16", "fp16")


def _at_least(cfg: Any, minimum: int, section: str, *keys: str) -> None:
    for key in keys:
        if getattr(cfg, key) < minimum:
            name = f"{section}.{key}" if section else key
            raise ValueError(f"{name} must be >= {minimum}, got {getattr(cfg, key)}")


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

    def __post_init__(self):
        check_choice(self.param_dtype, DTYPES, "trainer.fsdp.param_dtype")
        check_choice(self.reduce_dtype, DTYPES[1:], "trainer.fsdp.reduce_dtype")


@dataclass
class TrainerConfig:
    max_steps: int = 150  # optimizer steps; 0 builds everything, prints the summary and exits
    device: str = "auto"  # auto | cpu | cuda | cuda:<i>   (torchrun: cuda:<LOCAL_RANK>)
    # auto (ddp under torchrun, else single) | single | ddp | fsdp | hsdp (FSDP2 sharded within
    # groups of shard_group_size ranks, replicated across them: docs/cluster.md)
    strategy: str = "auto"
    # hsdp: ranks per shard group (consecutive ranks; a multiple of context_parallel dividing
    # the world); null = the ranks per node, raised to a multiple of context_parallel
    shard_group_size: int | None = None
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    compile: bool | str = "auto"  # torch.compile each block: auto (CUDA yes, CPU no) | true | false
    # CUDA graphs for the compiled blocks (torch.compile mode="reduce-overhead"): static shapes
    # only; refused at start where they cannot work (flashtrain/train/compile.py)
    cuda_graphs: bool = False
    prefetch_steps: int = 2  # steps of micro-batches prepared ahead on a thread; 0 = in the loop
    grad_clip: float | None = 1.0  # max global grad norm; null or 0 = no clipping
    log_interval: int = 10
    eval_interval: int = 50  # 0 = only at the end
    eval_batches: int | None = 8  # validation batches per rank per eval (null = all there are)
    eval_at_end: bool = True
    # Retrieval tasks at every evaluation (flashtrain/train/retrieval_eval.py): names or groups
    # of flashtrain/data/retrieval (passkey, needle, ruler, ...); [] = none. Text data only.
    eval_tasks: list[str] = field(default_factory=list)
    eval_task_lengths: list[int] = field(default_factory=list)  # [] = [seq_len]
    eval_task_depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    # samples per (task, length, depth) cell, all ranks together: the evaluation's cost
    eval_task_samples: int = 4
    ckpt_interval: int = 50  # 0 = only at the end
    ckpt_at_end: bool = True
    keep_last: int = 3  # checkpoints kept on disk (0 = keep all)
    # write checkpoints in the background (torch.distributed.checkpoint.async_save): training
    # goes on meanwhile, one save in flight at most; off until a GPU has measured it
    async_checkpoint: bool = False
    ckpt_dir: str | None = None  # null = <run dir>/checkpoints
    resume: str | None = None  # null | auto (newest in ckpt_dir, if any) | <checkpoint or folder>
    allow_schedule_change: bool = False  # resume across an lr schedule change (docs/training.md)
    allow_unverified_checkpoint: bool = False  # resume from a checkpoint without checksums
    # resume onto other data (corpus, seq_len, ...): the new data's stream starts from its beginning
    resume_other_data: bool = False
    wait_for_lock: bool = False  # ckpt_dir in use by another run: wait for it (false: refuse)
    on_nonfinite: str = "stop"  # NaN/inf loss: stop (naming the step) | skip (drop the update)
    max_skipped_steps: int = 10  # with skip: stop after this many in a row
    progress: str = "auto"  # auto (a bar on a terminal, lines otherwise) | bar | lines | none
    metrics_file: str | None = "metrics.jsonl"  # JSON lines in the run dir, rank 0; null = none
    peak_flops: float | None = None  # device peak FLOP/s for MFU; null = look it up / estimate
    allow_slow_cpu: bool = False  # run on a CPU even when a step is estimated to take very long
    cpu_step_time_limit_s: float = 120.0  # refuse CPU runs estimated slower per step than this
    # CPU runs' intra-op threads; null = chosen from the free cores and the model's matmul size
    # (flashtrain/train/cpu_threads.py; an OMP_NUM_THREADS in the environment is kept)
    cpu_threads: int | None = None
    dist_timeout_s: int = 1800
    deterministic: bool = False  # torch.use_deterministic_algorithms(True)
    # Context parallelism: ranks that split each sequence; data-parallel over
    # world_size / context_parallel groups. 1 = off. docs/context_parallel.md
    context_parallel: int = 1
    # ring: K/V travel round the ranks (any head count) | ulysses: an all-to-all to head shards
    # (n_head a multiple of the ranks) | hybrid: Ulysses inside groups of ulysses_size ranks,
    # the ring across the groups
    context_parallel_mode: str = "ring"
    ulysses_size: int | None = None  # hybrid: ranks per Ulysses group (a divisor, 1 < U < P)
    cp_layout: str = (
        "zigzag"  # the ring's split: zigzag (the same causal work per rank) | contiguous
    )
    ddp: DDPConfig = field(default_factory=DDPConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)

    def __post_init__(self):
        check_choice(self.strategy, STRATEGIES, "trainer.strategy")
        check_choice(self.precision, PRECISIONS, "trainer.precision")
        check_choice(self.on_nonfinite, ("stop", "skip"), "trainer.on_nonfinite")
        check_choice(self.progress, ("auto", "bar", "lines", "none"), "trainer.progress")
        check_choice(self.cp_layout, LAYOUTS, "trainer.cp_layout")
        check_choice(self.context_parallel_mode, CP_MODES, "trainer.context_parallel_mode")
        if isinstance(self.compile, str):  # a YAML / command-line bool arrives as a bool
            self.compile = {"true": True, "false": False}.get(self.compile.lower(), self.compile)
            if self.compile != "auto" and not isinstance(self.compile, bool):
                raise ValueError(f"trainer.compile={self.compile!r}; allowed: auto, true, false")
        _at_least(self, 1, "trainer", "log_interval", "context_parallel")
        _at_least(
            self,
            0,
            "trainer",
            "max_steps",
            "eval_interval",
            "ckpt_interval",
            "keep_last",
            "prefetch_steps",
        )
        context_parallel_sizes(self)  # the mode's group sizes, refused here when they cannot be
        if self.eval_batches is not None:
            _at_least(self, 1, "trainer", "eval_batches")
        _at_least(self, 1, "trainer", "eval_task_samples")
        if self.eval_tasks and self.context_parallel > 1:
            raise ValueError(
                "trainer.eval_tasks scores whole sequences on each rank, and "
                f"trainer.context_parallel={self.context_parallel} splits them: set "
                "trainer.eval_tasks=[] and score the checkpoints with scripts/evaluate.py --tasks"
            )
        if any(n < 2 for n in self.eval_task_lengths):
            raise ValueError(
                f"trainer.eval_task_lengths must be >= 2 tokens, got {list(self.eval_task_lengths)}"
            )
        if not self.eval_task_depths or any(not 0.0 <= d <= 1.0 for d in self.eval_task_depths):
            raise ValueError(
                f"trainer.eval_task_depths must be depths in [0, 1] (0: the start, 1: the end), "
                f"got {list(self.eval_task_depths)}"
            )
        if self.cpu_threads is not None:
            _at_least(self, 1, "trainer", "cpu_threads")
        _at_least(self, 0, "trainer", "max_skipped_steps")
        _at_least(self, 1, "trainer", "dist_timeout_s")
        if self.grad_clip is not None and self.grad_clip < 0:  # a negative norm flips the update
            raise ValueError(
                f"trainer.grad_clip must be >= 0 (0 or null: no clipping), got {self.grad_clip}"
            )
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ValueError(
                f"trainer.peak_flops must be > 0 FLOP/s (null: looked up), got {self.peak_flops}"
            )
        if not self.cpu_step_time_limit_s > 0:
            raise ValueError(
                f"trainer.cpu_step_time_limit_s must be > 0, got {self.cpu_step_time_limit_s}"
            )


@dataclass
class OptimConfig:
    name: str = "adamw"  # the only one implemented
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_norm_and_bias: bool = False  # biases and norm gains get weight decay too
    decay_embeddings: bool = False  # token/position embeddings get weight decay too
    fused: bool | None = None  # null = fused AdamW on CUDA, foreach elsewhere
    schedule: str = "cosine"  # cosine | linear | constant, after a linear warmup
    warmup_steps: int = 15
    decay_steps: int | None = None  # null = trainer.max_steps
    min_lr_ratio: float = 0.1  # final lr = lr * min_lr_ratio

    def __post_init__(self):
        check_choice(self.name, ("adamw",), "optim.name")
        check_choice(self.schedule, ("cosine", "linear", "constant"), "optim.schedule")
        if not self.lr > 0.0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must be two values in [0, 1), got {list(self.betas)}")
        if not self.eps > 0.0:
            raise ValueError(f"optim.eps must be > 0, got {self.eps}")
        if self.weight_decay < 0.0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.decay_steps is not None and self.decay_steps < 0:
            raise ValueError(f"optim.decay_steps must be >= 0 or null, got {self.decay_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _at_least(self, 0, "optim", "warmup_steps")


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | tensorboard | none (metrics still go to trainer.metrics_file)
    project: str = "flashtrain"
    entity: str | None = None
    mode: str | None = None  # online | offline | disabled; null = $WANDB_MODE, else offline
    run_name: str | None = None  # null = the run's name
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str | None = None
    dir: str | None = None  # null = the run dir (wandb), <run dir>/tensorboard (tensorboard)

    def __post_init__(self):
        check_choice(self.name, ("wandb", "tensorboard", "none"), "logger.name")
        if self.name == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(  # at start, not after the model is built and the run folder made
                "logger=tensorboard needs the tensorboard package: pip install tensorboard "
                "(or logger=none: metrics.jsonl alone)"
            )
        if self.mode is not None:
            check_choice(self.mode, ("online", "offline", "disabled"), "logger.mode")


@dataclass
class TrainConfig:
    """configs/train.yaml: the run, and one config per group."""

    name: str | None = (
        None  # run name (wandb, logs); null = <experiment> or <model>-<data>-<seq_len>
    )
    seed: int = 1234
    seq_len: int = 256  # context length; model and data configs read it as ${seq_len}
    global_batch_size: int | None = 16  # sequences per optimizer step over all ranks
    global_batch_tokens: int | None = None  # or tokens per step: global_batch_size = this / seq_len
    # sequences per device per forward/backward; auto: the largest the memory plan fits in the
    # GPU (flashtrain/train/batch_sizing.py), 8 on a CPU
    micro_batch_size: int | str = "auto"
    # Groups with several schemas: each holds the dataclass its discriminator picks.
    model: Any = None  # flashtrain.models.config (arch)
    attention: Any = None  # flashtrain.models.attention_layers (impl)
    data: Any = None  # flashtrain.data.config (loader)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self):
        if self.micro_batch_size != "auto":
            if isinstance(self.micro_batch_size, (str, bool)):
                raise ValueError(
                    f"micro_batch_size={self.micro_batch_size!r}; allowed: auto or an integer >= 1"
                )
            _at_least(self, 1, "", "micro_batch_size")
        _at_least(self, 1, "", "seq_len")
        _at_least(self, 0, "", "seed")  # numpy's seed sequences take no negative seed
        for key in ("global_batch_size", "global_batch_tokens"):
            if getattr(self, key) is not None:
                _at_least(self, 1, "", key)
        self.model: TransformerConfig = model_config(self.model)
        self.attention: AttentionConfig = attention_config(self.attention)
        self.data: DataConfig = data_config(self.data)
        if self.model.max_seq_len < self.seq_len:
            raise ValueError(
                f"seq_len={self.seq_len} is longer than the model takes (model.max_seq_len="
                f"{self.model.max_seq_len}); lower seq_len or raise model.max_seq_len"
            )
        check_data_fits(self)


def masks_documents(data: DataConfig) -> bool:
    """Whether the data cuts attention at document ends (data.document_masking): the token
    cache appends <eos> only with eos_policy=append; a streamed corpus always separates them."""
    if not getattr(data, "document_masking", False):
        return False
    return getattr(data, "streaming", False) or getattr(data, "eos_policy", "none") == "append"


def check_data_fits(cfg: TrainConfig) -> None:
    """What the data needs from the model, the attention and the trainer, known from the config
    alone: checked before anything is built, dry runs included, so no run prepares its data
    (tokenizing a corpus, generating images) only to be refused."""
    check_task(cfg.model, cfg.data)
    loader = DATA.build_class(cfg.data).for_config(cfg.data)  # its own (seq_len, eval_batches)
    loader.check_run_settings(cfg.data, seq_len=cfg.seq_len, eval_batches=cfg.trainer.eval_batches)
    data_ids = getattr(cfg.data, "vocab_size", None)  # every loader's token id count
    if data_ids is not None and data_ids > cfg.model.vocab_size:
        raise ValueError(
            f"data '{cfg.data.name}' has {data_ids} token ids but the model's vocab_size is "
            f"{cfg.model.vocab_size}; set model.vocab_size >= {data_ids} (it defaults to "
            f"data.vocab_size)"
        )
    if masks_documents(cfg.data):
        if cfg.attention.impl != "flash":
            raise ValueError(
                f"data.document_masking=true needs attention=flash (the varlen kernel keeps "
                f"attention inside each document), not {cfg.attention.impl}; pass "
                f"data.document_masking=false to attend across documents"
            )


def _trains_on(arch: str, schema: type[TransformerConfig], task: str) -> str:
    """How a config picks `task` for an architecture: "model.arch=bert with model.head=mlm"."""
    how = f" with model.{schema.task_key}={task}" if schema.task_key else ""
    return f"model.arch={arch}{how}"


def check_task(model: TransformerConfig, data: DataConfig) -> None:
    """The model must train on the task the data's loader class gives (lm, mlm, classification):
    each model config says its task (TransformerConfig.task), each loader class its `task`."""
    loader = DATA.build_class(data).for_config(data)
    if model.task == loader.task:
        return
    fits = [
        _trains_on(arch, schema, loader.task)
        for arch, schema in MODEL_CONFIGS.items()
        if loader.task in schema.tasks
    ]
    raise ValueError(
        f"data '{data.name}' ({loader.__name__}) gives {loader.task} batches, but "
        f"{_trains_on(model.arch, type(model), model.task)} trains on {model.task} batches; "
        f"for {loader.task} data use {' or '.join(fits) or 'a model that trains on it'}"
    )


def validate_config(cfg: Any) -> TrainConfig:
    """The composed config (a DictConfig; Hydra's own `hydra` node is dropped) as a checked
    TrainConfig, with tokenizer_from_init's default and vocabulary_from_tokenizer's vocab_size.
    Raises ConfigError naming what is wrong and what is allowed."""
    if isinstance(cfg, DictConfig) and "hydra" in cfg:
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    if isinstance(cfg, DictConfig):
        cfg = vocabulary_from_tokenizer(tokenizer_from_init(cfg))
    return to_dataclass(TrainConfig, cfg, what="")


def config_dict(cfg: TrainConfig) -> dict:
    """The config as plain dicts and lists (for YAML, wandb, checkpoint metadata)."""
    return dataclasses.asdict(cfg)


def config_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(config_dict(cfg))


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's global batch is split over ranks and micro-batches.

    With context parallelism each sequence is split over context_parallel ranks, so the batch is
    split over world_size / context_parallel data-parallel groups only. micro_batch_size is the
    one used; requested_micro_batch_size the config's (larger when it does not divide a rank's
    share of the batch: batch_plan)."""

    seq_len: int
    micro_batch_size: int
    world_size: int
    grad_accum: int
    context_parallel: int = 1
    requested_micro_batch_size: int | None = None  # None: the one used

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.context_parallel

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.data_parallel * self.grad_accum

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def micro_batch_reduced(self) -> bool:
        requested = self.requested_micro_batch_size
        return requested is not None and requested != self.micro_batch_size

    def split(self) -> str:
        """How a step's sequences are split, for the run's summary."""
        if self.context_parallel == 1:
            ranks = f"{self.world_size} ranks"
        else:
            ranks = f"{self.data_parallel} data-parallel groups of {self.context_parallel} ranks"
        micro = f"micro {self.micro_batch_size}"
        if self.micro_batch_reduced:
            share = self.micro_batch_size * self.grad_accum
            micro += (
                f" (micro_batch_size={self.requested_micro_batch_size} is the most; {share} "
                "sequences per rank)"
            )
        return f"{micro} x {ranks} x {self.grad_accum} accumulation"


# What micro_batch_size=auto is where no memory plan sizes it (a CPU): a CPU's matmuls are as
# fast per token at 8 sequences as at more, and the host-memory check still applies.
AUTO_MICRO_BATCH_CPU = 8


def batch_plan(
    cfg: TrainConfig,
    world_size: int,
    context_parallel: int = 1,
    micro_batch_size: int | None = None,
) -> BatchPlan:
    """Gradient accumulation steps from the global batch (sequences or tokens), the world size
    and the context-parallel size (which must divide it).

    micro_batch_size is an upper bound: each rank's share of the global batch is cut into the
    largest micro-batches up to it that divide the share evenly. The step's gradient is the
    token-weighted mean over the whole global batch however it is cut (trainer.py), so a preset
    runs unchanged on any number of ranks that divides its global batch (cpu/tiny's 8 sequences
    on 2 ranks: micro 4 each, not 8). micro_batch_size (the argument): the bound to use in place
    of the config's (batch_sizing.py's auto choice); the config's auto unsized is
    AUTO_MICRO_BATCH_CPU."""
    check_context_parallel(context_parallel, world_size)
    data_parallel = world_size // context_parallel
    seq_len, mbs = cfg.seq_len, micro_batch_size or cfg.micro_batch_size
    if mbs == "auto":
        mbs = AUTO_MICRO_BATCH_CPU
    gbs, tokens = cfg.global_batch_size, cfg.global_batch_tokens
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
        gbs = mbs * data_parallel
    if gbs <= 0 or gbs % data_parallel:
        ranks = f"world_size={world_size}"
        if context_parallel > 1:
            ranks = f"{data_parallel} data-parallel groups (world_size / context_parallel)"
        fits = max(data_parallel, gbs // data_parallel * data_parallel)
        raise ConfigError(
            f"the global batch of {gbs} sequences does not split evenly over {ranks}; use "
            f"global_batch_size={fits} (a multiple of {data_parallel}) or another number of ranks"
        )
    per_rank = gbs // data_parallel
    micro = max(d for d in range(1, min(mbs, per_rank) + 1) if per_rank % d == 0)
    return BatchPlan(seq_len, micro, world_size, per_rank // micro, context_parallel, mbs)


def context_parallel_sizes(trainer: Any) -> tuple[int, int]:
    """(ring ranks R, Ulysses ranks U) splitting each sequence, R * U = trainer.context_parallel:
    ring (P, 1), ulysses (1, P), hybrid (P / ulysses_size, ulysses_size)."""
    size, mode, ulysses = (
        trainer.context_parallel,
        trainer.context_parallel_mode,
        trainer.ulysses_size,
    )
    where = f"trainer.context_parallel={size} with trainer.context_parallel_mode={mode}"
    if mode == "hybrid":
        allowed = [u for u in range(2, size) if size % u == 0]
        if ulysses not in allowed:
            hint = f"one of {allowed}" if allowed else "none: use ring or ulysses"
            raise ValueError(
                f"{where} needs trainer.ulysses_size, the ranks of each Ulysses group, a divisor "
                f"of {size} between 2 and {size - 1} (got {ulysses}); allowed: {hint}"
            )
        return size // ulysses, ulysses
    if ulysses is not None and ulysses != (size if mode == "ulysses" else 1):
        raise ValueError(
            f"trainer.ulysses_size={ulysses} applies to trainer.context_parallel_mode=hybrid only "
            f"({where} uses {size if mode == 'ulysses' else 1}); leave it null"
        )
    return (1, size) if mode == "ulysses" else (size, 1)


def check_context_parallel(context_parallel: int, world_size: int) -> None:
    """trainer.context_parallel must divide the world size (data-parallel over the quotient)."""
    if context_parallel < 1 or world_size % context_parallel:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ConfigError(
            f"trainer.context_parallel={context_parallel} does not divide the world size "
            f"{world_size}; allowed: {', '.join(map(str, divisors))}"
        )


def on_rank0(value: Any, other: Any = None) -> Any:
    """OmegaConf resolver `${ft_rank0:a,b}`: a in the launching process / rank 0, b elsewhere.

    configs/train.yaml uses it so that under torchrun only rank 0 makes Hydra's run directory,
    its .hydra/ files and its log file; the other ranks learn the directory from rank 0.
    """
    return value if os.environ.get("RANK", "0") == "0" else other


def register_resolvers() -> None:
    from flashtrain.train.job_run import job_run_dir

    if not OmegaConf.has_resolver("ft_rank0"):
        OmegaConf.register_new_resolver("ft_rank0", on_rank0)
    if not OmegaConf.has_resolver("ft_job_run_dir"):  # a restarted job's run folder
        OmegaConf.register_new_resolver("ft_job_run_dir", job_run_dir)


register_resolvers()
