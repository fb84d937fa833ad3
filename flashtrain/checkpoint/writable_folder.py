"""Folders a run writes into that are its settings' (trainer.ckpt_dir, logger.dir): one that
cannot be created and written is refused in one line naming the setting, whichever check finds
it, so a run learns it at start and never after hours of work.

foreseen_problem looks without writing anything (a dry run writes nothing): a file where the
folder or a folder above it should be, or the nearest existing folder above it not writable for
this process. What only a write shows (a full disk; a lock file that opens but takes no writes)
is found by the run's first write there: the checkpoint lock (run_lock.py) refuses it in the
same words (unusable_folder).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from flashtrain.typed_config import ConfigError

NOT_A_DIRECTORY = "is not a directory (a file is in the way)"


def unusable_folder(setting: str, folder: Path, reason: str, purpose: str) -> ConfigError:
    """The refusal of `folder` (set by `setting`, needed for `purpose`, e.g. "checkpoints")."""
    return ConfigError(
        f"{setting} {folder} {reason}: {purpose} need a folder this run can create and write; "
        f"point {setting} at one"
    )


def reason_of(error: OSError) -> str:
    """What an OSError from creating or writing a folder says about it."""
    if isinstance(error, FileExistsError | NotADirectoryError):
        return NOT_A_DIRECTORY
    return f"cannot be created or written ({error.strerror})"


def foreseen_problem(folder: str | os.PathLike) -> str | None:
    """Why `folder` could not be created and written, as far as looking shows; None when
    nothing shows it. The folder itself when it exists, else the nearest path above it that
    does: a non-directory there (a file, a broken link) is in the way, and a folder there must
    be writable and searchable (os.access: the mount's read-only flag counts, root may write
    the rest)."""
    path = Path(folder).absolute()
    for candidate in (path, *path.parents):
        if not os.path.lexists(candidate):
            continue
        if not candidate.is_dir():
            return NOT_A_DIRECTORY
        if os.access(candidate, os.W_OK | os.X_OK):
            return None
        cause = errno.EROFS if _read_only_mount(candidate) else errno.EACCES
        return reason_of(OSError(cause, os.strerror(cause)))
    return None


def _read_only_mount(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # statvfs is not on every platform
        return False


def check_writable_folder(folder: str | os.PathLike, setting: str, purpose: str) -> None:
    """Refuse (ConfigError, unusable_folder) a folder foreseen_problem finds unusable."""
    reason = foreseen_problem(folder)
    if reason is not None:
        raise unusable_folder(setting, Path(folder), reason, purpose)
