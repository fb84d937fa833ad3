"""hf:HUB_ID through huggingface_hub's cache, with no network: a snapshot already in the cache
loads (HF_HUB_OFFLINE=1), and a download fetches only the files the model reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from hf_testing import assert_same_state, tiny_gpt2
from hub_testing import use_hub_cache

from flashtrain.checkpoint import initial_weights
from flashtrain.hf import from_hf, to_hf
from flashtrain.models import build_model

REF = {"impl": "reference"}
REPO_ID = "tiny-org/tiny-gpt2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_snapshot(cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """The hub cache's layout as huggingface_hub writes it: file contents under blobs/, the
    snapshot folder of one commit linking to them, refs/main naming that commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    for name, src in files.items():
        data = src.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_a_cached_hub_model_loads_offline(tmp_path, monkeypatch):
    """Sharded safetensors in the cache: from_hf and model.init_from=hf: read them, offline."""
    hf = tiny_gpt2(seed=2).float()  # init_from casts to the model's float32
    hf.save_pretrained(tmp_path / "src", max_shard_size="20KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").is_file()
    files = {p.name: p for p in (tmp_path / "src").iterdir()}
    cache_snapshot(tmp_path / "hub", REPO_ID, files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    use_hub_cache(monkeypatch, tmp_path / "hub")

    assert_same_state(to_hf(from_hf(REPO_ID, attention=REF)).state_dict(), hf.state_dict())
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, vocab_size=61, max_seq_len=40)
    model = build_model({**cfg, "init_from": f"hf:{REPO_ID}"}, REF)
    initial_weights(model, model.config.init_from)
    assert torch.equal(model.wte.weight.detach(), hf.transformer.wte.weight.detach())


def fake_hub(monkeypatch, repo_files: dict[str, Path], cache: Path) -> list[str]:
    """huggingface_hub.snapshot_download over a repository holding `repo_files`, without a
    network: allow_patterns filtered by huggingface_hub's own matcher, the matching files copied
    into one snapshot folder. Returns the names fetched."""
    from huggingface_hub.utils import filter_repo_objects

    fetched = []

    def snapshot_download(repo_id, *, allow_patterns=None, cache_dir=None, local_files_only=False):
        assert not local_files_only and Path(cache_dir) == cache
        snapshot = cache / "snapshot"
        for name in filter_repo_objects(list(repo_files), allow_patterns=allow_patterns):
            target = snapshot / name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(repo_files[name].read_bytes())
                fetched.append(name)
        return str(snapshot)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    use_hub_cache(monkeypatch, cache)
    return fetched


def test_download_fetches_only_what_the_model_reads(tmp_path, monkeypatch):
    """A repository as hub ones are: sharded safetensors beside other formats of the same
    weights (Mistral's consolidated.safetensors, an onnx/ export, PyTorch pickles), a README."""
    hf = tiny_gpt2(seed=3)
    hf.save_pretrained(tmp_path / "src", max_shard_size="20KB")
    src = {p.name: p for p in (tmp_path / "src").iterdir()}
    shards = sorted(n for n in src if n.startswith("model-"))
    other = tmp_path / "other.bin"
    other.write_bytes(b"not read")
    repo = {**src, "consolidated.safetensors": other, "onnx/model.safetensors": other,
            "pytorch_model.bin": other, "README.md": other, "tf_model.h5": other}  # fmt: skip
    fetched = fake_hub(monkeypatch, repo, tmp_path / "hub")
    model = from_hf(REPO_ID, attention=REF)
    assert sorted(fetched) == sorted(["config.json", "model.safetensors.index.json", *shards])
    assert_same_state(to_hf(model).state_dict(), hf.state_dict())


def test_download_of_a_pytorch_only_repository(tmp_path, monkeypatch):
    hf = tiny_gpt2(seed=4)
    hf.config.save_pretrained(tmp_path / "src")  # transformers 5 saves no pickles: by hand
    torch.save(hf.state_dict(), tmp_path / "src" / "pytorch_model.bin")
    src = {p.name: p for p in (tmp_path / "src").iterdir()}
    other = tmp_path / "other.bin"
    other.write_bytes(b"not read")
    repo = {**src, "tf_model.h5": other, "flax_model.msgpack": other}
    fetched = fake_hub(monkeypatch, repo, tmp_path / "hub")
    model = from_hf(REPO_ID, attention=REF)
    assert sorted(fetched) == ["config.json", "pytorch_model.bin"]
    assert_same_state(to_hf(model).state_dict(), hf.state_dict())


def _save_truncated(folder: Path, weights: str) -> Path:
    """A tiny GPT-2 folder whose weights file (model.safetensors or pytorch_model.bin) lost
    its second half, as an interrupted download or copy leaves it; returns that file."""
    hf = tiny_gpt2(seed=5).float()
    path = folder / weights
    if weights == "model.safetensors":
        hf.save_pretrained(folder)
    else:  # transformers 5 saves no pickles: by hand
        hf.config.save_pretrained(folder)
        torch.save(hf.state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_truncated_weights_are_one_clear_error_naming_the_file(weights, tmp_path):
    """model.init_from=hf:FOLDER and from_hf alike: a ValueError (the trainer's exit 2) that
    names the file, says it is truncated or damaged and to download it again, not the
    reader's own SafetensorError or zip error."""
    path = _save_truncated(tmp_path / "hf", weights)
    cfg = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, vocab_size=61, max_seq_len=40)
    model = build_model({**cfg, "init_from": f"hf:{tmp_path / 'hf'}"}, REF)
    for load in (
        lambda: initial_weights(model, model.config.init_from),
        lambda: from_hf(str(tmp_path / "hf"), attention=REF),
    ):
        with pytest.raises(ValueError) as err:
            load()
        message = str(err.value)
        assert f"{path} is truncated or damaged" in message, message
        assert "download it again" in message and "\n" not in message, message
    assert str(err.value).startswith(f"{path}")  # from_hf: the file first


def test_a_legacy_pickle_of_an_old_repository_loads(tmp_path):
    """pytorch_model.bin in torch.save's pre-zip format (old hub repositories) cannot be
    memory-mapped: it is read whole, not refused as damaged."""
    hf = tiny_gpt2(seed=6)
    hf.config.save_pretrained(tmp_path / "old")
    torch.save(hf.state_dict(), tmp_path / "old" / "pytorch_model.bin",
               _use_new_zipfile_serialization=False)  # fmt: skip
    assert_same_state(to_hf(from_hf(str(tmp_path / "old"), attention=REF)).state_dict(),
                      hf.state_dict())  # fmt: skip
