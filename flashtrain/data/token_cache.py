"""Token cache files: one per split, memory-mapped, with a header the loader verifies.

Layout (little-endian):

    bytes 0..7       magic b"FLTOKENS"
    bytes 8..11      header length n (uint32)
    bytes 12..15     CRC-32 of the header bytes (uint32)
    bytes 16..16+n   header: UTF-8 JSON (version, dtype, num_tokens, num_docs, tokenizer,
                     vocab_size, eos_policy, eos_id, source, body_sha256), zero-padded up to
                     HEADER_BYTES
    HEADER_BYTES..   tokens: num_tokens x uint16 (uint32 when the vocabulary needs it)
    then             document starts: (num_docs + 1) x uint64, the last one == num_tokens

body_sha256 is the SHA-256 of everything after the header, hashed while it is written. Opening a
cache checks it when the body is at most VERIFY_LIMIT_BYTES (always with verify=True, never with
verify=False). Caches written before the checksum existed (same version, no body_sha256) are
accepted with a note: rebuilding a corpus takes hours and their headers and sizes are still
checked; verify=True refuses them, naming the command that rebuilds them. Every batch's ids are
checked against the vocabulary too (TokenFile.check_ids), so a damaged body that was not hashed
still stops the run with the file named, never an IndexError in the embedding.

A file whose magic, version, CRC, size, checksum, tokenizer or EOS policy is not what the reader
expects is refused with an error saying why and what to do; nothing is read from it silently.
Files are written to a temporary name, fsynced and renamed when complete.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flashtrain.data.files import atomic_path
from flashtrain.file_integrity import hash_file, new_hash

log = logging.getLogger("flashtrain.data")

MAGIC = b"FLTOKENS"
VERSION = 1
HEADER_BYTES = 4096
EOS_POLICIES = ("append", "none")  # an EOS token after every document, or nothing between them
_PREFIX = struct.Struct("<8sII")
# Bodies up to this size are hashed whenever a cache is opened: about a second at SHA-256's
# 1 GB/s on one core, small next to building the model. Corpora beyond it (OpenWebText's train
# split is 18 GB: 20 s per rank) are hashed on request (data.verify_cache=true); their batches
# are still range-checked.
VERIFY_LIMIT_BYTES = 1 << 30
REBUILD = "python scripts/prepare_data.py <data config>"  # the generic rebuild command


class TokenCacheError(ValueError):
    """A token cache file that must not be read (foreign, truncated, corrupt or mismatched)."""


_TOKEN_DTYPES = ("<u2", "<u4")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits, else uint32 (little-endian on every machine)."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


@dataclass
class TokenFile:
    """An opened, verified cache file: tokens (memmap), doc_starts (memmap) and its header."""

    path: Path
    header: dict
    tokens: np.ndarray  # (num_tokens,) uint16 / uint32
    doc_starts: np.ndarray  # (num_docs + 1,) uint64
    rebuild: str = REBUILD  # the command that rebuilds this cache, for error messages

    @property
    def num_tokens(self) -> int:
        return int(self.header["num_tokens"])

    @property
    def num_docs(self) -> int:
        return int(self.header["num_docs"])

    def check_ids(self, ids: np.ndarray) -> np.ndarray:
        """ids (any shape) read from this cache, refused when one lies outside its vocabulary
        (a damaged file) before it reaches the model. A max/min over the batch: cheap."""
        vocab = int(self.header["vocab_size"])
        if ids.size and (int(ids.max()) >= vocab or int(ids.min()) < 0):
            bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
            raise TokenCacheError(
                f"token cache {self.path} holds token id {bad}, outside the {vocab} ids of "
                f"tokenizer '{self.header['tokenizer']}': the file is damaged. Delete it and "
                f"rebuild it: {self.rebuild}"
            )
        return ids


def _expected_size(header: dict) -> int:
    itemsize = np.dtype(header["dtype"]).itemsize
    return HEADER_BYTES + header["num_tokens"] * itemsize + (header["num_docs"] + 1) * 8


def write_token_file(
    path: Path,
    chunks,
    *,
    num_tokens: int,
    num_docs: int,
    tokenizer: str,
    vocab_size: int,
    eos_policy: str,
    eos_id: int | None,
    source: str = "",
    progress: bool = False,
) -> Path:
    """Write a cache from chunks of documents: each chunk is (ids (n,), doc_lengths (d,)), the
    ids of d consecutive documents concatenated (EOS already applied).

    num_tokens / num_docs must be known up front (the header comes first); they are checked.
    """
    from tqdm.auto import tqdm

    if eos_policy not in EOS_POLICIES:
        raise ValueError(f"eos_policy must be one of {EOS_POLICIES}, got '{eos_policy}'")
    dtype = token_dtype(vocab_size)
    header = {
        "format": "flashtrain-token-cache",
        "version": VERSION,
        "dtype": dtype.str,
        "num_tokens": int(num_tokens),
        "num_docs": int(num_docs),
        "tokenizer": tokenizer,
        "vocab_size": int(vocab_size),
        "eos_policy": eos_policy,
        "eos_id": eos_id,
        "source": source,
    }
    _encode_header({**header, "body_sha256": "0" * 64})  # too long? say so before any work
    path = Path(path)
    with atomic_path(path) as tmp:
        # Only the document index is built in memory; tokens go straight to the file, and every
        # body byte through the hash on its way there.
        starts = np.empty(num_docs + 1, dtype=np.uint64)
        body = new_hash()
        position, doc = 0, 0
        bar = tqdm(total=num_tokens, desc=f"writing {path.name}", unit="tok", disable=not progress)
        with open(tmp, "wb") as f:
            f.seek(HEADER_BYTES)  # the header, which holds the body's checksum, comes last
            for ids, lengths in chunks:
                ids = np.asarray(ids)
                lengths = np.asarray(lengths, dtype=np.int64)
                if int(lengths.sum()) != len(ids):
                    raise ValueError("a chunk's document lengths do not add up to its ids")
                if doc + len(lengths) > num_docs or position + len(ids) > num_tokens:
                    raise ValueError("more documents or tokens than announced for the token cache")
                if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
                    raise ValueError(f"token id outside [0, {vocab_size}) near document {doc}")
                starts[doc : doc + len(lengths)] = position + np.cumsum(lengths) - lengths
                data = ids.astype(dtype, copy=False).tobytes()
                f.write(data)
                body.update(data)
                position += len(ids)
                doc += len(lengths)
                bar.update(len(ids))
            bar.close()
            if (position, doc) != (num_tokens, num_docs):
                raise ValueError(
                    f"token cache got {position} tokens in {doc} documents, announced "
                    f"{num_tokens} in {num_docs}"
                )
            starts[num_docs] = num_tokens
            data = starts.astype("<u8").tobytes()
            f.write(data)
            body.update(data)
            f.seek(0)
            f.write(_encode_header({**header, "body_sha256": body.hexdigest()}))
    return path


def _encode_header(header: dict) -> bytes:
    """The HEADER_BYTES that start a cache file: magic, length, CRC, JSON, zero padding."""
    blob = json.dumps(header, sort_keys=True).encode("utf-8")
    if _PREFIX.size + len(blob) > HEADER_BYTES:
        raise ValueError(f"token cache header too long ({len(blob)} bytes); shorten `source`")
    prefix = _PREFIX.pack(MAGIC, len(blob), zlib.crc32(blob))
    return prefix + blob.ljust(HEADER_BYTES - _PREFIX.size, b"\0")


def read_header(path: Path) -> dict:
    """The verified header of a cache file (magic, version, CRC, exact size)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"token cache {path} does not exist; run scripts/prepare_data.py")
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
            raise TokenCacheError(
                f"{path} is not a flashtrain token cache (bad magic); delete it or point "
                "data.cache_dir elsewhere"
            )
        _, length, crc = _PREFIX.unpack(prefix)
        blob = f.read(length) if length <= HEADER_BYTES - _PREFIX.size else b""
    if len(blob) != length or zlib.crc32(blob) != crc:
        raise TokenCacheError(
            f"{path}: header is corrupt (CRC mismatch); delete it and prepare again"
        )
    header = json.loads(blob)
    if header.get("version") == VERSION and header.get("dtype") not in _TOKEN_DTYPES:
        raise TokenCacheError(f"{path}: unknown token dtype {header.get('dtype')}; rebuild it")
    if header.get("version") != VERSION:
        raise TokenCacheError(
            f"{path}: cache format version {header.get('version')}, this code reads version "
            f"{VERSION}; delete it and prepare again"
        )
    expected = _expected_size(header)
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        raise TokenCacheError(
            f"{path} is {state}: {size} bytes, header says {expected}; delete it and run "
            "scripts/prepare_data.py again"
        )
    return header


