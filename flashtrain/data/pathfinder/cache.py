"""The Pathfinder image cache on disk, generated so that an interruption loses (almost) nothing.

One cache per (resolution, contour length, count, seed, generator version): a directory
<root>/pathfinder/<name>/ with images.npy (uint8 (N, R, R)), labels.npy (int64 (N,)) and
meta.json, opened memory-mapped by load_or_generate (dataset.py wraps it as a dataset).
It is built in a work directory
.<name>.partial/ beside it: both arrays preallocated at full size and filled a chunk of
CHUNK_SIZE images at a time by the worker processes, plus progress.json, the chunks that are
safely on disk (the arrays are flushed before the list is replaced, atomically; at least every
SAVE_EVERY_S seconds and whenever the run stops). A run that is stopped (Ctrl-C, SIGTERM, an
error, kill -9) leaves the work directory; the next run with the same settings continues from its
finished chunks, and since every image comes from its own random stream the result is
bit-identical to an uninterrupted run. When every chunk is in, meta.json is written and the work
directory is renamed into place.

The earlier format generated into .<name>.<pid>-<id>.tmp directories that a killed run left
behind (gigabytes); they are deleted here whenever nobody holds their lock. Work directories of
other settings are kept (they continue when those settings run again) and named in the log.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np

from flashtrain.data.files import atomic_path, exclusive_lock, remove_stale_temporaries
from flashtrain.data.pathfinder.generator import (
    GENERATOR_VERSION,
    check_contour_length,
    check_workers_may_start,
    chunk_tasks,
    run_chunks,
)
from flashtrain.file_integrity import fsync_directory
from flashtrain.no_space import free_space, no_space_errno, no_space_named, shortage

log = logging.getLogger("flashtrain.data")

CHUNK_SIZE = 64  # images per work item and per progress entry
SAVE_EVERY_S = 10.0  # the most generation time a kill -9 can lose (plus the chunks in flight)
PROGRESS = "progress.json"
META = "meta.json"
_NAME = r"pathfinder\d+-len\d+-n\d+-seed\d+-v\d+"
_OLD_TEMPORARY = re.compile(rf"\.({_NAME})\.\d+-[0-9a-f]{{8}}\.tmp")
_WORK = re.compile(rf"\.({_NAME})\.partial")


def pathfinder_cache_dir(
    root: Path, resolution: int, contour_length: int, num: int, seed: int
) -> Path:
    name = f"pathfinder{resolution}-len{contour_length}-n{num}-seed{seed}-v{GENERATOR_VERSION}"
    return Path(root) / "pathfinder" / name


def _meta(resolution, contour_length, num, seed) -> dict:
    return {
        "resolution": resolution,
        "contour_length": contour_length,
        "num": num,
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
    }


def load_or_generate(
    root: Path,
    resolution: int,
    contour_length: int,
    num: int,
    seed: int,
    *,
    num_workers: int | None = None,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Memory-mapped (images (N, R, R) uint8, labels (N,) int64), generated on the first call
    (continuing an interrupted generation of the same settings): in this process (num_workers
    None or 1) or in num_workers worker processes (see generator.generate_pathfinder)."""
    check_contour_length(resolution, contour_length)  # before any folder or lock is made
    if num < 1:
        raise ValueError(f"pathfinder num_samples must be >= 1, got {num}")
    directory = pathfinder_cache_dir(root, resolution, contour_length, num, seed)
    meta = _meta(resolution, contour_length, num, seed)
    no_space = functools.partial(_no_space_message, Path(root), directory)
    with exclusive_lock(directory.parent, f".{directory.name}.lock"):
        clean_up_after_interrupted_runs(directory)
        if not directory.exists():
            with no_space_named(no_space):
                generate_cache(directory, meta, num_workers=num_workers, progress=progress)
    return _open_cache(directory, meta)


def _no_space_message(root: Path, directory: Path, code: int, refused: Path | None) -> str:
    """The line for a generation that ran out of space (or quota): what of it is kept."""
    work = work_dir(directory)
    kept = (
        f"the images generated so far are kept in {work} (the next run with the same settings "
        "continues from them)"
        if work.exists()
        else "nothing of it was kept"
    )
    return (
        f"{shortage(code)} generating the Pathfinder cache {directory}: {kept}; "
        f"{free_space(code, root)} (data.cache_dir), or set data.cache_dir to a folder on "
        "another disk"
    )


