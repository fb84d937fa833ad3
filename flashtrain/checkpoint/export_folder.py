"""The folder an export writes: where it may go, what --overwrite may replace, and how the new
one takes its place.

An export replaces OUT_DIR whole, so OUT_DIR must share nothing with the run it reads, must not
be a symbolic link (the link would be replaced, not the folder it names), and overwrite replaces
only a previous export (a folder with flashtrain_export.json, or the config.json + README.md of
an export written before that file existed) or an empty folder. The new folder is written under a
hidden name carrying the writer's pid (.NAME.tmp-PID-*) and renamed into place when complete;
the next export of the same OUT_DIR removes what a killed one left.

Two exports of one OUT_DIR would replace each other, so an export claims OUT_DIR from its first
write to its final rename: an advisory flock on the hidden .NAME.lock beside it (the kernel
releases it when its holder exits in any way, kill -9 included, so a killed export blocks
nobody), naming its holder for the refusal. The claimant checks OUT_DIR again under the claim,
and the final rename replaces nothing that appeared meanwhile without the claim (a copy, an
older flashtrain): it refuses instead. A write the file system refuses (permissions, read-only,
full) is one line naming OUT_DIR, never the hidden folder (OutDirNotWritable).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from flashtrain.checkpoint import lock_file
from flashtrain.file_integrity import fsync_directory
from flashtrain.no_space import no_space_errno, refused_file

log = logging.getLogger("flashtrain.checkpoint")

EXPORT_MARKER = "flashtrain_export.json"  # what makes a folder a previous export (overwrite)
README_MARK = "Exported by flashtrain"  # the README's first words: exports before the marker
# what the user can do when the file system refuses a write of the export, by errno
WRITE_REFUSALS = {
    errno.EACCES: "choose an OUT_DIR in a folder you can write, or fix that folder's permissions",
    errno.EPERM: "choose an OUT_DIR in a folder you can write, or fix that folder's permissions",
    errno.EROFS: "choose an OUT_DIR on a writable file system",
    errno.ENOSPC: "free space there, or choose an OUT_DIR on another disk",
    errno.EDQUOT: "free space in your quota, or choose an OUT_DIR on another disk",
}
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # safetensors' and tokenizers' I/O errors


class OutDirNotWritable(OSError):
    """The file system refused a write of the export (permissions, read-only, full)."""


def refuse_out_dir_in_the_run(out: Path, checkpoint, step_dir: Path) -> None:
    """The export replaces OUT_DIR whole: it must share nothing with the run it reads (real
    paths compared, symlinks followed)."""
    parts = [("the checkpoint", step_dir), ("its checkpoints folder", step_dir.parent)]
    if step_dir.parent.name == "checkpoints":
        parts.insert(0, ("the run folder", step_dir.parent.parent))
    parts.append(("the exported folder", Path(checkpoint).expanduser()))
    real = out.resolve()
    for what, folder in parts:
        folder = folder.resolve()
        if real == folder or folder in real.parents or real in folder.parents:
            relation = (
                "is" if real == folder else "lies inside" if folder in real.parents else "holds"
            )
            raise ValueError(
                f"OUT_DIR {out} {relation} {what} {folder} of the export; choose an OUT_DIR "
                f"outside the run (an export replaces its OUT_DIR whole)"
            )


def refuse_what_overwrite_would_lose(out: Path, overwrite: bool, meanwhile: bool = False) -> None:
    """Refuse an existing OUT_DIR unless overwrite and it is a previous export or empty, and a
    symbolic link always. meanwhile: checking again, under the claim or before the final rename
    (what is there now appeared while this export ran, or it would have been refused at first)."""
    if not (out.exists() or out.is_symlink()):
        return
    if out.is_symlink():
        raise FileExistsError(
            f"OUT_DIR {out} is a symbolic link to {out.resolve()}: an export replaces its "
            f"OUT_DIR whole, the link and not the folder it names; give that folder itself, or "
            f"another OUT_DIR"
        )
    if not overwrite:
        if meanwhile:
            raise _appeared_meanwhile(out)
        raise FileExistsError(
            f"{out} exists; pass overwrite=True (--overwrite) to replace it, or choose another "
            f"OUT_DIR"
        )
    if _is_previous_export(out):
        return
    if out.is_dir():
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
        if not entries:
            return  # nothing to lose
        shown = ", ".join(entries[:6]) + (f", ... ({len(entries)} in all)" if entries[6:] else "")
        holds = f"holds {shown}"
    else:
        holds = "is a file"
    raise FileExistsError(
        f"{out} {holds} and is not a previous export (it has no {EXPORT_MARKER}): --overwrite "
        f"replaces only an export; choose another OUT_DIR, or move it away yourself"
    )


def _is_previous_export(folder: Path) -> bool:
    """A folder this function wrote: its marker, or (exports written before the marker) a
    config.json and the README.md naming flashtrain."""
    try:
        marker = json.loads((folder / EXPORT_MARKER).read_text())
        if isinstance(marker, dict) and marker.get("exported_by") == "flashtrain":
            return True
    except (OSError, ValueError):
        pass
    try:
        readme = (folder / "README.md").read_text(errors="replace")
    except OSError:
        return False
    return (folder / "config.json").is_file() and README_MARK in readme[:2000]


def remove_killed_exports(out: Path) -> None:
    """The hidden folders an export of the same OUT_DIR left when it was killed (.NAME.tmp-PID-*
    being written, .NAME.old-PID the export it was replacing): those whose process is gone.
    A running export's are kept (another process exporting to the same OUT_DIR)."""
    ours = re.compile(rf"\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)(?:-.*)?")
    for entry in out.parent.iterdir():
        match = ours.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            if not _process_alive(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def export_marker(info) -> dict:
    """flashtrain_export.json: what the folder is and where it came from, by name (no path of
    this machine: the folder is made to be shared)."""
    return {
        "exported_by": "flashtrain",
        "format": 1,
        "run": info.run_name,
        "checkpoint": info.path.name,
        "step": info.step,
        "commit": info.commit,
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def finish_files(folder: Path) -> None:
    """Durable, with the permissions of an ordinary folder (mkdtemp makes it private)."""
    umask = os.umask(0)
    os.umask(umask)
    for f in folder.iterdir():
        os.chmod(f, 0o666 & ~umask)
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    os.chmod(folder, 0o777 & ~umask)
    fsync_directory(folder)


def swap_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished export into place, checking OUT_DIR once more first: a writer that
    took no claim may have put something there meanwhile, which is never silently replaced."""
    refuse_what_overwrite_would_lose(out, overwrite, meanwhile=True)
    if out.exists():  # overwrite: a previous export or an empty folder
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        _rename_replacing_nothing(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        _rename_replacing_nothing(tmp, out)
    fsync_directory(out.parent)


def _rename_replacing_nothing(tmp: Path, out: Path) -> None:
    """rename(2) of a folder fails onto a file or a non-empty folder (it replaces only an empty
    one, which loses nothing): what appeared since the check above is refused, not replaced."""
    try:
        os.rename(tmp, out)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
        raise _appeared_meanwhile(out) from e


def _appeared_meanwhile(out: Path) -> FileExistsError:
    return FileExistsError(
        f"{out} appeared while this export ran (another export finished, or a copy?) and was "
        f"left as it is; pass overwrite=True (--overwrite) to replace it, or choose another OUT_DIR"
    )


def temporary_folder_beside(out: Path) -> Path:
    """A new hidden folder to write the export in (under the claim of OUT_DIR), after removing
    what killed exports of the same OUT_DIR left. The pid in its name tells a killed export's
    leftovers from a running one's."""
    remove_killed_exports(out)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))