def open_token_file(
    path: Path,
    *,
    tokenizer: str | None = None,
    eos_policy: str | None = None,
    verify: bool | None = None,
    rebuild: str = REBUILD,
) -> TokenFile:
    """Open and verify a cache file; tokenizer / eos_policy, when given, must match the header.

    verify: None checks the body's checksum when the body is at most VERIFY_LIMIT_BYTES, True
    always (and refuses a cache without one), False never. rebuild: the command that rebuilds
    this cache, named in errors.
    """
    if verify not in (None, True, False):
        raise ValueError(f"data.verify_cache must be true, false or null (by size), got {verify!r}")
    path = Path(path)
    header = read_header(path)
    for key, wanted in (("tokenizer", tokenizer), ("eos_policy", eos_policy)):
        if wanted is not None and header[key] != wanted:
            raise TokenCacheError(
                f"{path} was made with {key}='{header[key]}' but the config asks for '{wanted}'; "
                "use another data.cache_dir or delete the cache to rebuild it"
            )
    _check_body(path, header, verify, rebuild)
    dtype = np.dtype(header["dtype"])
    n_tok, n_doc = header["num_tokens"], header["num_docs"]
    # np.memmap cannot map zero bytes; an empty split gets an empty array.
    tokens = (
        np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n_tok,))
        if n_tok
        else np.empty(0, dtype=dtype)
    )
    starts = np.memmap(
        path,
        dtype=np.uint64,
        mode="r",
        offset=HEADER_BYTES + n_tok * dtype.itemsize,
        shape=(n_doc + 1,),
    )
    if int(starts[-1]) != n_tok:
        raise TokenCacheError(f"{path}: document index does not end at the token count; rebuild it")
    return TokenFile(path, header, tokens, starts, rebuild)


def _check_body(path: Path, header: dict, verify: bool | None, rebuild: str) -> None:
    """The body against header['body_sha256'], as `verify` asks (see open_token_file)."""
    expected = header.get("body_sha256")
    if verify is False:
        return
    if expected is None:
        if verify:
            raise TokenCacheError(
                f"token cache {path} was written before caches kept a checksum, so "
                f"data.verify_cache=true cannot check it; delete it and rebuild it: {rebuild}"
            )
        log.info(
            "token cache %s has no checksum (written by an older version): opened unverified; "
            "delete it and rebuild it (%s) to have one",
            path,
            rebuild,
        )
        return
    if verify is None and _expected_size(header) - HEADER_BYTES > VERIFY_LIMIT_BYTES:
        return
    digest, _ = hash_file(path, HEADER_BYTES)
    if digest != expected:
        raise TokenCacheError(
            f"token cache {path} is damaged: its body does not match the checksum written with "
            f"it; delete it and rebuild it: {rebuild}"
        )
