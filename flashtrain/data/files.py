"""Safe file handling for caches: atomic writes and a lock so that one process prepares a cache
while the others (e.g. the other DDP ranks on the node) wait for it."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from flashtrain.file_integrity import fsync_directory

log = logging.getLogger("flashtrain.data")


def temporary_sibling(path: Path) -> Path:
    """A unique name next to `path` (same file system, so the final rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def remove_stale_temporaries(path: Path) -> None:
    """Delete what temporary_sibling(path) named in runs that were killed before they renamed
    or removed it (a kill -9 runs no cleanup). Only call it holding the lock that every writer
    of `path` holds: then no live process is still writing one of them."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.\d+-[0-9a-f]{{8}}\.tmp")
    if not path.parent.is_dir():
        return
    for entry in path.parent.iterdir():
        if pattern.fullmatch(entry.name):
            log.info("removing %s, left by an interrupted run", entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yield a temporary path to write a file or directory; on success rename it onto `path`,
    on failure delete it. Readers therefore never see a half-written cache."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)  # the rename itself survives a power cut
    except OSError as e:
        if e.errno is None or e.filename is not None:
            raise
        # a write's error names no file (a full disk: flashtrain/no_space.py); this one does
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def scratch_folder(path: Path):
    """Yield a new empty folder named temporary_sibling(path), for a library's intermediate
    files (`datasets`' cache-*.arrow), removed with everything in it when the block ends, also
    on failure; what a kill -9 left, remove_stale_temporaries(path) removes."""
    folder = temporary_sibling(Path(path))
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def exclusive_lock(directory: Path, name: str = ".lock", *, wait: bool = True):
    """Hold an exclusive advisory lock on directory/name for the duration of the block; yields
    True. wait=False does not wait for another holder: it yields False at once instead."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def describe_missing(pattern: str, allowed: str) -> str:
    return (
        f"no local file matches '{pattern}' (resolved from {Path.cwd()}); "
        f"point data.data_files at existing {allowed} files"
    )
