"""One run per checkpoint folder: an exclusive lock on trainer.ckpt_dir, held for the whole run.

An advisory flock on the folder's .lock file that says who holds it (lock_file.py, shared with
the export's claim on its OUT_DIR): the kernel releases it when its holder exits in any way, kill
-9 included, so a killed run never blocks the next one, and a second run is refused naming the
first (host, pid, run name, since). Taking the lock is also the check that the folder can be
created and written (trainer.ckpt_dir a file, or not writable); check_checkpoint_folder looks
for the same before the model is built, dry runs included, writing nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

from flashtrain.checkpoint import lock_file
from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.checkpoint.writable_folder import (
    check_writable_folder,
    reason_of,
    unusable_folder,
)
from flashtrain.typed_config import ConfigError

log = logging.getLogger("flashtrain.checkpoint")

LOCK_FILE = ".lock"
CKPT_DIR, CHECKPOINTS = "trainer.ckpt_dir", "checkpoints"  # how a refused folder is named

_held: dict[Path, RunLock] = {}  # the folders this process holds, by resolved path


class CheckpointDirBusy(CheckpointError):
    """Another live run holds the checkpoint folder."""


def check_checkpoint_folder(root: str | os.PathLike) -> None:
    """At start, dry runs included, before the model is built: refuse a checkpoint folder that
    looking shows the lock could not be taken in (writable_folder.py), in acquire()'s words."""
    check_writable_folder(root, CKPT_DIR, CHECKPOINTS)


def holds_lock(root: str | os.PathLike) -> bool:
    """Whether this process holds the lock on checkpoint folder `root`."""
    return Path(root).resolve() in _held


def describe_holder(holder: dict) -> str:
    if not holder:
        return "another run (it has not written its name yet)"
    return (
        f"run '{holder.get('run', '?')}' (host {holder.get('host', '?')}, pid "
        f"{holder.get('pid', '?')}, since {holder.get('since', '?')})"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class RunLock:
    """The lock on checkpoint folder `root`; acquire() takes it (or refuses), release() lets go."""

    def __init__(self, root: str | os.PathLike, run_name: str):
        self.root = Path(root)
        self.run_name = run_name
        self._handle = None
        self._made_root = False  # this lock made the folder: an empty one goes on release

    def acquire(self, *, wait: bool = False) -> RunLock:
        """Take the lock: create the folder, open and lock its lock file, write who holds it.
        Raises ConfigError when the folder cannot be created or written, CheckpointDirBusy
        when another run holds it (with wait=True: waits for it instead)."""
        path = self.root / LOCK_FILE
        try:
            self._handle, unsupported = lock_file.lock(path, opener=self._open)
        except BlockingIOError:
            holder = describe_holder(lock_file.read_holder(path))
            if not wait:
                raise CheckpointDirBusy(
                    f"trainer.ckpt_dir {self.root} is in use by {holder}: two runs writing one "
                    f"checkpoint folder overwrite each other. Wait for it to end, give this run "
                    f"its own trainer.ckpt_dir, or pass trainer.wait_for_lock=true to start "
                    f"when it has ended"
                ) from None
            log.warning(
                "trainer.ckpt_dir %s is in use by %s; waiting for it to end "
                "(trainer.wait_for_lock)",
                self.root,
                holder,
            )
            self._handle, unsupported = lock_file.lock(path, blocking=True, opener=self._open)
        if unsupported:  # the lock file still names this run, and the folder is writable
            log.warning(
                "trainer.ckpt_dir %s: its file system has no file locks (%s); another run on "
                "this folder would not be noticed, so give each run its own",
                self.root,
                unsupported,
            )
        self._take_over()
        return self

    def _open(self, path: Path):
        try:
            if not self.root.exists():
                self.root.mkdir(parents=True, exist_ok=True)
                self._made_root = True
            return open(path, "a+")  # noqa: SIM115 - held until release()
        except OSError as e:
            raise self._unusable(e) from e

    def _take_over(self) -> None:
        """Holding the lock: say whose run left it, if one was killed, and write our name."""
        previous = lock_file.read_holder(self.root / LOCK_FILE)
        if previous.get("pid") and previous.get("pid") != os.getpid():
            alive = previous.get("host") != socket.gethostname() or _pid_alive(int(previous["pid"]))
            log.info(
                "trainer.ckpt_dir %s: taking over the lock of %s%s",
                self.root,
                describe_holder(previous),
                "" if alive else ", which is no longer running (killed?)",
            )
        try:
            lock_file.write_holder(self._handle, run=self.run_name)
        except OSError as e:  # the folder exists but takes no writes (read-only, full)
            self._close()
            raise self._unusable(e) from e
        _held[self.root.resolve()] = self

    def _unusable(self, error: OSError) -> ConfigError:
        """The refusal of a folder that failed its creation or first write: in the words of
        the start-up check (writable_folder.py) that looked at it before the model was built."""
        return unusable_folder(CKPT_DIR, self.root, reason_of(error), CHECKPOINTS)

    def release(self) -> None:
        """Let go: delete the lock file while still holding it (a run waiting on it then
        finds it gone and locks a new one), then close it, which releases the flock."""
        if self._handle is None:
            return
        _held.pop(self.root.resolve(), None)
        handle, self._handle = self._handle, None
        lock_file.release(self.root / LOCK_FILE, handle)
        if self._made_root:  # a run refused before its first checkpoint leaves no folder
            with contextlib.suppress(OSError):
                self.root.rmdir()  # only when empty

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file releases the flock
            self._handle = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
