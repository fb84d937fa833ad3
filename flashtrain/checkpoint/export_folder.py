"""The folder an export writes: where it may go, what --overwrite may replace, and how the new
one takes its place.

An export replaces OUT_DIR whole, so OUT_DIR must share nothing with the run it reads, and
overwrite replaces only a previous export (a folder with flashtrain_export.json, or the
config.json + README.md of an export written before that file existed) or an empty folder. The
new folder is written under a hidden name carrying the writer's pid (.NAME.tmp-PID-*) and renamed
into place when complete; the next export of the same OUT_DIR removes what a killed one left.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from flashtrain.file_integrity import fsync_directory

EXPORT_MARKER = "flashtrain_export.json"  # what makes a folder a previous export (overwrite)
README_MARK = "Exported by flashtrain"  # the README's first words: exports before the marker


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


def refuse_what_overwrite_would_lose(out: Path, overwrite: bool) -> None:
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
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


def swap_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fsync_directory(out.parent)


def temporary_folder_beside(out: Path) -> Path:
    """A new hidden folder to write the export in, after removing what killed exports of the
    same OUT_DIR left. The pid in its name tells a killed export's leftovers from a running
    one's."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_killed_exports(out)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
