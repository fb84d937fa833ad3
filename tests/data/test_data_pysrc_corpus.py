"""data=pysrc: the standard library through the token cache (one small stdlib folder, for speed)."""

from __future__ import annotations

import json

import pytest

from flashtrain.data import pysrc
from flashtrain.data.corpus import open_corpus, require_source
from flashtrain.data.registry import build_data, data_config
from flashtrain.data.token_cache import read_header
from flashtrain.data.tokenization import ByteTokenizer

# json/ holds a handful of files (about 50 KB), enough for a train and a validation split.
SMALL = {"loader": "lm_corpus", "name": "pysrc", "source": "pysrc", "pysrc_under": "json"}


def small_pysrc(tmp_path, **extra):
    return data_config({**SMALL, "val_fraction": 0.3, "cache_dir": str(tmp_path), **extra})


def test_prepared_cache_holds_the_files_bytes_and_names_the_corpus_version(tmp_path):
    cfg = small_pysrc(tmp_path)
    files = open_corpus(cfg, ByteTokenizer(), eos_policy="append", progress=False)
    listed = [f for f in pysrc.source_files() if f.path.startswith("json/")]
    splits = pysrc.load_pysrc(None, 0.3, 0.0, files=listed)
    for split in ("train", "validation"):
        texts = splits[split]["text"]
        assert files[split].num_docs == len(texts) >= 1
        expected = sum(len(t.encode()) + 1 for t in texts)  # bytes + <eos> per file
        assert files[split].num_tokens == expected
        header = read_header(files[split].path)
        assert pysrc.corpus_version(listed) in header["source"]
    spec = json.loads((files["train"].path.parent / "spec.json").read_text())
    assert spec["source"]["fractions"] == [0.3, 0.0]
    again = open_corpus(cfg, ByteTokenizer(), eos_policy="append", progress=False)
    assert again["train"].path == files["train"].path  # reused, not rebuilt


def test_batches_come_from_the_standard_library(tmp_path):
    data = build_data(small_pysrc(tmp_path), seq_len=32, micro_batch_size=2, seed=0)
    batch = next(iter(data.train_batches()))
    assert batch["input_ids"].shape == (2, 32)
    assert int(batch["input_ids"].max()) < 258


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"streaming": True}, "streaming=true is not supported for pysrc"),
        ({"data_files": "x.txt"}, "pick one source"),
        ({"source": "pypi"}, "data.source='pypi'; allowed"),
    ],
)
def test_bad_pysrc_configs_are_refused(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        require_source(small_pysrc(tmp_path, **extra))


def test_a_folder_with_no_source_and_an_empty_split_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .py files under"):
        open_corpus(
            small_pysrc(tmp_path, pysrc_under="no_such_dir"), ByteTokenizer(), eos_policy="append"
        )
    with pytest.raises(ValueError, match="both need >= 1"):
        open_corpus(small_pysrc(tmp_path, val_fraction=0.0), ByteTokenizer(), eos_policy="append")
