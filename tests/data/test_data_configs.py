"""configs/data/*.yaml: the names the trainer uses, their keys, and building through Hydra-style
configs (DictConfig nodes whose interpolations resolve against the root)."""

from pathlib import Path

import pytest
import torch
from datatest_helpers import write_text_corpus
from omegaconf import OmegaConf

from flashtrain.data import build_data
from flashtrain.data.registry import NAME_TO_LOADER

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "data"
EXPECTED = {
    "synthetic",
    "text_files",
    "openwebtext",
    "wikitext103",
    "pg19",
    "bert_mlm",
    "pathfinder32",
    "pathfinder64",
    "pathx",
    "path256",
    "long_doc",
}
CLASSIFICATION = {"pathfinder32": 2, "pathfinder64": 2, "pathx": 2, "path256": 2, "long_doc": 2}


def test_every_expected_config_exists():
    assert EXPECTED <= {p.stem for p in CONFIG_DIR.glob("*.yaml")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_keys(name):
    text = (CONFIG_DIR / f"{name}.yaml").read_text()
    cfg = OmegaConf.load(CONFIG_DIR / f"{name}.yaml")
    assert cfg.name == name and NAME_TO_LOADER[name] == cfg.loader
    assert isinstance(cfg.vocab_size, int)
    assert "${oc.env:FLASHTRAIN_DATA,data_cache}" in text  # cache dir under $FLASHTRAIN_DATA
    assert "${seq_len}" not in text  # seq_len reaches the data only through build_data
    if name in CLASSIFICATION:
        assert cfg.num_classes == CLASSIFICATION[name]


def compose(name, seq_len, **overrides):
    """What Hydra hands the trainer: a root config with seq_len and a data group."""
    root = OmegaConf.create(
        {"seq_len": seq_len, "data": OmegaConf.load(CONFIG_DIR / f"{name}.yaml")}
    )
    for key, value in overrides.items():
        OmegaConf.update(root, f"data.{key}", value)
    return root


def test_default_synthetic_config_builds_from_a_dictconfig(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_DATA", str(tmp_path))
    root = compose("synthetic", 128)
    module = build_data(root.data, seq_len=root.seq_len, micro_batch_size=2, seed=0)
    batch = next(module.train_batches())
    assert batch["input_ids"].shape == (2, 128) and module.vocab_size == root.data.vocab_size
    assert int(batch["input_ids"].max()) < module.vocab_size


def test_text_files_and_pathfinder_configs_build_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_DATA", str(tmp_path / "cache"))
    write_text_corpus(tmp_path / "corpus", docs=4)
    root = compose(
        "text_files", 32, data_files=str(tmp_path / "corpus" / "*.txt"), val_fraction=0.25
    )
    batch = next(build_data(root.data, seq_len=32, micro_batch_size=2, seed=0).train_batches())
    assert batch["labels"].shape == (2, 32)
    assert (tmp_path / "cache" / "tokens").is_dir()  # the cache went under $FLASHTRAIN_DATA

    root = compose("pathfinder32", 1024, num_samples=20, num_workers=1)
    module = build_data(root.data, seq_len=1024, micro_batch_size=2, seed=0)
    assert next(module.train_batches())["input_ids"].dtype == torch.int64


@pytest.mark.parametrize("name", ["text_files", "long_doc", "bert_mlm"])
def test_missing_mandatory_data_files_is_reported(name):
    """`???` (or null) data_files is a ValueError naming the key, never a file called '???'."""
    root = compose(name, 32)
    with pytest.raises(ValueError, match="data_files"):
        build_data(root.data, seq_len=32, micro_batch_size=2, seed=0)
