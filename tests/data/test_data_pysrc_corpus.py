"""data=pysrc: the standard library through the token cache (one small stdlib folder, for speed)."""

from __future__ import annotations

import json

import pytest
from data_testing import write_python_sources

from flashtrain.data import pysrc
from flashtrain.data.corpus import open_corpus, require_source
from flashtrain.data.registry import build_data, data_config
from flashtrain.data.token_cache import read_header
from flashtrain.data.tokenization import ByteTokenizer

# json/ holds a handful of files (about 50 KB), enough for a train and a validation split.
SMALL = {"loader": "lm_corpus", "name": "pysrc", "source": "pysrc", "pysrc_under": "json"}
QUIET = {"eos_policy": "append", "progress": False}


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


@pytest.fixture
def fake_roots(tmp_path, monkeypatch):
    """A small stand-in stdlib and one package root holding numpy/ and six.py, as pysrc's roots."""
    stdlib, site = tmp_path / "stdlib", tmp_path / "site-packages"
    write_python_sources(stdlib)
    numpy = write_python_sources(site / "numpy", seed=1)
    (site / "six.py").write_text("PY3 = True\n")
    monkeypatch.setattr(pysrc, "stdlib_root", lambda: stdlib)
    monkeypatch.setattr(pysrc, "package_roots", lambda stdlib=None: [site])
    return {f"packages/numpy/{path}": text for path, text in numpy.items()}


def documents(files) -> int:
    return sum(f.num_docs for f in files.values())


def test_packages_make_their_own_cache_and_pysrc_under_selects_one(tmp_path, fake_roots):
    stdlib = open_corpus(small_pysrc(tmp_path, pysrc_under=None), ByteTokenizer(), **QUIET)
    both = open_corpus(
        small_pysrc(tmp_path, pysrc_under=None, pysrc_packages=True), ByteTokenizer(), **QUIET
    )
    assert both["train"].path.parent != stdlib["train"].path.parent
    assert documents(both) == documents(stdlib) + len(fake_roots) + 1  # numpy/ and six.py
    spec = json.loads((both["train"].path.parent / "spec.json").read_text())
    assert spec["source"]["packages"] is True
    assert "packages" not in json.loads((stdlib["train"].path.parent / "spec.json").read_text())
    assert read_header(both["train"].path)["source"] != read_header(stdlib["train"].path)["source"]
    numpy = open_corpus(
        small_pysrc(tmp_path, pysrc_under="packages/numpy", pysrc_packages=True),
        ByteTokenizer(),
        **QUIET,
    )
    assert documents(numpy) == len(fake_roots)
    expected = sum(len(t.encode()) + 1 for t in fake_roots.values())  # bytes + <eos> per file
    assert sum(f.num_tokens for f in numpy.values()) == expected


@pytest.mark.parametrize(
    ("packages", "under", "message"),
    [
        (False, "packages/numpy", "set data.pysrc_packages=true"),
        (True, "packages/scipy", "scipy/ in any package root"),
        (True, "no_such_dir", "'packages/numpy'"),
    ],
)
def test_pysrc_under_that_selects_nothing_says_what_it_may_name(
    tmp_path, fake_roots, packages, under, message
):
    cfg = small_pysrc(tmp_path, pysrc_under=under, pysrc_packages=packages)
    with pytest.raises(FileNotFoundError, match=message):
        open_corpus(cfg, ByteTokenizer(), **QUIET)
