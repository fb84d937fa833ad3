"""A file whose writes the disk refuses, for tests of a full disk or a spent quota:

    monkeypatch.setattr(module, "open", refusing_open(lambda path: ..., errno.ENOSPC), raising=False)

`module`'s own open() then hands back, for the paths the predicate picks, a file that writes
half of what it is given and raises OSError(code), as a write cut short by the disk does."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable
from pathlib import Path


class RefusedWrites:
    """The file `handle`, whose every write stores half its data, then fails with `code`."""

    def __init__(self, handle, code: int):
        self.handle, self.code = handle, code

    def write(self, data):
        self.handle.write(data[: len(data) // 2])
        raise OSError(self.code, os.strerror(self.code))

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


def refusing_open(refused: Callable[[Path], bool], code: int):
    """An open() whose files at the paths `refused` picks refuse their writes with `code`."""

    def open_(path, *args, **kwargs):
        handle = builtins.open(path, *args, **kwargs)
        return RefusedWrites(handle, code) if refused(Path(path)) else handle

    return open_
