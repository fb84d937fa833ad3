"""Token cache integrity: the body's checksum is written in the header and checked on open (by
size, or as data.verify_cache says); every batch's ids are checked against the vocabulary; stale
temporaries of a killed preparation are removed."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest
from data_testing import lm_config, write_wordpiece_vocab
from test_data_token_cache import DOCS, write

from flashtrain.data import build_data
from flashtrain.data import token_cache as tc
from flashtrain.data.corpus import corpus_cache_dir
from flashtrain.data.registry import data_config
from flashtrain.data.token_cache import HEADER_BYTES, TokenCacheError, open_token_file, read_header
from flashtrain.data.tokenization import ByteTokenizer


def poke(path, offset, value: bytes):
    data = bytearray(path.read_bytes())
    data[offset : offset + len(value)] = value
    path.write_bytes(bytes(data))


def test_header_holds_the_sha256_of_the_body(tmp_path):
    path = write(tmp_path / "train.bin", DOCS)
    body = path.read_bytes()[HEADER_BYTES:]
    assert read_header(path)["body_sha256"] == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("where", ["tokens", "document index"])
def test_a_flipped_byte_in_the_body_is_refused_naming_the_file(tmp_path, where):
    path = write(tmp_path / "train.bin", DOCS)
    offset = HEADER_BYTES + (3 if where == "tokens" else 14 * 2 + 9)
    poke(path, offset, bytes([path.read_bytes()[offset] ^ 0x01]))
    with pytest.raises(TokenCacheError) as err:
        open_token_file(path)
    msg = str(err.value)
    assert str(path) in msg and "damaged" in msg and "prepare_data.py" in msg
    open_token_file(path, verify=False)  # data.verify_cache=false: the user's call


def test_big_caches_are_hashed_on_request_only(tmp_path, monkeypatch):
    path = write(tmp_path / "train.bin", DOCS)
    poke(path, HEADER_BYTES + 5, b"\x07")
    monkeypatch.setattr(tc, "VERIFY_LIMIT_BYTES", 16)  # this body (68 bytes) counts as big
    open_token_file(path)
    with pytest.raises(TokenCacheError, match="damaged"):
        open_token_file(path, verify=True)
    with pytest.raises(ValueError, match="verify_cache must be true, false or null"):
        open_token_file(path, verify="yes")


def test_a_cache_without_a_checksum_opens_with_a_note_unless_verification_is_demanded(
    tmp_path, caplog
):
    path = write(tmp_path / "train.bin", DOCS)
    header = read_header(path)
    del header["body_sha256"]  # as the first version of the format wrote it
    poke(path, 0, tc._encode_header(header))
    with caplog.at_level(logging.INFO, logger="flashtrain"):
        f = open_token_file(path, rebuild="python scripts/prepare_data.py text_files")
    assert f.tokens.tolist() == [t for d in DOCS for t in d]
    (note,) = [r.getMessage() for r in caplog.records if "no checksum" in r.getMessage()]
    assert str(path) in note
    with pytest.raises(TokenCacheError, match="scripts/prepare_data.py text_files"):
        open_token_file(path, verify=True, rebuild="python scripts/prepare_data.py text_files")


def test_check_ids_refuses_ids_outside_the_vocabulary(tmp_path):
    path = write(tmp_path / "train.bin", DOCS, vocab_size=1000)
    f = open_token_file(path)
    rows = np.asarray(f.tokens[:6]).reshape(2, 3)
    assert f.check_ids(rows) is rows
    with pytest.raises(TokenCacheError, match=r"token id 1000, outside the 1000 ids"):
        f.check_ids(np.array([[1, 1000]], dtype=np.uint16))
    with pytest.raises(TokenCacheError, match=str(path)):
        f.check_ids(np.array([-1, 3]))


def _out_of_vocabulary(cfg, tokenizer, split="train"):
    """Write id 0xFFFF over every token of a prepared split (the checksum no longer matches)."""
    typed = data_config(cfg)
    path = corpus_cache_dir(typed, tokenizer, typed.eos_policy) / f"{split}.bin"
    count = read_header(path)["num_tokens"]
    poke(path, HEADER_BYTES, b"\xff\xff" * count)
    return path


def test_lm_batches_with_ids_beyond_the_vocabulary_stop_naming_the_cache(tmp_path):
    cfg = lm_config(tmp_path)
    build_data(cfg, seq_len=32, micro_batch_size=2, seed=0)  # prepares the cache
    path = _out_of_vocabulary(cfg, ByteTokenizer())
    with pytest.raises(TokenCacheError, match="damaged"):  # the checksum, on open
        build_data(cfg, seq_len=32, micro_batch_size=2, seed=0)
    module = build_data({**cfg, "verify_cache": False}, seq_len=32, micro_batch_size=2, seed=0)
    with pytest.raises(TokenCacheError, match=f"{path}.*outside the 258 ids"):
        next(module.train_batches())  # ... and still the range check on every batch
    val = _out_of_vocabulary(cfg, ByteTokenizer(), "validation")
    with pytest.raises(TokenCacheError, match=str(val)):
        next(iter(module.val_batches()))


def test_mlm_pieces_with_ids_beyond_the_vocabulary_stop_naming_the_cache(tmp_path):
    write_wordpiece_vocab(tmp_path / "vocab.txt")
    cfg = lm_config(
        tmp_path,
        loader="mlm",
        name="bert_mlm",
        tokenizer="wordpiece",
        tokenizer_path=str(tmp_path / "vocab.txt"),
        vocab_size=24,
        verify_cache=False,
    )
    module = build_data(cfg, seq_len=48, micro_batch_size=2, seed=0)
    path = module.splits["train"].path
    count = module.splits["train"].num_tokens
    poke(path, HEADER_BYTES, b"\x40\x00" * count)  # id 64 in a 24-id vocabulary
    module = build_data(cfg, seq_len=48, micro_batch_size=2, seed=0)
    with pytest.raises(TokenCacheError, match=f"{path}.*outside the"):
        next(module.train_batches())


def test_preparation_removes_temporaries_of_a_killed_run(tmp_path):
    cfg = data_config(lm_config(tmp_path))
    directory = corpus_cache_dir(cfg, ByteTokenizer(), cfg.eos_policy)
    directory.mkdir(parents=True)
    stale = directory / ".train.bin.4242-0123abcd.tmp"  # what a kill -9 while writing leaves
    stale.write_bytes(b"\0" * 1000)
    unrelated = directory / "notes.tmp"
    unrelated.write_text("not ours")
    build_data(cfg, seq_len=32, micro_batch_size=2, seed=0)
    assert not stale.exists() and unrelated.exists()
    assert open_token_file(directory / "train.bin").num_tokens > 0
