"""A run's state beyond its weights, and its checkpoints: what a save writes besides the model and
optimizer (step, tokens seen, lr schedule, grad scaler, per-rank RNG and data positions), and how
a resume (trainer.resume) restores all of it, refusing a checkpoint this run cannot continue."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint import read as ckpt
from flashtrain.checkpoint.async_write import BackgroundSaves
from flashtrain.checkpoint.write import save_checkpoint, set_aside_newer_checkpoints
from flashtrain.collectives import broadcast_object, gather_objects, on_rank_0
from flashtrain.data.stream_identity import OtherDataError
from flashtrain.train.config import ConfigError, TrainConfig, config_dict, config_yaml
from flashtrain.train.distributed import DistEnv, is_sharded
from flashtrain.train.optim import (
    apply_group_settings,
    describe_regrouping,
    describe_schedule_changes,
    follow_schedule_from,
    group_settings,
    schedule_settings,
)

log = logging.getLogger("flashtrain")

# What the data streams and RNG positions of a checkpoint are split by: a resume must match it.
# (key in the trainer state, the setting that sets it, the argument to pass instead)
PER_PROCESS_SPLIT = (
    ("world_size", "world size (processes)", "--nproc_per_node matching {}"),
    ("context_parallel", "trainer.context_parallel", "trainer.context_parallel={}"),
)


@dataclass
class RunState:
    """The run's counters: what a checkpoint saves besides the model and optimizer."""

    step: int = 0
    tokens_seen: int = 0
    skipped_in_a_row: int = 0  # non-finite steps skipped in a row (trainer.on_nonfinite=skip)
    wandb_id: str | None = None  # the wandb run this one continues
    last_ckpt: Path | None = None  # the newest checkpoint written or resumed from


