"""One run per run folder (hydra.run.dir: metrics.jsonl, train.log, config.yaml, run.json), the
rule the checkpoint folder has (flashtrain/checkpoint/run_lock.py), so two runs never mix their
records there.

Rank 0 claims the folder before the run logs its summary, in two checks:

- A live run holds an advisory lock on the folder's .run.lock for its whole run (lock_file.py:
  the kernel releases it when the holder exits in any way, kill -9 included). A second live run
  is refused naming the folder and the first (host, pid, run name, since), or waits for it to
  end with trainer.wait_for_lock=true, as for the checkpoint folder.
- The folder belongs to the run whose checkpoint folder its run.json records ("ckpt_dir";
  relative to the run folder when inside it, so a run folder moved whole stays its run's). A
  start with another checkpoint folder is another run, refused even when the first has ended.
  A start with the same one continues that run: a resume, a rerun after a kill, a restarted
  job (job_run.py reuses the folder on purpose); a fresh start over its checkpoints is refused
  by the checkpoint folder's own rule (run_state.py). A run.json that records no checkpoint
  folder (written before it was recorded) names no owner.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from flashtrain.checkpoint import lock_file
from flashtrain.checkpoint.run_info import read_run_info
from flashtrain.checkpoint.run_lock import describe_holder
from flashtrain.typed_config import ConfigError

log = logging.getLogger("flashtrain")

RUN_LOCK_FILE = ".run.lock"  # not the checkpoint folder's .lock: the two may be one folder
CKPT_DIR_KEY = "ckpt_dir"  # run.json: the checkpoint folder of the run that owns the folder
_MIXED = "two runs in one run folder mix their metrics.jsonl, train.log and config.yaml"


class RunFolderTaken(ConfigError):
    """The run folder is another run's: one alive in it, or one that checkpoints elsewhere."""


def ckpt_dir_record(run_dir: str | os.PathLike, ckpt_root: str | os.PathLike) -> str:
    """What run.json records of the run's checkpoint folder: its path relative to the run folder
    when inside it (the default <run dir>/checkpoints), else absolute."""
    run_dir, ckpt_root = Path(run_dir).resolve(), Path(ckpt_root).resolve()
    if ckpt_root.is_relative_to(run_dir):
        return str(ckpt_root.relative_to(run_dir))
    return str(ckpt_root)


def recorded_ckpt_dir(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint folder of the run that owns `run_dir` (its run.json's record), or None."""
    recorded = read_run_info(run_dir).get(CKPT_DIR_KEY)
    if not isinstance(recorded, str) or not recorded:
        return None
    return (Path(run_dir) / recorded).resolve()  # an absolute record stays itself


class RunFolderClaim:
    """This run's claim on its run folder: acquire() takes it (or refuses), release() lets go."""

    def __init__(self, run_dir: str | os.PathLike, ckpt_root: str | os.PathLike, run_name: str):
        self.run_dir = Path(run_dir)
        self.ckpt_root = Path(ckpt_root)
        self.run_name = run_name
        self.record = ckpt_dir_record(self.run_dir, self.ckpt_root)  # run.json's "ckpt_dir"
        self._handle = None
        self._made = False  # this claim made the folder: it goes on release if left empty

    def acquire(self, *, wait: bool = False) -> RunFolderClaim:
        """Lock the folder's .run.lock (creating the folder), then check whose records it holds.
        RunFolderTaken when another live run holds it (unless wait) or another run owns it;
        ConfigError when the folder cannot be created or written."""
        path = self.run_dir / RUN_LOCK_FILE
        try:
            self._handle, unsupported = lock_file.lock(path, opener=self._open)
        except BlockingIOError:
            holder = describe_holder(lock_file.read_holder(path))
            if not wait:
                raise RunFolderTaken(
                    f"run folder {self.run_dir} (hydra.run.dir) is in use by {holder}: {_MIXED}. "
                    f"Give this run its own hydra.run.dir, or pass trainer.wait_for_lock=true "
                    f"to start when that run has ended"
                ) from None
            log.warning(
                "run folder %s is in use by %s; waiting for it to end (trainer.wait_for_lock)",
                self.run_dir, holder,
            )  # fmt: skip
            self._handle, unsupported = lock_file.lock(path, blocking=True, opener=self._open)
        if unsupported:
            log.warning(
                "run folder %s: its file system has no file locks (%s); another run in this "
                "folder would not be noticed while both run, so give each run its own",
                self.run_dir, unsupported,
            )  # fmt: skip
        try:
            self._check_owner()
            lock_file.write_holder(self._handle, run=self.run_name)
        except BaseException:
            self.release()
            raise
        return self

    def _open(self, path: Path):
        try:
            if not self.run_dir.exists():
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self._made = True
            return open(path, "a+")  # noqa: SIM115 - held until release()
        except OSError as e:
            raise ConfigError(
                f"run folder {self.run_dir} (hydra.run.dir) cannot be created or written "
                f"({e.strerror}): the run's metrics, log and config go there; point "
                f"hydra.run.dir at a folder this run can write"
            ) from e

    def _check_owner(self) -> None:
        owner = recorded_ckpt_dir(self.run_dir)
        if owner is None or owner == self.ckpt_root.resolve():
            return
        raise RunFolderTaken(
            f"run folder {self.run_dir} (hydra.run.dir) holds the records of another run, whose "
            f"checkpoints are in {owner} (its run.json), while this run's are in "
            f"{self.ckpt_root.resolve()}: {_MIXED}. Give this run its own hydra.run.dir, or set "
            f"trainer.ckpt_dir={owner} to continue that run"
        )

    def release(self) -> None:
        """Let go: the lock file deleted while still held, then closed (lock_file.release)."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        lock_file.release(self.run_dir / RUN_LOCK_FILE, handle)
        if self._made:  # a run refused before writing anything leaves no folder
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only when empty