@contextlib.contextmanager
def claim_out_dir(out: Path):
    """Hold OUT_DIR for this export: create its parent folders, lock .NAME.lock beside it
    (lock_file.py, as the run lock does) and write who holds it. FileExistsError naming the
    holder when another export holds it."""
    _make_parent_folder(out)
    lock = out.with_name(f".{out.name}.lock")
    try:
        handle, unsupported = lock_file.lock(lock, opener=_open_lock_file)
    except BlockingIOError:
        raise FileExistsError(
            f"OUT_DIR {out} is being written by another export "
            f"({_describe_holder(lock_file.read_holder(lock))}): two exports into one folder "
            f"would replace each other; wait for it to finish, or choose another OUT_DIR"
        ) from None
    if unsupported:
        log.warning(
            "OUT_DIR %s: its file system has no file locks (%s); another export into it would "
            "not be noticed until the final rename",
            out,
            unsupported,
        )
    try:
        if handle.writable():  # else another user's lock file: held, nameless
            lock_file.write_holder(handle)
        yield
    finally:
        lock_file.release(lock, handle)


def _make_parent_folder(out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        not_folders = (p for p in reversed(out.parents) if p.is_symlink() or p.exists())
        in_the_way = next((p for p in not_folders if not p.is_dir()), out.parent)
        what = "a file" if in_the_way.exists() else "a broken symbolic link"
        raise FileExistsError(
            f"OUT_DIR {out} cannot be created: {in_the_way} is {what}, not a folder; choose "
            f"another OUT_DIR"
        ) from e


def _open_lock_file(lock: Path):
    try:
        return lock_file.open_for_locking(lock)
    except PermissionError:
        if not lock.is_file():
            raise
        # another user's, left by a killed export: flock needs no write access
        return open(lock)  # noqa: SIM115 - held until the claim ends


def _describe_holder(holder: dict) -> str:
    if not holder:
        return "it has not said which yet"
    return f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('since')}"


