"""What a saved stream position counts in: the data it was read from.

A position (an epoch and offset, documents read, a batch count) means something only on the
data it was saved on: the same corpus, cut into windows of the same seq_len, masked the same way,
generated with the same task parameters. Each DataModule names those as its `data_identity`
({field: value}, the field named as the user sets it), saved with its stream state under
IDENTITY_KEY; a load onto data whose identity differs raises OtherDataError naming each field.
States saved before the identity existed have none and load as before.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

IDENTITY_KEY = "data_identity"


class OtherDataError(ValueError):
    """A saved stream position from other data. changes: (field, saved, current) triples."""

    def __init__(self, changes: list[tuple[str, Any, Any]]):
        self.changes = changes
        super().__init__(
            "; ".join(f"{field}: saved {was}, now {now}" for field, was, now in changes)
        )


def check_same_data(state: dict, identity: dict[str, Any]) -> None:
    """Refuse `state` when it was saved on data whose identity differs from `identity`. Only
    fields both name are compared (a field added by a later version is not in older states)."""
    saved = state.get(IDENTITY_KEY)
    if saved is None:  # saved before the identity was recorded
        return
    changes = [
        (k, saved[k], identity[k]) for k in saved if k in identity and saved[k] != identity[k]
    ]
    if changes:
        raise OtherDataError(changes)


def short_hash(value: Any) -> str:
    """12 hex digits of the SHA-256 of `value` as sorted JSON (lists, dicts, strings, numbers)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def token_file_identity(token_file) -> str:
    """A token cache split by its content: its token count and body checksum (caches written
    before the checksum: the token and document counts)."""
    header = token_file.header
    digest = header.get("body_sha256")
    if digest:
        return f"{header['num_tokens']} tokens, sha256 {digest[:12]}"
    return f"{header['num_tokens']} tokens in {header['num_docs']} documents"
