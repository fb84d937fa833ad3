"""Pathfinder as a `datasets.DatasetDict` and as a classification DataModule.

The images come from the cache on disk (cache.py: generated once, resumable). The
DatasetDict wraps the memory-mapped arrays without copying: train / validation / test = the first 80%, next 10%, last 10% (even
sizes, and since consecutive image pairs hold one label each, every split is exactly balanced).
Batches: input_ids = the R * R pixel intensities (0..255) in row-major order, labels 0/1.
"""

from __future__ import annotations

import numpy as np
import torch

from flashtrain.data.config import PathfinderConfig, cache_root
from flashtrain.data.module import DataRun, EvalBatches, SampledDataModule, eval_items
from flashtrain.data.pathfinder.cache import load_or_generate, pathfinder_cache_dir
from flashtrain.data.pathfinder.generator import all_cores
from flashtrain.data.sampling import EpochSampler

CLASS_NAMES = ["different", "same"]


def split_ranges(num: int) -> dict[str, tuple[int, int]]:
    """80/10/10 contiguous ranges with even sizes for validation and test."""
    held_out = 2 * (num // 20)  # 10%, rounded down to an even count
    train = num - 2 * held_out
    return {
        "train": (0, train),
        "validation": (train, train + held_out),
        "test": (train + held_out, num),
    }


def pathfinder_dataset(images: np.ndarray, labels: np.ndarray):
    """A datasets.DatasetDict (train / validation / test) over the arrays, without copying them:
    columns `pixels` (R * R uint8, row-major) and `label` (ClassLabel different / same)."""
    import pyarrow as pa
    from datasets import ClassLabel, Dataset, DatasetDict, DatasetInfo, Features, List, Value
    from datasets.table import InMemoryTable

    num, size = images.shape[0], images.shape[1]
    features = Features(
        {"pixels": List(Value("uint8"), length=size * size), "label": ClassLabel(names=CLASS_NAMES)}
    )
    # Arrow arrays over the numpy buffers (zero-copy), already in the schema of `features`, so
    # `datasets` neither casts nor copies them.
    flat = pa.array(np.asarray(images).reshape(-1))
    pixels = pa.FixedSizeListArray.from_arrays(flat, size * size)
    labels = pa.array(np.asarray(labels, dtype=np.int64))
    table = pa.table({"pixels": pixels, "label": labels}, schema=features.arrow_schema)
    full = Dataset(InMemoryTable(table), info=DatasetInfo(features=features))
    return DatasetDict(
        {name: full.select(range(lo, hi)) for name, (lo, hi) in split_ranges(num).items()}
    )


class PathfinderClassification(SampledDataModule):
    """Path-X style classification: one R x R image = R * R tokens, 2 classes."""

    Config = PathfinderConfig  # its schema (configs/data/*.yaml with loader: pathfinder)

    task = "classification"
    num_classes = 2
    vocab_size = 256

    def __init__(self, cfg: PathfinderConfig, run: DataRun):
        super().__init__(run)
        self.generated_with = {  # with seq_len (= resolution**2): what the images are
            "data.contour_length": cfg.contour_length,
            "data.num_samples": cfg.num_samples,
            "data.generator_seed": cfg.generator_seed,
        }
        images, labels = load_or_generate(
            *self.cache_args(cfg), num_workers=self.workers(cfg), progress=self.rank == 0
        )
        self.dataset = pathfinder_dataset(images, labels).with_format("numpy")
        self.sampler = EpochSampler(
            len(self.dataset["train"]), seed=self.seed, rank=self.rank, world_size=self.world_size
        )

    @classmethod
    def check_run_settings(
        cls, cfg: PathfinderConfig, *, seq_len: int, eval_batches: int | None
    ) -> None:
        """One token per pixel: seq_len is the image's."""
        size = cfg.resolution
        if seq_len != size * size:
            raise ValueError(
                f"{cfg.name} images are {size}x{size} = {size * size} tokens; set "
                f"seq_len={size * size} (got {seq_len})"
            )

    @staticmethod
    def cache_args(cfg: PathfinderConfig) -> tuple:
        """load_or_generate's arguments: (root, resolution, contour_length, num, seed)."""
        settings = (cfg.resolution, cfg.contour_length, cfg.num_samples, cfg.generator_seed)
        return (cache_root(cfg), *settings)

    @staticmethod
    def workers(cfg: PathfinderConfig) -> int | None:
        """Generator processes: data.num_workers; null or 1 generates in this process, so that
        a call works from any script (worker processes need its top level guarded)."""
        return cfg.num_workers

    @classmethod
    def command_line_settings(cls, cfg: PathfinderConfig) -> dict:
        """train.py and scripts/prepare_data.py guard their top level: there null means all
        cores (200K Path-X images take hours in one process)."""
        return {"num_workers": all_cores()} if cfg.num_workers is None else {}

    @classmethod
    def prepare(cls, cfg: PathfinderConfig, *, progress: bool = True) -> dict:
        args = cls.cache_args(cfg)
        images, _ = load_or_generate(*args, num_workers=cls.workers(cfg), progress=progress)
        summary = {
            f"{split}_images": hi - lo for split, (lo, hi) in split_ranges(len(images)).items()
        }
        return summary | {"cache": str(pathfinder_cache_dir(*args))}

    def identity_fields(self) -> dict:
        return dict(self.generated_with)

    def batch(self, split: str, items) -> dict[str, torch.Tensor]:
        rows = self.dataset[split][np.asarray(items).tolist()]
        return {
            "input_ids": torch.from_numpy(rows["pixels"].astype(np.int64)),
            "labels": torch.from_numpy(rows["label"].astype(np.int64)),
        }

    def make_batch(self, epochs, items):
        return self.batch("train", items)

    def _eval_batches(self, split: str) -> EvalBatches:
        mine = eval_items(
            len(self.dataset[split]), self.rank, self.world_size, f"pathfinder {split}"
        )
        return EvalBatches(
            lambda items: self.batch(split, items),
            mine,
            self.micro_batch_size,
            self.eval_batches,
        )

    def val_batches(self):
        return self._eval_batches("validation")

    def test_batches(self):
        """The held-out 10% (report accuracy on it once, at the end)."""
        return self._eval_batches("test")
