"""Token cache files: round trip, and refusal of truncated, foreign, corrupt or mismatched files."""

import numpy as np
import pytest

from flashtrain.data.token_cache import (
    HEADER_BYTES,
    TokenCacheError,
    open_token_file,
    read_header,
    write_token_file,
)


def write(path, docs, vocab_size=1000, tokenizer="tok-a", eos_policy="append"):
    lengths = [len(d) for d in docs]
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
    # Two chunks, to exercise documents arriving in pieces.
    half = len(docs) // 2
    cut = sum(lengths[:half])
    chunks = [(flat[:cut], lengths[:half]), (flat[cut:], lengths[half:])]
    return write_token_file(
        path,
        chunks,
        num_tokens=len(flat),
        num_docs=len(docs),
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        eos_policy=eos_policy,
        eos_id=vocab_size - 1,
    )


DOCS = [[1, 2, 3, 999], [4, 5, 999], [6, 999], [7, 8, 9, 10, 999]]


def test_round_trip_tokens_and_document_starts(tmp_path):
    f = open_token_file(write(tmp_path / "train.bin", DOCS), tokenizer="tok-a", eos_policy="append")
    assert f.tokens.dtype == np.dtype("<u2")
    assert f.tokens.tolist() == [t for d in DOCS for t in d]
    assert f.doc_starts.tolist() == [0, 4, 7, 9, 14]
    assert (f.num_tokens, f.num_docs) == (14, 4)
    assert f.header["eos_id"] == 999


def test_large_vocab_uses_uint32_and_keeps_big_ids(tmp_path):
    docs = [[70_000, 1, 99_999], [65_536]]
    f = open_token_file(write(tmp_path / "big.bin", docs, vocab_size=100_000))
    assert f.tokens.dtype == np.dtype("<u4")
    assert f.tokens.tolist() == [70_000, 1, 99_999, 65_536]


def test_truncated_file_is_refused(tmp_path):
    path = write(tmp_path / "train.bin", DOCS)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(TokenCacheError, match="truncated"):
        open_token_file(path)


def test_foreign_file_is_refused(tmp_path):
    path = tmp_path / "foreign.bin"
    np.save(path, np.arange(100))  # a valid .npy, but not a token cache
    path = tmp_path / "foreign.bin.npy"
    with pytest.raises(TokenCacheError, match="not a flashtrain token cache"):
        open_token_file(path)


def test_corrupt_header_is_refused(tmp_path):
    path = write(tmp_path / "train.bin", DOCS)
    data = bytearray(path.read_bytes())
    data[40] ^= 0x20  # flip a bit inside the JSON header
    path.write_bytes(bytes(data))
    with pytest.raises(TokenCacheError, match="CRC"):
        read_header(path)


@pytest.mark.parametrize("key, wanted", [("tokenizer", "tok-b"), ("eos_policy", "none")])
def test_cache_from_another_tokenizer_or_eos_policy_is_refused(tmp_path, key, wanted):
    path = write(tmp_path / "train.bin", DOCS)
    with pytest.raises(TokenCacheError, match=key):
        open_token_file(path, **{key: wanted})


def test_failed_write_leaves_no_file_behind(tmp_path):
    path = tmp_path / "train.bin"
    with pytest.raises(ValueError, match="announced"):
        write_token_file(
            path,
            [(np.arange(3), [3])],
            num_tokens=5,
            num_docs=1,
            tokenizer="t",
            vocab_size=10,
            eos_policy="append",
            eos_id=9,
        )
    assert list(tmp_path.iterdir()) == []


def test_header_size_and_layout(tmp_path):
    path = write(tmp_path / "train.bin", DOCS)
    assert path.read_bytes()[:8] == b"FLTOKENS"
    assert path.stat().st_size == HEADER_BYTES + 14 * 2 + 5 * 8
