"""Writes the file system refuses for want of space, told apart from every other failure: a full
disk (ENOSPC) or a spent disk quota (EDQUOT), the same thing to a user, who frees space or writes
elsewhere.

The libraries between the product and the disk wrap the refusal, so it is looked for anywhere in
an error's chain of causes (__cause__, else __context__): torch.save raises a RuntimeError caused
by it, `datasets` a DatasetGenerationError, torch.distributed.checkpoint collects its writers'
errors as text, and pyarrow, safetensors and tokenizers carry it only in their message
("[Errno 28] ...", "... (os error 28)"). Every writer of the product (checkpoints, exports, token
caches, the Pathfinder cache, prepare_data) turns it into a NoSpaceError whose one line names what
it was writing, what became of the partial files and what to free; train.py, prepare_data.py and
evaluate.py exit 4 on it (flashtrain/train/entry.py), and on a refusal no writer named too
(as_no_space_error: the line names the file where the refusal does).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable
from pathlib import Path

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)")


class NoSpaceError(RuntimeError):
    """A write refused for want of space (a full disk or a spent quota). The message names what
    was being written, what became of the partial files and what to free."""


def no_space_errno(error: BaseException | None) -> int | None:
    """ENOSPC or EDQUOT when `error` or an error in its chain of causes is that refusal (as an
    OSError's errno, or only in its text); None for every other failure."""
    refusal = _refusal(error)
    return None if refusal is None else _errno_of(refusal)


def refused_file(error: BaseException | None) -> Path | None:
    """The file whose write was refused for want of space, where the refusal names one."""
    refusal = _refusal(error)
    if isinstance(refusal, OSError) and refusal.filename is not None:
        return Path(os.fsdecode(refusal.filename))
    return None


def _refusal(error: BaseException | None) -> BaseException | None:
    """The error in `error`'s chain of causes that is the refusal for want of space, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _errno_of(error) in NO_SPACE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def _errno_of(error: BaseException) -> int | None:
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    text = str(error)
    for code in NO_SPACE_ERRNOS:
        if os.strerror(code) in text:
            return code
    match = _ERRNO_IN_TEXT.search(text)
    return int(match.group(1) or match.group(2)) if match else None


def shortage(code: int) -> str:
    """What ran out, for the start of a message: "no space left on the device" (ENOSPC) or
    "disk quota exceeded" (EDQUOT)."""
    return "disk quota exceeded" if code == errno.EDQUOT else "no space left on the device"


def free_space(code: int, folder: os.PathLike | str) -> str:
    """The advice: free space on that folder's disk, or in the user's quota there."""
    if code == errno.EDQUOT:
        return f"free space in your disk quota on {folder}"
    return f"free space on {folder}"


@contextlib.contextmanager
def no_space_named(message: Callable[[int, Path | None], str]):
    """Around a write: a failure for want of space (anywhere in its chain) becomes
    NoSpaceError(message(errno, the refused file or None)), caused by it; every other failure
    passes unchanged."""
    try:
        yield
    except NoSpaceError:
        raise
    except Exception as e:
        code = no_space_errno(e)
        if code is None:
            raise
        raise NoSpaceError(message(code, refused_file(e))) from e


def as_no_space_error(error: BaseException, then: str) -> NoSpaceError | None:
    """What a program reports (and exits 4 on) for `error`: itself when a writer named it, a
    NoSpaceError (unnamed) for a refusal for want of space that no writer named, else None."""
    return error if isinstance(error, NoSpaceError) else unnamed(error, then)


def unnamed(error: BaseException, then: str) -> NoSpaceError | None:
    """For a failure for want of space that no writer turned into a NoSpaceError (a metrics row,
    a plot): one naming the file where the refusal does, with the advice and `then` (what to do
    after freeing space), caused by `error` (a traceback shows it). None for every other
    failure."""
    code = no_space_errno(error)
    if code is None:
        return None
    path = refused_file(error)
    if path is not None:
        what, advice = f"writing {path}", free_space(code, path.parent)
    else:
        first_line = (str(error).strip().splitlines() or [""])[0]
        what = f"({type(error).__name__}: {first_line})"
        advice = free_space(code, "the disk written")
    named = NoSpaceError(f"{shortage(code)} {what}; {advice}, {then}")
    named.__cause__ = error
    return named
