"""One run per trainer.ckpt_dir: a second run on the folder is refused at start naming the first
(or waits, when asked), a killed run's lock is taken over, another live run's partial checkpoint
is never cleared away; and a checkpoint folder that cannot be used is found before any step."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from config_testing import REPO, compose
from train_testing import HANG_GUARD_S, TINY, run_train, subprocess_env

from flashtrain.checkpoint.read import find_checkpoints
from flashtrain.checkpoint.run_lock import CheckpointDirBusy, RunLock, holds_lock
from flashtrain.train import main
from flashtrain.train.entry import EXIT_USER_ERROR

# A run that keeps training until it is stopped, and writes no checkpoint on its own.
ENDLESS = TINY + [
    "trainer.max_steps=100000",
    "trainer.eval_interval=0",
    "trainer.eval_at_end=false",
    "trainer.ckpt_interval=0",
    "optim.decay_steps=1000",  # the schedule pinned: a resume may change max_steps
]


def start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *args],
            cwd=cwd,
            env=subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(condition, what: str, process: subprocess.Popen, log: Path, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen; output:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def training(run_dir: Path):
    metrics = run_dir / "metrics.jsonl"
    return lambda: metrics.is_file() and metrics.read_text().count("\n") >= 1


@pytest.fixture
def first_run(tmp_path):
    """A run training on tmp_path/ckpt, stopped (killed) when the test ends."""
    ckpt_dir = tmp_path / "ckpt"
    log = tmp_path / "first.log"
    first = start(ENDLESS + [f"trainer.ckpt_dir={ckpt_dir}", "hydra.run.dir=first"], tmp_path, log)
    try:
        wait_for(training(tmp_path / "first"), "the first run's first step", first, log)
        yield first, ckpt_dir, log
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()


@pytest.mark.slow  # ~46 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_a_second_run_is_refused_naming_the_first_and_a_killed_run_is_taken_over(first_run):
    first, ckpt_dir, _ = first_run
    tmp_path = ckpt_dir.parent
    partial = ckpt_dir / ".step_000099.tmp"  # what a save of the first run is writing
    partial.mkdir()
    (partial / "model_optim.pt").write_bytes(b"half")
    args = TINY + [
        "trainer.max_steps=2",
        "trainer.ckpt_interval=1",
        f"trainer.ckpt_dir={ckpt_dir}",
        "trainer.resume=auto",
    ]
    second = run_train(args + ["hydra.run.dir=second"], cwd=tmp_path)
    out = second.stdout + second.stderr
    assert second.returncode == EXIT_USER_ERROR, out[-3000:]
    for piece in (
        f"trainer.ckpt_dir {ckpt_dir} is in use by run",
        f"host {socket.gethostname()}, pid {first.pid}, since 20",
        "trainer.wait_for_lock=true",
    ):
        assert piece in out, out[-3000:]
    assert "Traceback" not in out
    assert not (tmp_path / "second" / "metrics.jsonl").exists()  # refused before any step
    assert (partial / "model_optim.pt").read_bytes() == b"half"  # the live run's save untouched
    assert find_checkpoints(ckpt_dir) == []

    first.send_signal(signal.SIGKILL)  # no cleanup runs: its lock file names it still
    first.wait()
    third = run_train(args + ["hydra.run.dir=third"], cwd=tmp_path)
    out = third.stdout + third.stderr
    assert third.returncode == 0, out[-3000:]
    assert f"pid {first.pid}" in out and "which is no longer running" in out, out[-3000:]
    assert [c.step for c in find_checkpoints(ckpt_dir)] == [1, 2]
    assert not partial.exists()  # the killed run's partial save is cleared away now


@pytest.mark.slow  # two runs one after the other (~40 s on a busy 2-core machine)
def test_a_run_asked_to_wait_starts_when_the_first_has_ended(first_run):
    first, ckpt_dir, _ = first_run
    tmp_path = ckpt_dir.parent
    log = tmp_path / "second.log"
    args = ENDLESS[:-4] + [
        "trainer.max_steps=1",  # the first run's checkpoint is further: nothing left to train
        "optim.decay_steps=1000",
        f"trainer.ckpt_dir={ckpt_dir}",
        "trainer.resume=auto",
        "trainer.wait_for_lock=true",
        "hydra.run.dir=second",
    ]
    second = start(args, tmp_path, log)
    try:
        wait_for(lambda: "waiting for it to end" in log.read_text(), "waiting", second, log)
        assert second.poll() is None  # waiting, not training
        first.send_signal(signal.SIGTERM)  # pre-empted: it checkpoints and ends
        assert first.wait(timeout=HANG_GUARD_S) == 143
        assert second.wait(timeout=HANG_GUARD_S) == 0, log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
    (newest,) = find_checkpoints(ckpt_dir)
    assert f"resumed from {newest.path} at step {newest.step}" in log.read_text()


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_an_unusable_ckpt_dir_is_refused_before_the_first_step(
    where, tmp_path, monkeypatch, caplog
):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    ckpt_dir = blocker if where == "a file" else blocker / "checkpoints"
    cfg = compose(
        TINY
        + [
            "trainer.max_steps=2",
            "trainer.ckpt_interval=2",
            f"trainer.ckpt_dir={ckpt_dir}",
            "trainer.metrics_file=metrics.jsonl",
        ]
    )
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_USER_ERROR
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"trainer.ckpt_dir {ckpt_dir} is not a directory" in errors[0]
    assert not list(tmp_path.rglob("metrics.jsonl"))  # no step was taken
    assert blocker.read_text() == "not a folder"


class _ReadOnly:
    """A lock file on a read-only file system: it opens, but takes no writes."""

    def __init__(self, handle):
        self.handle = handle

    def write(self, text):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    def __getattr__(self, name):
        return getattr(self.handle, name)


@pytest.mark.parametrize("how", ["EACCES", "EROFS"])
def test_an_unwritable_ckpt_dir_is_refused_before_the_first_step(
    how, tmp_path, monkeypatch, caplog
):
    """The tests run as root, which may write anywhere: the lock file's open (EACCES: no write
    permission on the folder) or its first write (EROFS: a read-only mount) fails instead."""
    import builtins

    import flashtrain.checkpoint.run_lock as run_lock

    monkeypatch.chdir(tmp_path)
    ckpt_dir = tmp_path / "ckpts"

    def unwritable(path, *args, **kwargs):
        if Path(path).parent != ckpt_dir:
            return builtins.open(path, *args, **kwargs)
        if how == "EACCES":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return _ReadOnly(builtins.open(path, *args, **kwargs))

    monkeypatch.setattr(run_lock, "open", unwritable, raising=False)
    cfg = compose(TINY + ["trainer.max_steps=2", f"trainer.ckpt_dir={ckpt_dir}",
                          "trainer.metrics_file=metrics.jsonl"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_USER_ERROR
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    reason = "Permission denied" if how == "EACCES" else "Read-only file system"
    assert len(errors) == 1 and f"trainer.ckpt_dir {ckpt_dir} cannot be" in errors[0], errors
    assert f"written ({reason})" in errors[0], errors
    assert not list(tmp_path.rglob("metrics.jsonl"))  # no step was taken


def test_the_lock_names_its_holder_and_goes_with_it(tmp_path):
    root = tmp_path / "ckpts"
    with RunLock(root, "first"):
        assert holds_lock(root)
        with pytest.raises(CheckpointDirBusy, match=rf"run 'first' \(host .*, pid {os.getpid()}"):
            RunLock(root, "second").acquire()
    assert not holds_lock(root) and not root.exists()  # the folder it made, empty: gone
    with RunLock(root, "third"):
        pass


def test_a_file_system_without_locks_is_used_with_a_warning(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with RunLock(tmp_path / "ckpts", "run"):
        assert holds_lock(tmp_path / "ckpts")
    assert "has no file locks" in caplog.text
