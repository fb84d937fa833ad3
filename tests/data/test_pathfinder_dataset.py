"""Pathfinder cached on disk, as a datasets.DatasetDict, and as a classification DataModule."""

import numpy as np
import pytest
import torch

import flashtrain.data.pathfinder.cache as pfc
import flashtrain.data.pathfinder.dataset as pfd
from flashtrain.data import build_data
from flashtrain.data.pathfinder import generate_pathfinder


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("pf")


def test_cache_is_written_once_atomically_and_verified(root, monkeypatch):
    images, labels = pfc.load_or_generate(root, 32, 6, 40, seed=4, num_workers=1, progress=False)
    expected, expected_labels = generate_pathfinder(40, 32, 6, seed=4, num_workers=1)
    assert np.array_equal(images, expected) and np.array_equal(labels, expected_labels)
    directory = pfc.pathfinder_cache_dir(root, 32, 6, 40, 4)
    assert sorted(p.name for p in directory.iterdir()) == ["images.npy", "labels.npy", "meta.json"]
    assert not [p for p in directory.parent.iterdir() if p.name.endswith(".tmp")]

    def must_not_run(*args, **kwargs):
        raise AssertionError("regenerated although cached")

    monkeypatch.setattr(pfc, "generate_cache", must_not_run)
    again, _ = pfc.load_or_generate(root, 32, 6, 40, seed=4, progress=False)
    assert np.array_equal(again, expected)
    path = directory / "images.npy"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="damaged"):
        pfc.load_or_generate(root, 32, 6, 40, seed=4, progress=False)


def test_dataset_splits_are_80_10_10_and_balanced(root):
    images, labels = generate_pathfinder(40, 32, 6, seed=5, num_workers=1)
    splits = pfd.pathfinder_dataset(images, labels)
    assert {k: len(v) for k, v in splits.items()} == {"train": 32, "validation": 4, "test": 4}
    assert splits["train"].features["label"].names == ["different", "same"]
    pixels = splits["train"].data.table.column("pixels").chunk(0).values
    assert pixels.buffers()[1].address == images.ctypes.data  # wraps the array, no copy
    for name, (lo, hi) in pfd.split_ranges(40).items():
        part = splits[name].with_format("numpy")[:]
        assert np.array_equal(part["pixels"], images[lo:hi].reshape(hi - lo, -1))
        assert part["label"].sum() * 2 == hi - lo  # exactly half positive
    shuffled = splits["train"].shuffle(seed=0)  # standard datasets operations work
    assert sorted(shuffled["label"]) == sorted(splits["train"]["label"])


def test_datamodule_batches_ranks_and_seq_len_check(root):
    cfg = {
        "loader": "pathfinder",
        "name": "pathfinder32",
        "resolution": 32,
        "num_samples": 40,
        "contour_length": 6,
        "generator_seed": 6,
        "cache_dir": str(root),
    }
    with pytest.raises(ValueError, match="seq_len=1024"):
        build_data(cfg, seq_len=512, micro_batch_size=4, seed=0)
    module = build_data(cfg, seq_len=1024, micro_batch_size=4, seed=0)
    assert (module.task, module.num_classes, module.vocab_size) == ("classification", 2, 256)
    batch = next(module.train_batches())
    assert batch["input_ids"].shape == (4, 1024) and batch["input_ids"].dtype == torch.int64
    assert batch["labels"].shape == (4,) and int(batch["input_ids"].max()) <= 255
    val = [b["labels"] for b in module.val_batches()]
    assert all(torch.equal(a, b["labels"]) for a, b in zip(val, module.val_batches()))
    assert sum(len(b["labels"]) for b in module.test_batches()) == 4
    shares = [
        module.sampler.epoch_items(0).tolist(),
        build_data(cfg, seq_len=1024, micro_batch_size=4, seed=0, rank=1, world_size=2)
        .sampler.epoch_items(0)
        .tolist(),
    ]
    assert len(shares[0]) == 32
    rank0 = build_data(cfg, seq_len=1024, micro_batch_size=4, seed=0, rank=0, world_size=2)
    assert set(rank0.sampler.epoch_items(0).tolist()).isdisjoint(shares[1])
