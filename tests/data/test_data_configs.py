"""configs/data/*.yaml: the names the trainer uses, the schema each picks, and building from the
config Hydra composes (a typed DictConfig whose interpolations resolve against the root)."""

import pytest
import torch
from config_testing import CONFIGS, compose, group_options
from data_testing import write_text_corpus
from omegaconf import OmegaConf

from flashtrain.data import build_data
from flashtrain.data.registry import DATA_CONFIGS, data_config

EXPECTED = {
    "synthetic": "synthetic",
    "text_files": "lm_corpus",
    "openwebtext": "lm_corpus",
    "wikitext103": "lm_corpus",
    "pg19": "lm_corpus",
    "bert_mlm": "mlm",
    "pysrc_mlm": "mlm",
    "pathfinder32": "pathfinder",
    "pathfinder64": "pathfinder",
    "pathx": "pathfinder",
    "path256": "pathfinder",
    "long_doc": "long_doc",
    "retrieval": "retrieval",
}
CLASSIFICATION = {"pathfinder32": 2, "pathfinder64": 2, "pathx": 2, "path256": 2, "long_doc": 2}


def test_every_expected_config_exists_and_every_loader_has_one():
    assert set(EXPECTED) <= set(group_options("data"))
    assert set(EXPECTED.values()) == set(DATA_CONFIGS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_option_picks_its_loaders_schema(name):
    data = compose([f"data={name}"]).data
    cfg = data_config(data)
    assert type(cfg) is DATA_CONFIGS[EXPECTED[name]] and cfg.loader == EXPECTED[name]
    assert cfg.name == name and isinstance(cfg.vocab_size, int)
    if name in CLASSIFICATION:
        assert cfg.num_classes == CLASSIFICATION[name]
    raw = OmegaConf.load(CONFIGS / "data" / f"{name}.yaml")
    assert raw.defaults[0] == f"/schema/data/{EXPECTED[name]}@_here_"
    defaults = DATA_CONFIGS[EXPECTED[name]]()
    repeated = [k for k in raw if k != "defaults" and raw[k] == getattr(defaults, k)]
    assert not repeated, f"{name}.yaml repeats its dataclass's defaults: {repeated}"
    assert "${seq_len}" not in (CONFIGS / "data" / f"{name}.yaml").read_text()


def test_a_misspelled_key_fails_naming_it_and_the_allowed():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as error:
        compose(["data=openwebtext", "data.val_fractoin=0.1"])
    assert "val_fractoin" in str(error.value.__cause__)
    with pytest.raises(ValueError, match=r"unknown key 'data.val_fractoin'.*val_fraction"):
        data_config(compose(["data=openwebtext", "+data.val_fractoin=0.1"]).data)


def test_default_synthetic_config_builds_from_the_composed_config():
    root = compose(["seq_len=128"])
    module = build_data(root.data, seq_len=root.seq_len, micro_batch_size=2, seed=0, eval_batches=1)
    batch = next(module.train_batches())
    assert batch["input_ids"].shape == (2, 128) and module.vocab_size == root.data.vocab_size
    assert int(batch["input_ids"].max()) < module.vocab_size


def test_text_files_and_pathfinder_configs_build_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_DATA", str(tmp_path / "cache"))
    write_text_corpus(tmp_path / "corpus", docs=4)
    files = tmp_path / "corpus" / "*.txt"
    data = compose(["data=text_files", f"data.data_files={files}", "data.val_fraction=0.25"]).data
    batch = next(build_data(data, seq_len=32, micro_batch_size=2, seed=0).train_batches())
    assert batch["labels"].shape == (2, 32)
    assert (tmp_path / "cache" / "tokens").is_dir()  # the cache went under $FLASHTRAIN_DATA

    data = compose(["data=pathfinder32", "data.num_samples=20", "data.num_workers=1"]).data
    module = build_data(data, seq_len=1024, micro_batch_size=2, seed=0)
    assert next(module.train_batches())["input_ids"].dtype == torch.int64


@pytest.mark.parametrize("name", ["text_files", "long_doc", "bert_mlm"])
def test_missing_data_files_is_reported(name):
    """A corpus without data_files (nor hub_name) is a ValueError naming the key."""
    data = compose([f"data={name}"]).data
    with pytest.raises(ValueError, match="data_files"):
        build_data(data, seq_len=32, micro_batch_size=2, seed=0)
