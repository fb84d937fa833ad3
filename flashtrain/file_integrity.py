"""Files that survive crashes and prove they are intact: SHA-256 checksums computed while the bytes
are written (checkpoints, token caches), and fsync of a directory after a rename into it.

SHA-256 because it is hardware-accelerated (SHA-NI on current x86 servers: about 1 GB/s on one
busy core of this project's CPU, 2 GB/s on an idle one), so hashing keeps up with the disk instead
of doubling the write time; it is in the standard library (no extra dependency); and a user can
check any file by hand with coreutils' `sha256sum`. CRC-32 was no faster here, and the faster
non-cryptographic hashes are not in the standard library.
"""

from __future__ import annotations

import hashlib
import io
import os

ALGORITHM = "sha256"
READ_CHUNK = 16 << 20  # bytes per read when hashing a file that exists already


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make renames and deletions inside `directory` durable. Some file systems cannot fsync a
    directory (EINVAL); there it is skipped, as nothing better is possible."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def new_hash():
    return hashlib.sha256()


def hash_file(path: str | os.PathLike, offset: int = 0) -> tuple[str, int]:
    """(hex digest, byte count) of the file's bytes from `offset` to its end, read in chunks."""
    digest, count = new_hash(), 0
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        buffer = bytearray(READ_CHUNK)
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            digest.update(view[:n])
            count += n
    return digest.hexdigest(), count


class HashingWriter(io.RawIOBase):
    """A writable file that hashes every byte on its way to disk (torch.save and DCP write
    through it), so a file's checksum costs no second read.

    The digest is only trusted for a file written front to back: a seek away from the end (no
    writer used here does one) marks it `sequential = False` and the caller hashes the file
    afterwards instead.
    """

    def __init__(self, raw):
        self.raw = raw
        self.hash = new_hash()
        self.size = 0
        self.sequential = raw.tell() == 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        written = self.raw.write(view)
        written = len(view) if written is None else written
        self.hash.update(view[:written])
        self.size += written
        return written

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self.raw.seek(offset, whence)
        if position != self.size:
            self.sequential = False
        return position

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
            super().close()

    def digest(self) -> str | None:
        """The hex digest of the whole file, or None when it was not written front to back."""
        return self.hash.hexdigest() if self.sequential else None
