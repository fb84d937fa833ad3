"""Metric sinks, used on rank 0 only: a JSON-lines file in the run directory, wandb, TensorBoard.
Every sink gets the same names (flashtrain/train/metric_names.py).

`logger=wandb` runs the real wandb library: offline by default (nothing needs a login or the
network; `wandb sync <run>/wandb/offline-run-*` uploads later), `logger.mode=online|disabled`, and
the WANDB_MODE environment variable, when set, is the default mode. `logger=tensorboard` writes
TensorBoard event files to <run dir>/tensorboard/ (or logger.dir): `tensorboard --logdir <it>`.
`logger=none` keeps only the JSON-lines file.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from flashtrain.checkpoint.writable_folder import check_writable_folder

log = logging.getLogger("flashtrain")

TENSORBOARD_DIR = "tensorboard"  # in the run dir, unless logger.dir names another folder


class MetricSink:
    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass


class JsonlSink(MetricSink):
    """One JSON object per line: {"step": N, "train/loss": ..., ...}; appended, flushed each
    time. A run resumed at step S into its own file first drops the rows past S (a killed
    start logged them, and the steps are trained again), so the file has each step once."""

    def __init__(self, path: str | os.PathLike, *, resumed_from: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resumed_from:
            _drop_rows_past(self.path, resumed_from)
        self._file = open(self.path, "a")

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": int(step)}
        for k, v in metrics.items():
            row[k] = None if isinstance(v, float) and not math.isfinite(v) else v
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        except OSError as e:  # a file's write names no file: this one does (a full disk: exit 4)
            raise OSError(e.errno, e.strerror, str(self.path)) from e

    def finish(self) -> None:
        self._file.close()


def _drop_rows_past(path: Path, step: int) -> None:
    """Rewrite `path` without its rows of steps after `step` (to a temporary name, then
    renamed: a kill meanwhile leaves the old file whole). A line that does not parse (the half
    line of a kill mid-write) goes too."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and int(row.get("step", 0)) <= step:
            kept.append(line)
    if len(kept) == len(lines):
        return
    log.info(
        "%s: dropped %d row(s) past step %d (logged before the restart; those steps are trained "
        "again)", path.name, len(lines) - len(kept), step,
    )  # fmt: skip
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text("".join(line + "\n" for line in kept))
    os.replace(temporary, path)


class WandbSink(MetricSink):
    def __init__(
        self,
        logger_cfg: Any,
        *,
        wandb_dir: Path,
        run_name: str,
        config: dict,
        resume_id: str | None = None,
    ):
        import wandb

        mode = logger_cfg.mode or os.environ.get("WANDB_MODE") or "offline"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=logger_cfg.project,
            entity=logger_cfg.entity,
            name=logger_cfg.run_name or run_name,
            group=logger_cfg.group,
            tags=list(logger_cfg.tags) or None,
            notes=logger_cfg.notes,
            dir=str(wandb_dir),
            mode=mode,
            config=config,
            id=resume_id,
            resume="allow" if resume_id else None,
            settings=wandb.Settings(console="off", quiet=True, x_disable_stats=True),
        )
        self.id = getattr(self.run, "id", None)
        self.dir = getattr(self.run, "dir", None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=int(step))

    def finish(self) -> None:
        self.run.finish()


class TensorBoardSink(MetricSink):
    """Real TensorBoard event files (torch.utils.tensorboard), one scalar series per metric name,
    flushed at each log call so that a running `tensorboard --logdir` sees every interval."""

    def __init__(self, log_dir: str | os.PathLike, *, resumed_from: int = 0):
        # needs the tensorboard package: LoggerConfig refuses logger=tensorboard without it
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(log_dir)
        # A resumed run logs again the steps after its checkpoint: purge_step hides what the
        # interrupted run had written past the checkpoint, as metrics.jsonl's readers do.
        purge_step = resumed_from + 1 if resumed_from else None
        self.writer = SummaryWriter(str(self.dir), purge_step=purge_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=int(step))
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class Loggers(MetricSink):
    """All sinks of this process (none on ranks other than 0)."""

    def __init__(self, sinks: list[MetricSink] | None = None):
        self.sinks = sinks or []

    @property
    def wandb(self) -> WandbSink | None:
        return next((s for s in self.sinks if isinstance(s, WandbSink)), None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for s in self.sinks:
            s.log(metrics, step)

    def finish(self) -> None:
        for s in self.sinks:
            try:
                s.finish()
            except Exception as e:  # noqa: BLE001 - a logger must not hide the run's own outcome
                log.warning("closing %s failed: %s", type(s).__name__, e)
        self.sinks = []


def logger_dir(cfg: Any, run_dir: Path) -> Path | None:
    """The folder logger=wandb / tensorboard writes: logger.dir, else its place in the run
    folder; None for logger=none (metrics.jsonl alone)."""
    if cfg.logger.name == "none":
        return None
    if cfg.logger.dir:
        return Path(cfg.logger.dir)
    return run_dir / TENSORBOARD_DIR if cfg.logger.name == "tensorboard" else run_dir


def check_logger_dir(cfg: Any, run_dir: Path) -> None:
    """At start, dry runs included: the logger's folder can be created and written, checked as
    trainer.ckpt_dir is (flashtrain/checkpoint/writable_folder.py), not found unusable when
    the first metrics are logged."""
    folder = logger_dir(cfg, run_dir)
    if folder is not None:
        check_writable_folder(folder, "logger.dir", f"logger={cfg.logger.name}'s files")


def build_loggers(
    cfg: Any,
    *,
    run_dir: Path,
    run_name: str,
    config: dict,
    is_main: bool,
    resume_id: str | None = None,
    resumed_from: int = 0,
) -> Loggers:
    """resumed_from: the checkpoint step a resumed run continues from (0: a fresh run)."""
    if not is_main:
        return Loggers()
    sinks: list[MetricSink] = []
    if cfg.trainer.metrics_file:
        sinks.append(JsonlSink(run_dir / cfg.trainer.metrics_file, resumed_from=resumed_from))
    folder = logger_dir(cfg, run_dir)
    if cfg.logger.name == "wandb":
        sinks.append(
            WandbSink(
                cfg.logger, wandb_dir=folder, run_name=run_name, config=config, resume_id=resume_id
            )
        )
    elif cfg.logger.name == "tensorboard":
        sinks.append(TensorBoardSink(folder, resumed_from=resumed_from))
    return Loggers(sinks)
