"""Safe file handling for caches: atomic writes and a lock so that one process prepares a cache
while the others (e.g. the other DDP ranks on the node) wait for it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from pathlib import Path


def temporary_sibling(path: Path) -> Path:
    """A unique name next to `path` (same file system, so the final rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


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
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def exclusive_lock(directory: Path, name: str = ".lock"):
    """Hold an exclusive advisory lock on directory/name for the duration of the block."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def describe_missing(pattern: str, allowed: str) -> str:
    return (
        f"no local file matches '{pattern}' (resolved from {Path.cwd()}); "
        f"point data.data_files at existing {allowed} files"
    )
