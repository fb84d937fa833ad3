"""Local text files must be UTF-8: checked before `datasets` reads them, whose own failure on a
Latin-1 or binary file is a long traceback that names no file."""

from __future__ import annotations

import codecs
import functools
import os
from pathlib import Path

# The packaged `datasets` builders that decode their files as UTF-8 (parquet is binary).
UTF8_BUILDERS = ("text", "json", "csv")
_CHUNK_BYTES = 1 << 20  # read a file this much at a time: never whole into memory


def check_utf8(path: str | Path, key: str, *, chunk_bytes: int = _CHUNK_BYTES) -> None:
    """Raise ValueError naming `path`, the offset of its first byte that is not UTF-8 and what
    to do; key: the config key that lists the file (e.g. data.data_files)."""
    stat = os.stat(path)
    _check_utf8(str(path), stat.st_size, stat.st_mtime_ns, key, chunk_bytes)


@functools.lru_cache(maxsize=4096)  # per (file, size, mtime): a streaming run reads each epoch
def _check_utf8(path: str, size: int, mtime_ns: int, key: str, chunk_bytes: int) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    read = 0  # bytes handed to the decoder so far
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            held = len(decoder.getstate()[0])  # the start of a character cut by the last read
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:  # e.start counts from the held bytes
                offset = read - held + e.start
                reason = "an incomplete character ends the file" if not chunk else e.reason
                raise ValueError(
                    f"{key}: {path} is not UTF-8 text: byte {offset} "
                    f"(0x{e.object[e.start]:02x}): {reason}; convert it to UTF-8 (from "
                    f"Latin-1: iconv -f latin1 -t utf-8 FILE > NEW) or remove it from {key}"
                ) from None
            if not chunk:
                return
            read += len(chunk)
