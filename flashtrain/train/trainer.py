"""The training loop: config -> factories -> (DDP | FSDP2) -> steps, evals, checkpoints, metrics.

One optimizer step draws `grad_accum` micro-batches per rank. Each micro-batch's loss is weighted
by its share of the step's targets over all ranks and micro-batches, so the update is the exact
token-weighted mean gradient of the global batch, whatever the split over processes; a run on
two processes therefore matches one process with the same global batch.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import math
import os
import random
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.profiler import record_function

from flashtrain.checkpoint import initial_weights
from flashtrain.checkpoint.run_info import write_run_info
from flashtrain.checkpoint.run_lock import CheckpointDirBusy, RunLock
from flashtrain.checkpoint.shared_folder import check_same_folder_on_every_rank
from flashtrain.checkpoint.sources import check_source
from flashtrain.collectives import broadcast_object, on_rank_0
from flashtrain.data import build_data
from flashtrain.data.files import atomic_path
from flashtrain.data.hf_tokenizer import check_tokenizer_source
from flashtrain.train.batch_sizing import cpu_auto_line, size_micro_batch
from flashtrain.train.compile import check_cuda_graphs, compile_blocks
from flashtrain.train.config import ConfigError, config_dict, config_yaml, validate_config
from flashtrain.train.cpu_estimate import estimate_cpu_step_time, refuse_slow_cpu_run
from flashtrain.train.cpu_threads import (
    ThreadChoice,
    apply_cpu_threads,
    auto_cpu_threads,
    projection_flops,
)
from flashtrain.train.distributed import (
    DistEnv,
    describe_strategy,
    is_sharded,
    resolve_precision,
    setup_distributed,
    state_shards,
    teardown_distributed,
    unwrap,
    wrap_model,
)
from flashtrain.train.dry_run import build_memory_for, dry_run_plan, plan_world
from flashtrain.train.errors import from_config
from flashtrain.train.evaluation import check_validation_data, evaluate_model
from flashtrain.train.faults import (
    EvaluationAbandoned,
    NonFiniteLossError,
    Preempted,
    PreemptionHandler,
)
from flashtrain.train.host_memory import (
    HostMemoryEstimate,
    available_host_memory,
    check_host_memory,
    estimate_host_peak,
    process_rss,
)
from flashtrain.train.interval import IntervalStats
from flashtrain.train.job_run import continues_job_run, current_job
from flashtrain.train.loggers import Loggers, build_loggers
from flashtrain.train.memory_estimate import MemoryEstimate
from flashtrain.train.metric_names import (
    MAX_RSS_GIB,
    TRAIN_LOSS,
    TRAIN_LOSS_SCALE,
    TRAIN_TOKENS_SEEN,
)
from flashtrain.train.metrics import (
    PeakFlops,
    Throughput,
    build_peak_line,
    device_peak_flops,
    format_duration,
    measure_matmul_flops,
    memory_metrics,
)
from flashtrain.train.optim import build_optimizer, build_scheduler
from flashtrain.train.prefetch import StepPrefetcher
from flashtrain.train.progress import Progress, format_metrics
from flashtrain.train.retrieval_eval import RetrievalEval, eval_tasks_summary
from flashtrain.train.run_folder import RunFolderClaim
from flashtrain.train.run_state import RunCheckpoints, RunState
from flashtrain.train.start_checks import check_run_start
from flashtrain.train.step import autocast, forward_backward
from flashtrain.utils import format_count, git_commit

log = logging.getLogger("flashtrain")

CONFIG_FILE = (
    "config.yaml"  # the run's whole resolved config, in its folder (the summary's pointer)
)


def ensure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
        )
    if log.getEffectiveLevel() > logging.INFO and os.environ.get("RANK", "0") == "0":
        log.setLevel(logging.INFO)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """__init__ builds the run: process group, model (wrapped for DDP / FSDP2), optimizer,
    schedule, data and the counters, and prints the summary. fit() restores a checkpoint when
    resuming, opens the metric sinks and the progress display, and runs the loop.

    run_dir: where outputs go (under torchrun rank 0's is used by every rank); choices: Hydra's
    group choices (model=..., experiment=...), for the run name and the logged config.
    """

    def __init__(self, cfg: Any, run_dir: str | os.PathLike, choices: dict[str, str] | None = None):
        ensure_logging()
        # Everything close() lets go of, set before anything is built: a build that fails
        # half-way is closed, and its own error is the one reported.
        self.loggers = Loggers()
        self.progress: Progress | None = None
        self.prefetcher: StepPrefetcher | None = None
        self.lock: RunLock | None = None
        self.run_folder: RunFolderClaim | None = None
        self.model = self.raw_model = self.optimizer = self.scheduler = self.scaler = None
        self.state = RunState()
        self.checkpoints: RunCheckpoints | None = None
        self.retrieval: RetrievalEval | None = None  # trainer.eval_tasks
        self.cfg = cfg = validate_config(cfg)
        t = cfg.trainer
        self.env: DistEnv = setup_distributed(
            t.device, t.dist_timeout_s, need_group=is_sharded(t.strategy)
        )
        try:
            self._build(run_dir, choices or {})
        except BaseException:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - the build's error is the one to report
                log.warning("closing the half-built run failed too", exc_info=True)
            raise

    @property
    def step(self) -> int:
        """Optimizer steps taken (resumed ones included)."""
        return self.state.step

    def _build(self, run_dir: str | os.PathLike, choices: dict[str, str]) -> None:
        cfg, t, env = self.cfg, self.cfg.trainer, self.env
        if not env.is_main:
            log.setLevel(logging.WARNING)
        self.dry_run = t.max_steps == 0
        # A dry run plans for the world its config needs when this one cannot run it.
        world = plan_world(cfg, env, self.dry_run)
        self.world_size, self.strategy, self.plan, self.cp = world
        self.precision = resolve_precision(t.precision, env.device, self.strategy)
        self.run_dir = Path(
            broadcast_object(str(Path(run_dir).absolute()) if env.is_main else None)
        )
        self.ckpt_root = Path(t.ckpt_dir) if t.ckpt_dir else self.run_dir / "checkpoints"
        # The data's source, the checkpoint and logger folders: before the model is built, in
        # a dry run too (start_checks.py)
        check_run_start(cfg, run_dir=self.run_dir, ckpt_root=self.ckpt_root, is_main=env.is_main)
        # The cluster job this start belongs to (rank 0's view), and whether it continues the
        # run folder its job recorded: a restart or requeue (flashtrain/train/job_run.py).
        self.job = broadcast_object(current_job() if env.is_main else None)
        self.continues_job = broadcast_object(
            continues_job_run(self.run_dir, self.job) if env.is_main else None
        )
        self.choices = broadcast_object(choices if env.is_main else None)
        self.run_name = cfg.name or self._default_name()
        self.history: list[tuple[int, float]] = []
        self.eval_history: list[tuple[int, dict[str, float]]] = []
        self.interval = IntervalStats()
        self.data_state: dict | None = None  # the stream position after the batches consumed

        if env.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if t.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)

        # The seed fixes the initial weights: one process's bit for bit (as a model built on
        # CPU), and every rank's shards under FSDP2 (flashtrain/models/materialize.py).
        set_seed(cfg.seed)
        # Built on the meta device: no memory until the model is placed (below; a dry run never)
        with from_config("model"), torch.device("meta"):
            model = self.cp.build_model(cfg.model, cfg.attention)  # ring attention when cp > 1
        self.num_params = int(model.num_parameters())
        self.flops_per_token = float(model.estimate_flops_per_token(cfg.seq_len))
        # micro_batch_size=auto on a GPU (or a dry run's planned GPUs): the memory plan sizes it
        world, self.auto_batch = size_micro_batch(cfg, world, model, env.device, self.dry_run)
        self.plan = world.plan
        planned_device = torch.device("cuda") if self.dry_run else env.device  # a dry run's GPUs
        check_cuda_graphs(cfg, planned_device, grad_accum=self.plan.grad_accum)
        self.cpu_threads: ThreadChoice | None = None  # on a CPU: intra-op threads and why
        if env.device.type == "cpu":  # before anything measures speed (measure_matmul_flops)
            tokens = self.plan.seq_len // self.cp.size  # a rank's share of each sequence
            work = projection_flops(self.plan.micro_batch_size, tokens, cfg.model.d_model)
            self.cpu_threads = auto_cpu_threads(work, t.cpu_threads)
            apply_cpu_threads(self.cpu_threads)
        matmul_flops = measure_matmul_flops(env.device) if env.device.type == "cpu" else None
        self.peak: PeakFlops = device_peak_flops(
            env.device, self.precision, t.peak_flops, measured=matmul_flops
        )
        self.throughput = Throughput(self.flops_per_token, self.peak, env.world_size)
        flops_per_step = self.flops_per_token * self.plan.tokens_per_step
        self.cpu_step_estimate = (
            estimate_cpu_step_time(flops_per_step / self.world_size, matmul_flops)
            if matmul_flops is not None
            else None
        )
        self.compile_blocks = (
            t.compile if isinstance(t.compile, bool) else env.device.type == "cuda"
        )
        self.memory: MemoryEstimate | None = None  # a dry run's per-GPU estimate
        self.host_memory: HostMemoryEstimate | None = None  # a CPU run's peak on this host

        def host_peak(plan) -> HostMemoryEstimate:
            return estimate_host_peak(
                model, cfg, plan, precision=self.precision, strategy=self.strategy
            )

        host_lines = []
        if env.device.type == "cpu":
            self.host_memory = host_peak(self.plan)
            host_lines.append(f"host memory (estimate): {self.host_memory.describe()}")
        if self.dry_run:  # the plan and the memory it needs; no weights, no data, no tokenizer
            gpu = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else None
            self.memory, plan_lines = dry_run_plan(
                model, world, env.world_size, t, self.flops_per_token, gpu
            )
            self._check_sources()
            self._print_summary(model, [*plan_lines, *host_lines])
            return
        self._claim_run_folder()  # one run per run folder: before this run logs anything there
        self._print_summary(plan_lines=host_lines)
        if self.cpu_step_estimate is not None and not t.allow_slow_cpu:
            refuse_slow_cpu_run(
                self.cpu_step_estimate, flops_per_step, t.max_steps, t.cpu_step_time_limit_s
            )
        # allow_slow_cpu's advice followed must not end in the allocator's crash
        if self.host_memory is not None:  # rank 0's figure: every rank refuses, or none does
            found = (available_host_memory(), process_rss()) if env.is_main else None
            available, resident = broadcast_object(found)  # every rank has started by now
            check_host_memory(self.host_memory, available, self.plan, host_peak, resident)
        self._lock_checkpoint_folder()  # one run per checkpoint folder, one it can write
        if self.compile_blocks:
            compile_blocks(model, t)
        self.model = self._placed_with_initial_weights(model)
        self.raw_model = unwrap(self.model)
        with from_config("optim"):
            self.optimizer = build_optimizer(self.model, cfg.optim, env.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, t.max_steps)
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None
        # The data last: preparing it can take long (tokenizing, generating Pathfinder images),
        # which a run refused above should not wait for.
        # Every rank of a context-parallel group reads its group's batches and keeps its shard.
        with from_config(f"data '{cfg.data.name}'"):
            data = build_data(
                cfg.data,
                seq_len=cfg.seq_len,
                micro_batch_size=self.plan.micro_batch_size,
                seed=cfg.seed,
                rank=self.cp.dp_rank,
                world_size=self.cp.dp_size,
                eval_batches=t.eval_batches,
            )
        self.data = self.cp.shard_data(data)
        check_validation_data(self.data, t, cfg.data.name)  # not found after the last step
        if t.eval_tasks and (t.eval_interval or t.eval_at_end):
            sharded = is_sharded(self.strategy)  # FSDP2: the root module gathers its weights
            self.retrieval = RetrievalEval(
                cfg, self.model if sharded else self.raw_model, self.data, env, self.run_dir,
                self.plan.micro_batch_size, sharded=sharded,
            )  # fmt: skip
        bounds = self.data.loss_bounds()
        if bounds and env.is_main:
            log.info("data loss: " + ", ".join(f"{k} {v:.3f}" for k, v in bounds.items()))
        self.checkpoints = RunCheckpoints(
            cfg,
            env,
            root=self.ckpt_root,
            strategy=self.strategy,
            cp_size=self.cp.size,
            run_name=self.run_name,
            num_params=self.num_params,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            data=self.data,
            state=self.state,
            continued_job=self.job.describe() if self.continues_job else None,
        )

    def _check_sources(self) -> None:
        """A dry run reads no weights and no data, but checks that what the run would read is
        there: model.init_from (an hf: hub id cached, or its config.json fetched, and fitting the
        model) and an hf: tokenizer (cached or fetched; offline: one line naming HF_HUB_OFFLINE
        or a local folder)."""
        cfg = self.cfg
        if cfg.model.init_from:
            with from_config(f"model.init_from={cfg.model.init_from}"):
                found = check_source(cfg.model.init_from, cfg.model)
            log.info("initial weights found: %s", found)
        with from_config(f"data.tokenizer={getattr(cfg.data, 'tokenizer', None)}"):
            check_tokenizer_source(cfg.data)

    def _placed_with_initial_weights(self, model: torch.nn.Module) -> torch.nn.Module:
        """The meta-built model placed (FSDP2 shards it first, so each rank only ever holds its
        shards; DDP needs whole weights to replicate) and given its initial weights: fresh, then
        model.init_from's (flashtrain/checkpoint/initial_weights.py)."""
        cfg, t, env = self.cfg, self.cfg.trainer, self.env

        def place(m):
            return wrap_model(
                m, self.strategy, env, precision=self.precision, trainer_cfg=t,
                mesh=self.cp.gradient_mesh,
            )  # fmt: skip

        if is_sharded(self.strategy):
            model = place(model)
        with from_config("model"):
            initial_weights(
                unwrap(model), cfg.model.init_from, device=env.device,
                position_mode=cfg.model.init_positions,
            )  # fmt: skip
        if self.host_memory is not None:  # a CPU run: the host's peak so far against its estimate
            rss = memory_metrics(env.device)[MAX_RSS_GIB]
            log.info(
                "initial weights placed: host peak RSS %.2f GiB so far (the run's estimated peak: "
                "%.2f GiB)", rss, self.host_memory.per_rank / 2**30,
            )  # fmt: skip
        else:
            shards = state_shards(self.strategy, t, env.world_size)
            estimate = build_memory_for(unwrap(model), self.strategy, shards)
            log.info("initial weights placed: %s", build_peak_line(env.device, estimate))
        return model if is_sharded(self.strategy) else place(model)

    def _claim_run_folder(self) -> None:
        """Rank 0 claims the run folder (flashtrain/train/run_folder.py: refused while another
        run is alive in it, or when it holds the records of a run with another checkpoint
        folder); every rank learns whether that failed. Waits as _lock_checkpoint_folder does
        with trainer.wait_for_lock."""
        claim = lambda: RunFolderClaim(self.run_dir, self.ckpt_root, self.run_name).acquire(
            wait=self.cfg.trainer.wait_for_lock
        )
        self.run_folder = on_rank_0(claim, (ConfigError,), is_main=self.env.is_main)

    def _lock_checkpoint_folder(self) -> None:
        """Rank 0 takes the lock on the checkpoint folder (creating it: the check that it can
        be written) before the weights and the data; every rank learns whether that failed.
        While rank 0 waits for the lock (trainer.wait_for_lock), the other ranks wait for it,
        up to trainer.dist_timeout_s."""
        lock = lambda: RunLock(self.ckpt_root, self.run_name).acquire(
            wait=self.cfg.trainer.wait_for_lock
        )
        self.lock = on_rank_0(lock, (ConfigError, CheckpointDirBusy), is_main=self.env.is_main)
        if self.env.world_size > 1:  # several nodes must share it: checked before training
            check_same_folder_on_every_rank(
                self.ckpt_root, is_main=self.env.is_main, setting="trainer.ckpt_dir"
            )

    def _default_name(self) -> str:
        exp = self.choices.get("experiment")
        if exp and exp != "None":
            return exp.replace("/", "-")
        model = self.choices.get("model") or self.cfg.model.arch
        data = self.choices.get("data") or self.cfg.data.name
        return f"{model}-{data}-{self.cfg.seq_len}"

    def _print_summary(self, model: torch.nn.Module | None = None, plan_lines=()) -> None:
        """A short summary: what trains on what, its size, the batch plan, the device, how long
        and where it writes (the whole resolved config is in the run folder, CONFIG_FILE); a dry
        run's model and `plan_lines` (dry_run_plan). Known before any data is touched."""
        if not self.env.is_main:
            return
        cfg, plan, env, t = self.cfg, self.plan, self.env, self.cfg.trainer
        lines = []
        if model is not None:
            lines += [str(model), ""]
        if self.dry_run:
            where = "dry run: nothing written (the full config: add --cfg job to the command)"
        else:
            where = f"dir: {self.run_dir} (the full config: {self.run_dir / CONFIG_FILE})"
        lines.append(f"run: {self.run_name}  {where}")
        m = cfg.model
        choice = self.choices.get("model")
        named = f"{m.arch} ({choice})" if choice and choice != m.arch else m.arch
        lines.append(
            f"model: {named}, {m.n_layer} layers x {m.d_model} wide  attention: "
            f"{cfg.attention.impl}  data: {cfg.data.name}  vocab: {m.vocab_size}"
        )
        if m.init_from:
            lines.append(f"initial weights: {m.init_from}")
        lines.append(f"params: {self.num_params}")
        lines.append(f"flops/token: {format_count(self.flops_per_token)} at seq_len {cfg.seq_len}")
        lines.append(
            f"batch: {plan.global_batch_size} seqs x {plan.seq_len} = "
            f"{format_count(plan.tokens_per_step)} tokens/step = {plan.split()}"
        )
        if cfg.micro_batch_size == "auto":
            lines.append(self.auto_batch.describe() if self.auto_batch else cpu_auto_line())
        if self.cp.enabled:
            lines.append(self.cp.describe())
        lines.append(
            f"device: {env.device}  strategy: "
            f"{describe_strategy(self.strategy, t, self.world_size)}  precision: "
            f"{self.precision}  world: {self.world_size}  compiled blocks: "
            f"{'yes' if self.compile_blocks else 'no'}"
        )
        if self.cpu_threads is not None:
            lines.append(f"threads: {self.cpu_threads.describe()}")
        lines += plan_lines  # a dry run: the planned world, the memory it needs per GPU
        peak = f"{format_count(self.peak.flops)}FLOP/s" if self.peak.flops else "unknown"
        lines.append(f"peak: {peak} ({self.peak.source})")
        if self.cpu_step_estimate is not None:
            total = format_duration(self.cpu_step_estimate * t.max_steps)
            steps = f" ({t.max_steps} steps: ~{total})" if t.max_steps else ""
            lines.append(
                f"estimated time per step on this CPU: ~{self.cpu_step_estimate:.2f}s{steps}"
            )
        lines.append(
            f"steps: {t.max_steps}  eval every {t.eval_interval or '-'}  checkpoint every "
            f"{t.ckpt_interval or '-'} -> {self.ckpt_root}"
        )
        if t.eval_tasks:
            lines.append(eval_tasks_summary(cfg))
        log.info("\n".join(lines))

    # ------------------------------------------------------------------- loop

    def fit(self, on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Resume (trainer.resume), then train to trainer.max_steps. Returns the summary.

        on_step(step): called after each optimizer step (e.g. a profiler's schedule)."""
        t, env = self.cfg.trainer, self.env
        if self.dry_run:
            log.info("trainer.max_steps=0: built the model and the plan (no data), exiting")
            return self._summary()
        if not self.checkpoints.resume():
            set_seed(self.cfg.seed + 1 + env.rank)  # a fresh run: dropout etc. differ by rank
        self.data_state = copy.deepcopy(self.data.state_dict())
        self.prefetcher = StepPrefetcher(
            self.data,
            self.plan.grad_accum,
            depth=t.prefetch_steps,
            pin_memory=env.device.type == "cuda",
        )
        self._open_outputs()
        preempt = PreemptionHandler()
        start_time = time.perf_counter()
        with preempt:
            while self.step < t.max_steps:
                with record_function("flashtrain::step"):
                    stop = self._train_step(preempt)
                if on_step is not None:
                    on_step(self.step)
                self.progress.step(self.step)
                done = self.step >= t.max_steps
                # The step's metrics before its checkpoint: a kill between the two leaves rows
                # past the newest checkpoint, which the resume drops (loggers.JsonlSink), never
                # a checkpointed step without its row, so metrics.jsonl has each step once.
                if self.step % t.log_interval == 0 or done or stop:
                    self._log_interval()
                path = None  # this step's checkpoint, once written
                if (
                    stop
                    or (t.ckpt_interval and self.step % t.ckpt_interval == 0)
                    or (done and t.ckpt_at_end)
                ):
                    path = self.save()
                else:  # trainer.async_checkpoint: a save written on every rank goes into place
                    self.checkpoints.poll()
                # No evaluation in a scheduler's short grace period, and none goes on into it
                if not stop and (
                    (t.eval_interval and self.step % t.eval_interval == 0)
                    or (done and t.eval_at_end)
                ):
                    try:
                        self.evaluate(preempt)
                    except EvaluationAbandoned as e:
                        if env.is_main:
                            log.warning("eval at step %d: %s", self.step, e)
                        stop = True
                        path = path or self.save()
                if stop:
                    self.checkpoints.wait()  # written in the background: complete before exit
                    raise Preempted(self.step, str(path))
            self.checkpoints.wait()  # the run ends once a save in the background is complete
        elapsed = time.perf_counter() - start_time
        self.progress.close()
        summary = self._summary()
        summary["elapsed_s"] = elapsed
        if env.is_main:
            last = {f"{TRAIN_LOSS} (last step)": self.history[-1][1]} if self.history else {}
            evals = self.eval_history[-1][1] if self.eval_history else {}
            log.info(
                "done: %d steps in %s  %s  checkpoint %s",
                self.step,
                format_duration(elapsed),
                format_metrics({**last, **evals}),
                self.state.last_ckpt,
            )
            if "eval/loss" in evals and (verdict := self.data.loss_verdict(evals["eval/loss"])):
                log.info(verdict)
        return summary

    def _open_outputs(self) -> None:
        """The run directory, the metric sinks (rank 0; wandb continues its run on a resume in
        the same directory) and the progress display."""
        env = self.env
        config = config_dict(self.cfg)
        config["run"] = {
            "params": self.num_params,
            "flops_per_token": self.flops_per_token,
            "world_size": env.world_size,
            "context_parallel": self.cp.size,
            "strategy": self.strategy,
            "precision": self.precision,
            "grad_accum": self.plan.grad_accum,
            "git_commit": git_commit() if env.is_main else None,
            "choices": self.choices,
            "run_dir": str(self.run_dir),
        }
        if env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            job = self.job
            write_run_info(
                self.run_dir, env.device, env.world_size, self.step,
                job=job.key if job else None, job_restart=job.restart if job else 0,
                job_command=list(job.command) if job else None,
                ckpt_dir=self.run_folder.record,  # the run the folder belongs to
            )  # fmt: skip
            with atomic_path(self.run_dir / CONFIG_FILE) as tmp:  # never half a config
                tmp.write_text(config_yaml(self.cfg))
        self.loggers = build_loggers(
            self.cfg,
            run_dir=self.run_dir,
            run_name=self.run_name,
            config=config,
            is_main=env.is_main,
            resume_id=self.state.wandb_id,
            resumed_from=self.step,  # what a crash logged past the checkpoint is dropped / hidden
        )
        if self.loggers.wandb is not None:
            self.state.wandb_id = self.loggers.wandb.id
        self.progress = Progress(
            self.cfg.trainer.progress,
            total=self.cfg.trainer.max_steps,
            initial=self.step,
            enabled=env.is_main,
        )

    def _summary(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "params": self.num_params,
            "losses": list(self.history),
            "evals": list(self.eval_history),
            "checkpoint": str(self.state.last_ckpt) if self.state.last_ckpt else None,
            "run_dir": str(self.run_dir),
            "world_size": self.world_size,  # a dry run's planned world (dry_run.py)
            "memory_per_gpu": dataclasses.asdict(self.memory) if self.memory else None,
            "dry_run": self.dry_run,
            "host_memory": dataclasses.asdict(self.host_memory) if self.host_memory else None,
        }

    def _train_step(self, preempt: PreemptionHandler) -> bool:
        """One optimizer step (step.py: the device work and its one host copy, then here the
        update or the skip). Returns True when any rank was asked to stop (SIGTERM)."""
        t = self.cfg.trainer
        start = time.perf_counter()
        with record_function("flashtrain::data"):
            step_input = self.prefetcher.next()
        self.data_state = step_input.data_state
        values = forward_backward(
            self.model, self.optimizer, step_input, self.env, precision=self.precision,
            strategy=self.strategy, scaler=self.scaler, stop_requested=lambda: preempt.requested,
            grad_clip=t.grad_clip,
        )  # fmt: skip
        loss_value, norm_value = values.loss, values.grad_norm
        step = self.step + 1  # the 1-based number of the step being taken
        finite = math.isfinite(loss_value) and (
            math.isfinite(norm_value) or self.scaler is not None
        )
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler is not None:
                self.scaler.update()  # unscale_ ran: close the scaler's step
            self.state.skipped_in_a_row += 1
            if t.on_nonfinite == "stop" or self.state.skipped_in_a_row > t.max_skipped_steps:
                raise NonFiniteLossError(
                    step,
                    loss_value,
                    norm_value,
                    str(self.state.last_ckpt) if self.state.last_ckpt else None,
                )
            log.warning(
                "step %d: non-finite loss %s (grad_norm %s), update skipped (%d in a row)",
                step,
                loss_value,
                norm_value,
                self.state.skipped_in_a_row,
            )
            with warnings.catch_warnings():  # the schedule advances although no update was made
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                self.scheduler.step()
        else:
            self.state.skipped_in_a_row = 0
            lr = self.scheduler.get_last_lr()[0]
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.interval.add_update(loss_value, lr, norm_value)
            self.history.append((step, loss_value))
        if values.has_correct:
            self.interval.add_accuracy(values.correct, values.targets)
        self.state.step = step
        self.state.tokens_seen += self.plan.tokens_per_step
        self.throughput.add(time.perf_counter() - start, self.plan.tokens_per_step)
        return values.stop_votes > 0

    def _log_interval(self) -> None:
        metrics = self.interval.flush()
        metrics.update(self.throughput.flush())
        metrics.update(memory_metrics(self.env.device))
        metrics[TRAIN_TOKENS_SEEN] = float(self.state.tokens_seen)
        if self.scaler is not None:
            metrics[TRAIN_LOSS_SCALE] = float(self.scaler.get_scale())
        eta = self.throughput.eta_seconds(self.cfg.trainer.max_steps - self.step)
        if self.env.is_main:
            self.progress.interval(self.step, metrics, eta, self.interval.flushed_updates)
            self.loggers.log(metrics, self.step)

    # ------------------------------------------------------------------- eval

    def evaluate(self, preempt: PreemptionHandler | None = None) -> dict[str, float]:
        """The validation metrics (flashtrain/train/evaluation.py), logged and kept. With
        `preempt`, its request (SIGTERM) abandons the evaluation: EvaluationAbandoned."""
        sharded = is_sharded(self.strategy)
        model = self.model if sharded else self.raw_model
        metrics = evaluate_model(
            model,
            self.data,
            self.env,
            sharded=sharded,
            autocast=partial(autocast, self.precision, self.strategy, self.env.device),
            stop_requested=(lambda: preempt.requested) if preempt else (lambda: False),
        )
        if self.retrieval is not None:
            metrics |= self.retrieval(self.step, self.run_name, git_commit(),
                                      partial(autocast, self.precision, self.strategy, self.env.device))  # fmt: skip
        self.eval_history.append((self.step, metrics))
        if self.env.is_main:
            text = format_metrics(metrics) or "no validation data"
            log.info("eval at step %d: %s", self.step, text)
            self.loggers.log(metrics, self.step)
        return metrics

    # ------------------------------------------------------------ checkpoints

    def save(self) -> Path:
        """Checkpoint the run at its current step (every rank calls it)."""
        return self.checkpoints.save(self.data_state)

    def close(self, clean: bool = False) -> None:
        if self.checkpoints is not None:  # an error path: no writer left running, no partial
            self.checkpoints.close()  # folder left (a clean end has waited for its save)
        if self.progress is not None:
            self.progress.close()
        self.loggers.finish()
        # Free the DDP reducer / FSDP state before the process group: were one of them the last
        # owner of the group, its destructor would run later under the GIL while gloo's worker
        # threads wait for the GIL to free finished work, and the process would never exit.
        if self.prefetcher is not None:
            self.prefetcher.close()
        for name in ("model", "raw_model", "optimizer", "scheduler", "scaler", "prefetcher"):
            setattr(self, name, None)
        self.checkpoints = None
        gc.collect()
        teardown_distributed(barrier=clean)
        if self.lock is not None:  # the folder is free once this run has stopped writing it
            self.lock.release()
            self.lock = None
        if self.run_folder is not None:  # the loggers are closed: nothing writes there now
            self.run_folder.release()
            self.run_folder = None
