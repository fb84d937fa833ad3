"""An exclusive lock on a named file that says who holds it: the run lock on a checkpoint folder
(run_lock.py) and an export's claim on its OUT_DIR (export_folder.py).

An advisory `fcntl.flock`, which the kernel releases when its holder exits in any way, kill -9
included, so a killed holder never blocks the next one. The holder writes who it is into the
file (JSON: host, pid, since, and what the caller adds) for the refusal of a second one. Release
deletes the file while still holding it: one that was waiting on the deleted file notices (its
inode is no longer the name's) and locks the new one.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO

# flock's answers on file systems without locks (some network mounts)
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def open_for_locking(lock: Path) -> IO[str]:
    return open(lock, "a+")  # noqa: SIM115 - held until release()


def lock(
    lock: Path, *, blocking: bool = False, opener: Callable[[Path], IO[str]] = open_for_locking
) -> tuple[IO[str], str | None]:
    """The open file `lock`, flock-ed by this process, and None; or, on a file system without
    locks, the open file unlocked and the reason (the caller warns in its own words).
    BlockingIOError (nothing left open) when another process holds it and not blocking."""
    while True:
        handle = opener(lock)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as e:
            if isinstance(e, BlockingIOError) or e.errno not in UNSUPPORTED:
                handle.close()
                raise
            return handle, e.strerror
        if _still_the_lock_file(lock, handle):
            return handle, None
        handle.close()  # its holder deleted it on release: lock the new one


def _still_the_lock_file(lock: Path, handle: IO[str]) -> bool:
    try:
        return os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def read_holder(lock: Path) -> dict:
    """What the holder of `lock` wrote about itself; {} when nothing (yet) or unreadable."""
    try:
        holder = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def write_holder(handle: IO[str], **extra) -> None:
    """Write this process (host, pid, since, and `extra`) into the locked file, durably."""
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **extra,
        "since": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(holder) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def release(lock: Path, handle: IO[str]) -> None:
    """Delete the lock file while still holding it, then close it (which releases the flock),
    whatever interrupts the delete (Ctrl-C)."""
    try:
        with contextlib.suppress(OSError):
            lock.unlink()
    finally:
        handle.close()