@dataclass
class RunCheckpoints:
    """Saves the run into its checkpoint folder and restores it from a checkpoint."""

    cfg: TrainConfig
    env: DistEnv
    root: Path  # trainer.ckpt_dir, or <run dir>/checkpoints
    strategy: str
    cp_size: int
    run_name: str
    num_params: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    data: Any
    state: RunState
    # This start continues its cluster job's run folder (a restart or requeue: job_run.py): it
    # resumes from that folder's newest intact checkpoint whatever trainer.resume says. Names
    # the job and its restart, for the log line; None for any other start.
    continued_job: str | None = None
    # trainer.async_checkpoint: the saves written in the background (made at the first save)
    background: BackgroundSaves | None = None

    @property
    def sharded(self) -> bool:
        """FSDP2's runs (fsdp, hsdp) write and read the same DCP checkpoints; a resume may switch
        between them (the data and RNG positions are split by the world and cp sizes alone)."""
        return is_sharded(self.strategy)

    # ------------------------------------------------------------------------------- save

    def save(self, data_state: dict | None) -> Path:
        """Checkpoint the run at its current step (a collective: every rank calls it);
        data_state: this rank's stream position after the batches consumed."""
        env, state = self.env, self.state
        rng = gather_objects(rng_state())
        data = gather_objects(data_state)
        trainer_state = None
        if env.is_main:
            trainer_state = {
                "step": state.step,
                "tokens_seen": state.tokens_seen,
                "scheduler": self.scheduler.state_dict(),
                "schedule": schedule_settings(self.cfg.optim, self.cfg.trainer.max_steps),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": rng,
                "data": data,
                "world_size": env.world_size,
                "context_parallel": self.cp_size,
                "skipped_in_a_row": state.skipped_in_a_row,
                "wandb_id": state.wandb_id,
            }
        meta = {
            "time": datetime.datetime.now().isoformat(timespec="seconds"),
            "world_size": env.world_size,
            "context_parallel": self.cp_size,
            "strategy": self.strategy,
            "params": self.num_params,
            "tokens_seen": state.tokens_seen,
            "model_config": config_dict(self.cfg)["model"],
            "run_name": self.run_name,
            "tokenizer": ckpt.tokenizer_record(self.data),  # checked when one is rebuilt
        }
        what = dict(
            model=self.model,
            optimizer=self.optimizer,
            trainer_state=trainer_state,
            meta=meta,
            config_yaml=config_yaml(self.cfg) if env.is_main else "",
            sharded=self.sharded,
            keep_last=self.cfg.trainer.keep_last,
        )
        if self.cfg.trainer.async_checkpoint:  # the folder it gets once written (async_write.py)
            if self.background is None:
                timeout = datetime.timedelta(seconds=self.cfg.trainer.dist_timeout_s)
                self.background = BackgroundSaves(timeout)
            path = self.background.start(self.root, state.step, **what)  # the previous one first
            self._note_background_save()
            return path
        path = save_checkpoint(self.root, state.step, **what)
        state.last_ckpt = path
        log.info("checkpoint: %s", path)
        return path

    def poll(self) -> None:
        """At a step boundary: a save written in the background on every rank goes into place
        (a collective while one is in flight; nothing to do otherwise)."""
        if self.background is not None:
            self.background.poll()
            self._note_background_save()

    def wait(self) -> None:
        """The save in flight written and put into place (the end of a run, a pre-emption); a
        failure in the background is raised here as a synchronous save raises it."""
        if self.background is not None:
            self.background.wait()
            self._note_background_save()

    def close(self) -> None:
        """An error path: a save in flight is given up, its writer stopped and its partial
        folder removed (not a collective: the other ranks may be gone)."""
        if self.background is not None:
            self.background.close()

    def _note_background_save(self) -> None:
        if self.background.newest is not None:  # the last checkpoint is a complete one
            self.state.last_ckpt = self.background.newest

    # ----------------------------------------------------------------------------- resume

    def resume(self) -> bool:
        """Restore the newest / the given checkpoint (trainer.resume): model, optimizer,
        schedule, grad scaler, counters, data position and RNG. Returns False when there is
        nothing to resume (a fresh run)."""
        t = self.cfg.trainer
        target = self._resume_target()
        if target is None:
            if t.resume == "auto":
                log.info("trainer.resume=auto: no checkpoint in %s, starting fresh", self.root)
            return False
        self._refuse_regrouping(target)  # before anything is loaded
        settings = group_settings(self.optimizer)  # this run's, which the load overwrites
        saved, _ = ckpt.load_checkpoint(
            target,
            model=self.model,
            optimizer=self.optimizer,
            sharded=self.sharded,
            allow_unverified=t.allow_unverified_checkpoint,
            model_config=config_dict(self.cfg)["model"],
        )
        current = {"world_size": self.env.world_size, "context_parallel": self.cp_size}
        for key, setting, fix in PER_PROCESS_SPLIT:
            was = int(saved.get(key, 1))
            if was != current[key]:
                raise ckpt.CheckpointError(
                    f"checkpoint {target} was written with {setting} {was} and this run has "
                    f"{current[key]}; the data streams and RNG positions are split by it, so "
                    f"resume with {fix.format(was)}"
                )
        state = self.state
        state.step = int(saved["step"])
        state.tokens_seen = int(saved.get("tokens_seen", 0))
        self._restore_schedule(saved, target)
        for change in apply_group_settings(self.optimizer, settings):
            log.info("%s (applied at resume)", change)
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        state.skipped_in_a_row = int(saved.get("skipped_in_a_row", 0))
        # The wandb run continues only when this is the same run (its own checkpoints folder);
        # a checkpoint resumed elsewhere starts a new wandb run.
        same_run = target.resolve().parent == self.root.resolve()
        state.wandb_id = saved.get("wandb_id") if same_run else None
        self._restore_data_position(saved["data"][self.env.rank], target)
        set_rng_state(saved["rng"][self.env.rank])
        self._set_aside_newer_checkpoints()  # the resume accepted: the run's line goes on here
        state.last_ckpt = target
        log.info("resumed from %s at step %d", target, state.step)
        return True

    def _set_aside_newer_checkpoints(self) -> None:
        """A resume from an older step (a branch; or a newer checkpoint passed over as damaged)
        continues the run from there: this folder's checkpoints newer than the resumed step are
        moved aside into its abandoned/ folder, kept whole (write.set_aside_newer_checkpoints),
        so no prune and no "newest" lookup after this takes them for the run's, a restart
        before the first save included. Rank 0, holding the folder's lock; every rank learns
        whether it failed."""
        set_aside = lambda: set_aside_newer_checkpoints(self.root, self.state.step)
        on_rank_0(set_aside, (OSError,), is_main=self.env.is_main)

    def _resume_target(self) -> Path | None:
        """The checkpoint trainer.resume names (rank 0 looks, every rank gets its answer); in a
        restart of a job, the newest intact one of the job's run when it has one."""
        t = self.cfg.trainer
        target = error = None
        if self.env.is_main:
            try:
                target = self._job_restart_target()
                if target is None:
                    target = ckpt.resolve_resume(
                        t.resume, self.root, allow_unverified=t.allow_unverified_checkpoint
                    )
                if target is None and t.resume is None:
                    existing = ckpt.find_checkpoints(self.root)
                    if existing:
                        raise ConfigError(
                            f"{self.root} already holds checkpoints (newest "
                            f"{existing[-1].path.name}); pass trainer.resume=auto to continue "
                            f"from it, or use a new run directory / trainer.ckpt_dir"
                        )
            except (ckpt.CheckpointError, ConfigError) as e:
                error = e
        error, target = broadcast_object((error, str(target) if target else None))
        if error is not None:
            raise error
        return Path(target) if target else None

    def _job_restart_target(self) -> Path | None:
        """A restart of a job continues its own run: the newest intact checkpoint in the run's
        checkpoint folder (damaged newer ones passed over, as trainer.resume=auto does), else
        None (what trainer.resume says holds then: killed before its first checkpoint)."""
        if self.continued_job is None:
            return None
        t = self.cfg.trainer
        target = ckpt.resolve_resume(
            "auto", self.root, allow_unverified=t.allow_unverified_checkpoint
        )
        if target is None:
            then = f"trainer.resume={t.resume}" if t.resume else "a fresh start"
            log.info(
                "%s continues its run: no intact checkpoint in %s yet, so %s",
                self.continued_job, self.root, then,
            )  # fmt: skip
        else:
            log.info(
                "%s continues its run: resuming from %s, the newest intact checkpoint of the "
                "job's run (its run folder records the job; no trainer.resume needed)",
                self.continued_job, target,
            )  # fmt: skip
        return target

    def _restore_data_position(self, data_state: dict, target: Path) -> None:
        """The saved stream position, unless it was saved on other data: then refuse, or with
        trainer.resume_other_data read this data from its start (a position counted in other
        windows, documents or samples means nothing here)."""
        try:
            self.data.load_state_dict(data_state)
        except OtherDataError as e:
            if not self.cfg.trainer.resume_other_data:
                raise ConfigError(
                    f"resuming {target} on other data ({e}): its stream position counts in the "
                    f"data it was saved on. Set the data back to resume exactly, or pass "
                    f"trainer.resume_other_data=true to keep the weights, optimizer and step and "
                    f"read this data from its start"
                ) from e
            log.warning(
                "trainer.resume_other_data: the data differs from %s's (%s); its weights, "
                "optimizer and step are kept and this data is read from its start",
                target,
                e,
            )
        except ValueError as e:  # the stream cannot continue as this run's data is set up
            raise ckpt.CheckpointError(f"checkpoint {target}: {e}") from e

    def _refuse_regrouping(self, target: Path) -> None:
        """Refuse a resume whose optimizer settings group the parameters otherwise than the
        checkpoint's config.yaml records (optim.GROUPING_KEYS): its optimizer state is laid out
        in its own groups. A checkpoint without a config.yaml is not compared."""
        config = target / ckpt.CONFIG
        if not config.is_file():
            return
        saved = OmegaConf.to_container(OmegaConf.load(config), resolve=True).get("optim") or {}
        changes = describe_regrouping(saved, self.cfg.optim)
        if changes:
            what = "; ".join(f"{key}: {was} -> {now}" for key, was, now in changes)
            keep = " ".join(f"{key}={was}" for key, was, _ in changes)
            raise ConfigError(
                f"resuming {target} with other optimizer groups: {what}. Its "
                f"optimizer state is kept in the groups it was saved in (which parameters take "
                f"weight decay), so a resume cannot regroup it: resume with {keep}, or start a "
                f"new run from its weights with model.init_from={target} (a fresh optimizer "
                f"and schedule)"
            )

    def _restore_schedule(self, saved: dict, target: Path) -> None:
        """The saved lr schedule, unless this run's settings give a different one: then refuse,
        or with trainer.allow_schedule_change follow the new one from the resumed step on."""
        cfg = self.cfg
        self.scheduler.load_state_dict(saved["scheduler"])
        was = saved.get("schedule")  # absent in checkpoints written before it was saved
        current = schedule_settings(cfg.optim, cfg.trainer.max_steps)
        if was is None or was == current:
            return
        pinned = cfg.optim.decay_steps is not None
        changes = "; ".join(describe_schedule_changes(was, current, pinned))
        next_step = self.state.step + 1
        if not cfg.trainer.allow_schedule_change:
            keep = "set them back"
            if not pinned and was["decay_steps"] != current["decay_steps"]:
                keep += (
                    f" (to train longer on the saved schedule, pin its end: "
                    f"optim.decay_steps={was['decay_steps']})"
                )
            raise ConfigError(
                f"resuming {target} with a different learning-rate schedule: {changes}. Every "
                f"lr from step {next_step} on would change. To keep the saved schedule, {keep}; "
                f"to follow the new one from step {next_step}, pass "
                f"trainer.allow_schedule_change=true"
            )
        follow_schedule_from(self.scheduler, self.state.step, current["lr"])
        log.warning(
            "trainer.allow_schedule_change: %s; the new schedule holds from step %d "
            "(lr %.3e), as if the run had followed it from the start",
            changes,
            next_step,
            self.scheduler.get_last_lr()[0],
        )


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU and the current CUDA device)."""
    import random

    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
