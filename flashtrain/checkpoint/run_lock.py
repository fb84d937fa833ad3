"""One run per checkpoint folder: an exclusive lock on trainer.ckpt_dir, held for the whole run.

The same mechanism as the token caches' lock (flashtrain/data/files.py): an advisory
`fcntl.flock` on a file in the folder, which the kernel releases when its holder exits in any
way, kill -9 included, so a killed run never leaves a lock that blocks the next one. This lock
also says who holds it: the holder writes its host, pid, run name and start time into the lock
file, so a second run is refused naming the first (the cache lock, held around one block, names
nobody). Taking the lock is also the start-up check that the folder can be created and written
(trainer.ckpt_dir a file, or not writable). Releasing deletes the lock file while still holding
it; a run that was waiting on the deleted file notices and locks the new one.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.typed_config import ConfigError

log = logging.getLogger("flashtrain.checkpoint")

LOCK_FILE = ".lock"
# flock's answers on file systems without locks (some network mounts)
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)

_held: dict[Path, RunLock] = {}  # the folders this process holds, by resolved path


class CheckpointDirBusy(CheckpointError):
    """Another live run holds the checkpoint folder."""


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
        told = False
        while True:
            self._open()
            try:
                fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._read_holder()
                if not wait:
                    self._close()
                    raise CheckpointDirBusy(
                        f"trainer.ckpt_dir {self.root} is in use by {describe_holder(holder)}: "
                        f"two runs writing one checkpoint folder overwrite each other. Wait "
                        f"for it to end, give this run its own trainer.ckpt_dir, or pass "
                        f"trainer.wait_for_lock=true to start when it has ended"
                    ) from None
                if not told:
                    log.warning(
                        "trainer.ckpt_dir %s is in use by %s; waiting for it to end "
                        "(trainer.wait_for_lock)",
                        self.root,
                        describe_holder(holder),
                    )
                    told = True
                fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in UNSUPPORTED:
                    raise
                log.warning(
                    "trainer.ckpt_dir %s: its file system has no file locks (%s); another run "
                    "on this folder would not be noticed, so give each run its own",
                    self.root,
                    e.strerror,
                )
                break  # the lock file still names this run, and the folder is writable
            if self._still_the_lock_file():
                break
            self._close()  # its holder removed it on release: lock the new one
        self._take_over()
        return self

    def _still_the_lock_file(self) -> bool:
        """Whether the locked file is still the folder's lock file (a releasing holder deletes
        it; a run that locked the deleted file must lock the one made after)."""
        try:
            return os.stat(self.root / LOCK_FILE).st_ino == os.fstat(self._handle.fileno()).st_ino
        except FileNotFoundError:
            return False

    def _open(self) -> None:
        try:
            if not self.root.exists():
                self.root.mkdir(parents=True, exist_ok=True)
                self._made_root = True
            self._handle = open(self.root / LOCK_FILE, "a+")  # noqa: SIM115 - held until release()
        except OSError as e:
            if isinstance(e, FileExistsError | NotADirectoryError):
                what = "is not a directory (a file is in the way)"
            else:
                what = f"cannot be created or written ({e.strerror})"
            raise ConfigError(
                f"trainer.ckpt_dir {self.root} {what}: checkpoints need a folder this run can "
                f"create and write; point trainer.ckpt_dir at one"
            ) from e

    def _read_holder(self) -> dict:
        try:
            return json.loads((self.root / LOCK_FILE).read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def _take_over(self) -> None:
        """Holding the lock: say whose run left it, if one was killed, and write our name."""
        previous = self._read_holder()
        host = socket.gethostname()
        if previous.get("pid") and previous.get("pid") != os.getpid():
            alive = previous.get("host") != host or _pid_alive(int(previous["pid"]))
            log.info(
                "trainer.ckpt_dir %s: taking over the lock of %s%s",
                self.root,
                describe_holder(previous),
                "" if alive else ", which is no longer running (killed?)",
            )
        holder = {
            "host": host,
            "pid": os.getpid(),
            "run": self.run_name,
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        try:
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.write(json.dumps(holder) + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as e:  # the folder exists but takes no writes (read-only, full)
            self._close()
            raise ConfigError(
                f"trainer.ckpt_dir {self.root} cannot be written ({e.strerror}): checkpoints "
                f"need a folder this run can write; point trainer.ckpt_dir at one"
            ) from e
        _held[self.root.resolve()] = self

    def release(self) -> None:
        """Let go: delete the lock file while still holding it (a run waiting on it then
        finds it gone and locks a new one), then close it, which releases the flock."""
        if self._handle is None:
            return
        _held.pop(self.root.resolve(), None)
        try:
            with contextlib.suppress(OSError):
                (self.root / LOCK_FILE).unlink()
        finally:  # whatever interrupts the unlink (Ctrl-C), the flock goes
            self._close()
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