@contextlib.contextmanager
def refused_writes_named(out: Path):
    """A write of the export the file system refuses (permissions, read-only, full) becomes one
    line naming OUT_DIR and what to do, not a traceback naming the hidden temporary folder.
    Errors about other files (reading the run's tokenizer) pass through unchanged."""
    try:
        yield
    except Exception as e:
        code = _write_errno(e, out)
        if code is None:
            raise
        raise OutDirNotWritable(
            f"OUT_DIR {out} cannot be written: {os.strerror(code)} in {_refusing_folder(e, out)}"
            f"{' (the partial export was removed)' if code in (errno.ENOSPC, errno.EDQUOT) else ''}"
            f"; {WRITE_REFUSALS[code]}"
        ) from e


def _write_errno(e: Exception, out: Path) -> int | None:
    """The errno of a refused write of this export; None for anything else."""
    if isinstance(e, OutDirNotWritable):
        return None
    space = no_space_errno(e)  # full or over quota, in whatever a library wrapped it
    if space is not None:
        refused = refused_file(e)
        return space if refused is None or _is_ours(refused, out) else None
    if isinstance(e, OSError):
        code = e.errno
        if e.filename is not None and not _is_ours(Path(os.fsdecode(e.filename)), out):
            return None
    else:  # safetensors (Rust) says "... (os error 28)" and names no file
        match = RUST_OS_ERROR.search(str(e))
        code = int(match.group(1)) if match else None
    return code if code in WRITE_REFUSALS else None


def _is_ours(path: Path, out: Path) -> bool:
    """A path this export writes: OUT_DIR, a folder it creates above it, or a hidden one
    beside it (.NAME.lock, .NAME.tmp-PID-*, .NAME.old-PID and what they hold)."""
    hidden = str(out.parent / f".{out.name}.")
    return path == out or path in out.parents or str(path).startswith(hidden)


def _refusing_folder(e: Exception, out: Path) -> Path:
    """The folder to name: OUT_DIR itself when the refusal is about it, else the nearest folder
    that exists above it (never the hidden temporary one, which the user did not choose)."""
    if isinstance(e, OSError) and e.filename is not None and Path(os.fsdecode(e.filename)) == out:
        return out
    return next(p for p in out.parents if p.exists())
