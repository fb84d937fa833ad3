"""The start-up check that every rank sees the same checkpoint folder.

On several nodes the checkpoint folder (trainer.ckpt_dir, by default <run dir>/checkpoints) must
be one folder on a file system every node mounts: rank 0 writes the trainer state and meta.json,
every rank its own DCP shards, and a resume reads them all back. A node-local path (a relative
trainer.ckpt_dir under per-node working directories, /tmp, a local disk) would train for hours and
fail at the first save or, worse, at the first resume. So before anything trains, rank 0 writes
a token file there and every rank reads it back.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from pathlib import Path

from flashtrain.collectives import broadcast_object, gather_objects
from flashtrain.typed_config import ConfigError

TOKEN_PREFIX = ".shared-check-"


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def check_same_folder_on_every_rank(root: Path, *, is_main: bool, setting: str) -> None:
    """A collective (every rank calls it; rank 0 holds the folder's lock, so it exists): rank 0
    writes a random token into `root`, every rank reads it back through its own view of the
    path, and a rank that cannot (the folder is not there, or holds no such token) fails the
    start on every rank with one line naming `setting` and the ranks that cannot see it."""
    token = name = None
    if is_main:
        token = secrets.token_hex(16)
        name = f"{TOKEN_PREFIX}{os.getpid()}-{token[:8]}"
        (root / name).write_text(token)
    name, token = broadcast_object((name, token))
    try:
        sees = _read_token(root / name) == token
        views = gather_objects((sees, socket.gethostname(), str(root.absolute())))
    finally:
        if is_main:
            with contextlib.suppress(OSError):
                (root / name).unlink()
    blind = [(rank, host, path) for rank, (sees, host, path) in enumerate(views) if not sees]
    if not blind:
        return
    shown = ", ".join(f"rank {rank} (host {host}, path {path})" for rank, host, path in blind[:4])
    more = f" and {len(blind) - 4} more" if len(blind) > 4 else ""
    raise ConfigError(
        f"{setting} {views[0][2]} is not the same folder on every rank: {shown}{more} cannot "
        f"read the file rank 0 (host {views[0][1]}) wrote there. Checkpoints must be on a file "
        f"system every node mounts (NFS, Lustre, ...): set {setting} to an absolute path on one, "
        f"or launch from a shared directory"
    )
