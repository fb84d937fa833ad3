"""Tokenizer files from the Hugging Face hub: the cached path, the offline path, a failed
download. No test talks to the hub: hf_hub_download is replaced by a guard that fails."""

from __future__ import annotations

import os
import subprocess
import sys

import huggingface_hub
import pytest
from hub_testing import use_hub_cache
from huggingface_hub.errors import LocalEntryNotFoundError

from flashtrain.data import hub
from flashtrain.data.tokenization import load_gpt2

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    use_hub_cache(monkeypatch, cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("a test tried to download from the hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    return cache


def fill_cache(cache, repo="openai-community/gpt2", files=("vocab.json", "merges.txt")):
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name in files:
        (snapshot / name).write_text("{}" if name.endswith(".json") else "#version: 0.2\n")
    return snapshot


def test_cached_files_are_used_without_network(hf_cache):
    snapshot = fill_cache(hf_cache)
    assert hub.fetch_tokenizer_files("gpt2") == snapshot
    fill_cache(hf_cache, "google-bert/bert-base-uncased", ("vocab.txt",))
    assert hub.fetch_tokenizer_files("bert-base-uncased").name == COMMIT


def test_offline_without_files_returns_none_and_the_loader_says_what_to_do(hf_cache, tmp_path):
    assert hub.fetch_tokenizer_files("gpt2") is None
    with pytest.raises(FileNotFoundError, match="openai-community/gpt2"):
        load_gpt2(None, cache_root=tmp_path / "data_cache")


def test_a_partial_cache_counts_as_missing(hf_cache):
    fill_cache(hf_cache, files=("vocab.json",))
    assert hub.cached_tokenizer_files("gpt2") is None


def test_online_download_goes_into_the_hub_cache(hf_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []

    def download(repo, filename, *, cache_dir):  # stands in for the network
        calls.append((repo, filename, cache_dir))
        path = cache_dir / "snapshot" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert hub.fetch_tokenizer_files("gpt2") == hf_cache / "snapshot"
    assert calls == [
        ("openai-community/gpt2", "vocab.json", hf_cache),
        ("openai-community/gpt2", "merges.txt", hf_cache),
    ]


def test_a_failed_download_names_the_file_and_the_way_out(hf_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def unreachable(*args, **kwargs):
        raise LocalEntryNotFoundError("Cannot reach the Hugging Face Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    with pytest.raises(hub.HubDownloadError) as err:
        hub.fetch_tokenizer_files("gpt2")
    message = str(err.value)
    assert "vocab.json" in message and "openai-community/gpt2" in message
    assert "HF_HUB_OFFLINE=1" in message and "Cannot reach" in message


def test_unknown_tokenizer_is_refused():
    with pytest.raises(ValueError, match="known: gpt2"):
        hub.fetch_tokenizer_files("llama")


CHILD = """
from flashtrain.data import hf_tokenizer, hub
print(hub.hub_cache_dir())
print(hub.fetch_tokenizer_files("gpt2"))
print(hf_tokenizer.find_tokenizer_folder("org/tok"))
"""
HUB_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


def test_the_cache_is_where_the_hubs_environment_variables_put_it(tmp_path):
    """Each variable the hub library reads (HF_HUB_CACHE before HF_HOME when both are set),
    in a fresh process: the library reads them once, when it is imported. The expected folder
    is the hub's documented rule, written out here; the files, its layout (fill_cache)."""
    cases = {
        "HF_HUB_CACHE": ({"HF_HUB_CACHE": "c1"}, "c1"),
        "HUGGINGFACE_HUB_CACHE": ({"HUGGINGFACE_HUB_CACHE": "c2"}, "c2"),
        "HF_HOME": ({"HF_HOME": "h3"}, "h3/hub"),
        "XDG_CACHE_HOME": ({"XDG_CACHE_HOME": "x4"}, "x4/huggingface/hub"),
        "both": ({"HF_HUB_CACHE": "c5", "HF_HOME": "h5"}, "c5"),
    }
    env = {k: v for k, v in os.environ.items() if k not in HUB_VARIABLES}
    env.update(HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")  # not the user's own cache
    children = {}
    for case, (variables, where) in cases.items():
        cache = tmp_path / where
        snapshots = (fill_cache(cache), fill_cache(cache, "org/tok", ("tokenizer.json",)))
        settings = {k: str(tmp_path / v) for k, v in variables.items()}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], env=env | settings, stdout=subprocess.PIPE, text=True
        )
        children[case] = (child, [str(cache), *map(str, snapshots)])
    for case, (child, expected) in children.items():
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0, case
        assert out.split() == expected, case
