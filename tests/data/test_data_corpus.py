"""Preparing local corpora into token caches: counts, deterministic splits, clear errors."""

import pandas as pd
import pytest
from data_testing import lm_config, write_jsonl, write_text_corpus

from flashtrain.data import build_data, prepare_data
from flashtrain.data.corpus import corpus_cache_dir
from flashtrain.data.registry import data_config
from flashtrain.data.token_cache import TokenCacheError, open_token_file
from flashtrain.data.tokenization import ByteTokenizer


def cache_dir(cfg):
    return corpus_cache_dir(data_config(cfg), ByteTokenizer(), "append")


def split_documents(cfg):
    """The documents (as text) in each split of the prepared cache."""
    directory = cache_dir(cfg)
    docs = {}
    for split in ("train", "validation"):
        f = open_token_file(directory / f"{split}.bin")
        starts = f.doc_starts.tolist()
        docs[split] = [
            bytes(f.tokens[a : b - 1].tolist()).decode() for a, b in zip(starts[:-1], starts[1:])
        ]
        assert all(f.tokens[b - 1] == 256 for b in starts[1:])  # EOS after every document
    return docs


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_every_document_lands_in_exactly_one_split(tmp_path, kind):
    texts = write_text_corpus(tmp_path / "txt")
    if kind == "jsonl":
        write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
        files = str(tmp_path / "docs.jsonl")
    elif kind == "parquet":
        pd.DataFrame({"text": texts}).to_parquet(tmp_path / "docs.parquet")
        files = str(tmp_path / "docs.parquet")
    else:
        files = str(tmp_path / "txt" / "*.txt")
    cfg = lm_config(tmp_path, data_files=files)
    summary = prepare_data(cfg, progress=False)

    docs = split_documents(cfg)
    assert sorted(docs["train"] + docs["validation"]) == sorted(texts)
    assert len(docs["validation"]) == round(0.25 * len(texts))
    expected_tokens = sum(len(t.encode()) + 1 for t in texts)
    assert summary["train_tokens"] + summary["validation_tokens"] == expected_tokens


def test_split_is_deterministic_across_cache_dirs(tmp_path):
    write_text_corpus(tmp_path / "corpus")
    first = lm_config(tmp_path, cache_dir=str(tmp_path / "a"))
    second = lm_config(tmp_path, cache_dir=str(tmp_path / "b"))
    prepare_data(first, progress=False)
    prepare_data(second, progress=False)
    for split in ("train", "validation"):
        a = cache_dir(first) / f"{split}.bin"
        b = cache_dir(second) / f"{split}.bin"
        assert a.read_bytes() == b.read_bytes()
    # The seed, not chance, decides the split: another split_seed holds out other documents.
    reseeded = lm_config(tmp_path, cache_dir=str(tmp_path / "c"), split_seed=7)
    prepare_data(reseeded, progress=False)
    assert split_documents(reseeded)["validation"] != split_documents(first)["validation"]


def test_cache_is_reused_and_a_damaged_one_refused(tmp_path):
    cfg = lm_config(tmp_path)
    prepare_data(cfg, progress=False)
    train = cache_dir(cfg) / "train.bin"
    stamp = train.stat().st_mtime_ns
    prepare_data(cfg, progress=False)
    assert train.stat().st_mtime_ns == stamp  # not rewritten
    train.write_bytes(train.read_bytes()[:-10])
    with pytest.raises(TokenCacheError, match="truncated"):
        build_data(cfg, seq_len=16, micro_batch_size=2, seed=0)


def test_missing_local_file_says_what_is_allowed(tmp_path):
    cfg = lm_config(tmp_path, data_files=str(tmp_path / "nowhere" / "*.txt"))
    with pytest.raises(FileNotFoundError, match="no local file matches.*jsonl"):
        prepare_data(cfg)


def test_unknown_loader_and_unknown_keys_list_the_allowed():
    with pytest.raises(ValueError, match="data.loader='imagenet'; allowed: synthetic, lm_corpus"):
        build_data({"loader": "imagenet"}, seq_len=8, micro_batch_size=1, seed=0)
    with pytest.raises(ValueError, match=r"unknown key 'data.val_doc'.*\(LMCorpusConfig\)"):
        build_data({"loader": "lm_corpus", "val_doc": 3}, seq_len=8, micro_batch_size=1, seed=0)


@pytest.mark.parametrize("vocab_size", [100, 300])
def test_vocab_size_other_than_the_tokenizers_is_refused(tmp_path, vocab_size):
    """data.vocab_size is the tokenizer's id count; padding is the model's pad_vocab_multiple."""
    cfg = lm_config(tmp_path, vocab_size=vocab_size)
    with pytest.raises(
        ValueError, match=f"vocab_size={vocab_size} but tokenizer 'byte-utf8' has 258 ids"
    ):
        build_data(cfg, seq_len=8, micro_batch_size=1, seed=0)