def _open_cache(directory: Path, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    """Open a cache directory, refusing one whose metadata or array shapes do not match."""
    try:
        found = json.loads((directory / META).read_text())
        images = np.load(directory / "images.npy", mmap_mode="r")
        labels = np.load(directory / "labels.npy", mmap_mode="r")
    except (OSError, ValueError) as error:  # missing, truncated or not .npy
        raise ValueError(f"pathfinder cache {directory} is damaged ({error}); delete it") from error
    size = meta["resolution"]
    if (
        found != meta
        or images.shape != (meta["num"], size, size)
        or images.dtype != np.uint8
        or labels.shape != (meta["num"],)
    ):
        raise ValueError(
            f"pathfinder cache {directory} does not hold what its name says; delete it"
        )
    return images, labels


def work_dir(directory: Path) -> Path:
    """Where the cache `directory` is generated until it is complete."""
    return directory.with_name(f".{directory.name}.partial")


def clean_up_after_interrupted_runs(directory: Path) -> None:
    """Call holding `directory`'s lock. Deletes the stale temporaries of the old format: this
    cache's, and those of other settings whose lock is free (nobody is generating them)."""
    parent = directory.parent
    remove_stale_temporaries(directory)
    others = set()
    for entry in parent.iterdir():
        if (old := _OLD_TEMPORARY.fullmatch(entry.name)) and old.group(1) != directory.name:
            others.add(old.group(1))
        elif (work := _WORK.fullmatch(entry.name)) and work.group(1) != directory.name:
            log.info(
                "unfinished Pathfinder generation %s (%.2f GB) is kept: it continues when its "
                "settings run again; delete it if they will not",
                entry,
                _disk_usage(entry) / 1e9,
            )
    for name in sorted(others):
        with exclusive_lock(parent, f".{name}.lock", wait=False) as nobody_else:
            if nobody_else:
                remove_stale_temporaries(parent / name)


def _disk_usage(directory: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in directory.iterdir() if p.is_file())


def generate_cache(
    directory: Path,
    meta: dict,
    *,
    num_workers: int | None = None,
    progress: bool = True,
    chunk_size: int | None = None,
) -> None:
    """Generate the cache `directory` described by `meta` (resolution, contour_length, num,
    seed, generator_version), continuing an interrupted run's work directory. Call holding the
    directory's lock."""
    from tqdm.auto import tqdm

    check_workers_may_start(num_workers)  # before the work directory is touched
    chunk_size = chunk_size or CHUNK_SIZE
    work = work_dir(directory)
    for name in (PROGRESS, META):
        remove_stale_temporaries(work / name)  # a kill while one of them was being replaced
    if (work / META).is_file():  # complete, but not yet renamed when the last run stopped
        _publish(work, directory)
        return
    arrays, done = _resume(work, meta, chunk_size) or _start(work, meta, chunk_size)
    images, labels = arrays
    num = meta["num"]
    todo = [
        (lo, min(lo + chunk_size, num))
        for chunk, lo in enumerate(range(0, num, chunk_size))
        if chunk not in done
    ]
    tasks = chunk_tasks(todo, meta["resolution"], meta["contour_length"], meta["seed"])
    bar = tqdm(
        total=num,
        initial=num - sum(hi - lo for lo, hi in todo),
        desc=f"pathfinder {meta['resolution']}x{meta['resolution']}",
        unit="img",
        disable=not progress,
    )
    last_save = time.monotonic()

    def store(result):
        nonlocal last_save
        start, chunk_images, chunk_labels, _ = result
        images[start : start + len(chunk_images)] = chunk_images
        labels[start : start + len(chunk_labels)] = chunk_labels
        done.add(start // chunk_size)
        bar.update(len(chunk_images))
        if time.monotonic() - last_save >= SAVE_EVERY_S:
            _save_progress(work, arrays, done, meta, chunk_size)
            last_save = time.monotonic()

    finished = False
    try:
        with _sigterm_exits():
            run_chunks(tasks, num_workers, store)
        finished = True
    finally:
        bar.close()
        _save_progress(work, arrays, done, meta, chunk_size)
        if not finished:
            kept = sum(min(chunk_size, num - c * chunk_size) for c in done)
            log.warning(
                "Pathfinder generation stopped: %d of %d images are kept in %s; run again with "
                "the same settings to continue from there",
                kept,
                num,
                work,
            )
    with atomic_path(work / META) as tmp:
        tmp.write_text(json.dumps(meta, indent=1))
    _publish(work, directory)


def _start(work: Path, meta: dict, chunk_size: int):
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    num, size = meta["num"], meta["resolution"]
    images = np.lib.format.open_memmap(
        work / "images.npy", mode="w+", dtype=np.uint8, shape=(num, size, size)
    )
    labels = np.lib.format.open_memmap(work / "labels.npy", mode="w+", dtype=np.int64, shape=(num,))
    try:
        _reserve_space(work)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)  # nothing generated yet: give the space back
        raise
    done: set[int] = set()
    _save_progress(work, (images, labels), done, meta, chunk_size)
    return (images, labels), done


def _resume(work: Path, meta: dict, chunk_size: int):
    """The arrays and finished chunks of an interrupted run's work directory, or None (and the
    directory deleted) when there is none or it cannot be used."""
    if not work.is_dir():
        return None
    try:
        saved = json.loads((work / PROGRESS).read_text())
        if saved["meta"] != meta:
            raise ValueError(f"it was made for {saved['meta']}")
        num, size = meta["num"], meta["resolution"]
        images = np.load(work / "images.npy", mmap_mode="r+")
        labels = np.load(work / "labels.npy", mmap_mode="r+")
        if images.shape != (num, size, size) or images.dtype != np.uint8:
            raise ValueError(f"images.npy holds {images.dtype} {images.shape}")
        if labels.shape != (num,) or labels.dtype != np.int64:
            raise ValueError(f"labels.npy holds {labels.dtype} {labels.shape}")
        done = _rechunk(num, int(saved["chunk_size"]), saved["done"], chunk_size)
        _reserve_space(work)  # a work folder of an older version's is sparse
    except (OSError, ValueError, KeyError, TypeError) as error:
        if no_space_errno(error) is not None:  # usable, the disk full: kept for the next run
            raise
        log.warning("discarding the unusable partial Pathfinder generation %s (%s)", work, error)
        shutil.rmtree(work)
        return None
    kept = sum(min(chunk_size, num - c * chunk_size) for c in done)
    log.info("continuing the Pathfinder generation in %s: %d of %d images done", work, kept, num)
    return (images, labels), done


def _reserve_space(work: Path) -> None:
    """Allocate the arrays' whole files on disk now. They are created sparse, and a memory-mapped
    write into a sparse file on a full disk (or over quota) kills the process with SIGBUS, with
    no message and no progress saved; reserved, a full disk is an OSError (ENOSPC) here, before
    any image is generated. A file system (or OS: macOS) without fallocate is left as it is."""
    if not hasattr(os, "posix_fallocate"):
        return
    for name in ("images.npy", "labels.npy"):
        fd = os.open(work / name, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        finally:
            os.close(fd)


def _rechunk(num: int, saved_size: int, saved_done, chunk_size: int) -> set[int]:
    """The chunks of `chunk_size` images wholly covered by finished chunks of `saved_size`."""
    covered = np.zeros(num, dtype=bool)
    for chunk in saved_done:
        if not 0 <= int(chunk) * saved_size < num:
            raise ValueError(f"progress lists chunk {chunk}, beyond {num} images")
        covered[int(chunk) * saved_size : (int(chunk) + 1) * saved_size] = True
    chunks = range(-(-num // chunk_size))
    return {c for c in chunks if covered[c * chunk_size : (c + 1) * chunk_size].all()}


def _save_progress(work: Path, arrays, done: set[int], meta: dict, chunk_size: int) -> None:
    """Record `done` durably: the arrays reach the disk first (msync), then the list replaces
    the previous one atomically, so it never names a chunk whose images are not on disk."""
    for array in arrays:
        array.flush()
    state = {"meta": meta, "chunk_size": chunk_size, "done": sorted(done)}
    with atomic_path(work / PROGRESS) as tmp:
        tmp.write_text(json.dumps(state))


def _publish(work: Path, directory: Path) -> None:
    (work / PROGRESS).unlink(missing_ok=True)
    fsync_directory(work)
    os.rename(work, directory)
    fsync_directory(directory.parent)


@contextlib.contextmanager
def _sigterm_exits():
    """SIGTERM's default action kills the process on the spot: no finally block runs, the
    progress since the last save is lost and the worker pool's semaphores leak. While generating,
    it raises SystemExit(143) instead (128 + SIGTERM, what a scheduler expects), so the pool is
    stopped and the progress saved; unless someone else already handles SIGTERM."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def stop(signum, frame):  # noqa: ARG001
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
