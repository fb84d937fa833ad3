"""A checkpoint's manifest: the size and SHA-256 of every file in it, hashed while the files are
written, recorded in its meta.json and checked before anything is loaded.

Single-process and DDP checkpoints are torch.save files written through a hashing file object.
Sharded (DCP, FSDP2) checkpoints go through a torch.distributed.checkpoint FileSystemWriter whose
streams hash what they write, so each rank hashes its own shards as it writes them and no file is
read back. A file the writer did not stream front to back (a future DCP that writes otherwise) is
hashed after writing, with a warning, so the manifest always covers every file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from flashtrain.file_integrity import ALGORITHM, HashingWriter, hash_file

log = logging.getLogger("flashtrain.checkpoint")

META = "meta.json"

# {"model_optim.pt": {"bytes": 123, "sha256": "ab12..."}, ...}
Manifest = dict[str, dict]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names it and what to do instead.
    `problem`: the message without its advice (verify_files' is a resume's, which a command
    passing over a damaged checkpoint words its own way)."""

    def __init__(self, message: str, *, problem: str | None = None):
        super().__init__(message)
        self.problem = problem if problem is not None else message


def damaged(problem: str, advice: str) -> CheckpointError:
    return CheckpointError(f"{problem} {advice}", problem=problem)


def write_hashed(path: Path, write: Callable) -> dict:
    """Create `path`, let write(f) fill it, fsync it; return its manifest entry."""
    with open(path, "wb") as raw:
        writer = HashingWriter(raw)
        write(writer)
        writer.flush()
        os.fsync(writer.fileno())
        digest, size = writer.digest(), writer.size
        writer.close()
    if digest is None or size != os.path.getsize(path):
        digest, size = hash_file(path)
    return {"bytes": size, ALGORITHM: digest}


class _HashingFileSystem(FileSystem):
    """DCP's local file system, but every file it creates is hashed as it is written."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, dict] = {}  # file name -> manifest entry
        self._lock = threading.Lock()  # DCP may write files from several threads

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            writer = HashingWriter(raw)
            yield writer
            digest = writer.digest()
            writer.close()
        if digest is not None:
            with self._lock:
                self.entries[Path(path).name] = {"bytes": writer.size, ALGORITHM: digest}

    def rename(self, path, new_path) -> None:  # DCP writes .metadata.tmp, then renames it
        super().rename(path, new_path)
        with self._lock:
            entry = self.entries.pop(Path(path).name, None)
            if entry is not None:
                self.entries[Path(new_path).name] = entry


class HashingStorageWriter(FileSystemWriter):
    """torch.distributed.checkpoint's FileSystemWriter, recording a manifest entry for every
    file this rank writes (`entries`)."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        self.fs = _HashingFileSystem()

    @property
    def entries(self) -> dict[str, dict]:
        return dict(self.fs.entries)


def complete_manifest(directory: Path, entries: Manifest) -> Manifest:
    """The manifest of every file in `directory` (meta.json aside): `entries` where their size
    still matches the file, every other file hashed now."""
    manifest = {}
    late = []
    for file in sorted(p for p in directory.iterdir() if p.is_file() and p.name != META):
        entry = entries.get(file.name)
        if entry is None or entry["bytes"] != file.stat().st_size:
            digest, size = hash_file(file)
            entry = {"bytes": size, ALGORITHM: digest}
            late.append(file.name)
        manifest[file.name] = entry
    if late:
        log.warning(
            "checkpoint %s: %d file(s) were not hashed while written and were read back to hash "
            "them: %s",
            directory,
            len(late),
            ", ".join(late[:5]),
        )
    return manifest


# Digests this process computed while verifying, keyed by the file's identity and change stamps,
# so resolve_resume's check and load_checkpoint's do not read the same files twice.
_verified: dict[tuple, str] = {}


def _identity(stat: os.stat_result) -> tuple:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def is_verified(directory: Path, manifest: Manifest) -> bool:
    """Whether this process already checked every listed file and none changed since."""
    try:
        return all(
            _verified.get(_identity((directory / name).stat())) == entry[ALGORITHM]
            for name, entry in manifest.items()
        )
    except OSError:
        return False


def verify_files(directory: Path, manifest: Manifest, names: Iterable[str] | None = None) -> None:
    """Check the listed files (all, or `names`) against the manifest; CheckpointError naming the
    first file that is missing, has another size or another checksum."""
    redo = (
        f"Resume from an older checkpoint (trainer.resume=auto skips damaged ones, or name one "
        f"explicitly), or delete {directory}."
    )
    for name in manifest if names is None else names:
        entry, file = manifest[name], directory / name
        try:
            stat = file.stat()
        except FileNotFoundError:
            raise damaged(
                f"checkpoint {directory} is incomplete: {name} (listed in its {META}) is missing.",
                redo,
            ) from None
        if stat.st_size != entry["bytes"]:
            raise damaged(
                f"checkpoint {directory} is corrupt: {name} has {stat.st_size} bytes, "
                f"{entry['bytes']} were written.",
                redo,
            )
        key = _identity(stat)
        if _verified.get(key) == entry[ALGORITHM]:
            continue
        digest, _ = hash_file(file)
        if digest != entry[ALGORITHM]:
            raise damaged(
                f"checkpoint {directory} is corrupt: {name} does not match the {ALGORITHM} "
                f"recorded when it was written (it changed on disk or in a copy).",
                redo,
            )
        _verified[key] = digest


def unlisted_files(directory: Path, manifest: Manifest) -> list[str]:
    """Files in the checkpoint that its manifest does not list (never read by the loader)."""
    return sorted(
        p.name
        for p in directory.iterdir()
        if p.is_file() and p.name != META and p.name not in manifest
    )
