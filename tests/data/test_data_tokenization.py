"""Tokenizers: bytes, WordPiece from a vocab the test writes, GPT-2 BPE from local files."""

import json
from pathlib import Path

import pytest
from data_testing import write_wordpiece_vocab
from hub_testing import use_hub_cache

from flashtrain.data.config import LMCorpusConfig
from flashtrain.data.tokenization import ByteTokenizer, build_tokenizer, load_gpt2, load_wordpiece


def test_byte_tokenizer_is_utf8_with_specials_after_bytes():
    tok = ByteTokenizer()
    ids = tok.encode_batch(["hé!"])[0]
    assert ids == list("hé!".encode())
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (256, 257, 258)
    assert tok.decode(ids + [256]) == "hé!"


def test_byte_mlm_tokenizer_appends_berts_specials_after_the_bytes():
    tok = build_tokenizer(LMCorpusConfig(tokenizer="byte_mlm"), Path("unused"))
    assert tok.encode_batch(["hé!"])[0] == list("hé!".encode())
    assert (tok.name, tok.vocab_size) == ("byte-utf8-mlm", 260)  # its own token caches
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id) == (256, 257, 258, 259)
    assert tok.eos_id is None and tok.unk_id is None and tok.special_ids == [256, 257, 258, 259]
    assert ByteTokenizer().name == "byte-utf8"  # the LM vocabulary's caches stay valid


def test_wordpiece_from_local_vocab(tmp_path):
    vocab = write_wordpiece_vocab(tmp_path / "vocab.txt")
    tok = load_wordpiece(str(tmp_path / "vocab.txt"), tmp_path)
    ids = tok.encode_batch(["The quick FOXES jumps."])[0]
    expected = ["the", "quick", "fox", "##es", "jumps", "."]
    assert ids == [vocab.index(w) for w in expected]
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.unk_id) == (0, 2, 3, 4, 1)
    assert tok.vocab_size == len(vocab)
    assert tok.name.startswith("wordpiece-uncased-")


def _write_tiny_gpt2_files(directory):
    # GPT-2 byte-level symbols: "Ġ" is the space byte.
    vocab = {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4, "<|endoftext|>": 5}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\na b\nĠ ab\n")


def test_gpt2_bpe_from_local_vocab_and_merges(tmp_path):
    _write_tiny_gpt2_files(tmp_path / "gpt2")
    tok = load_gpt2(str(tmp_path / "gpt2"), tmp_path)
    assert tok.encode_batch(["ab ab", "a b"]) == [[3, 4], [0, 2, 1]]
    assert tok.eos_id == 5
    assert tok.name.startswith("gpt2-bpe-")


def test_gpt2_found_in_the_cache_dir_tokenizers_folder(tmp_path, monkeypatch):
    use_hub_cache(monkeypatch, tmp_path / "hf" / "hub")
    _write_tiny_gpt2_files(tmp_path / "cache" / "tokenizers" / "gpt2")
    tok = build_tokenizer(LMCorpusConfig(tokenizer="gpt2"), tmp_path / "cache")
    assert tok.encode_batch(["ab"]) == [[3]]


def test_missing_gpt2_files_say_what_to_download_and_where(tmp_path, monkeypatch):
    use_hub_cache(monkeypatch, tmp_path / "hf" / "hub")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    monkeypatch.delenv("FLASHTRAIN_TOKENIZERS", raising=False)
    with pytest.raises(FileNotFoundError) as error:
        build_tokenizer(LMCorpusConfig(tokenizer="gpt2"), tmp_path / "cache")
    message = str(error.value)
    assert "vocab.json" in message and "merges.txt" in message
    assert str(tmp_path / "cache" / "tokenizers" / "gpt2") in message


def test_missing_wordpiece_vocab_is_a_clear_error(tmp_path, monkeypatch):
    use_hub_cache(monkeypatch, tmp_path / "hf" / "hub")
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        build_tokenizer(LMCorpusConfig(tokenizer="wordpiece"), tmp_path / "cache")


def test_unknown_tokenizer_lists_the_allowed_ones(tmp_path):
    with pytest.raises(ValueError, match="byte, byte_mlm, gpt2, wordpiece"):
        build_tokenizer(LMCorpusConfig(tokenizer="sentencepiece"), tmp_path)


def test_gpt2_found_in_the_tiktoken_cache(tmp_path, monkeypatch):
    import hashlib

    from flashtrain.data.tokenization import _TIKTOKEN_GPT2

    use_hub_cache(monkeypatch, tmp_path / "hf" / "hub")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    _write_tiny_gpt2_files(tmp_path / "files")
    (tmp_path / "tiktoken").mkdir()
    for name, source in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        cached = hashlib.sha1(_TIKTOKEN_GPT2[name].encode()).hexdigest()
        (tmp_path / "tiktoken" / cached).write_bytes((tmp_path / "files" / source).read_bytes())
    tok = build_tokenizer(LMCorpusConfig(tokenizer="gpt2"), tmp_path / "cache")
    assert tok.encode_batch(["ab ab"]) == [[3, 4]]
