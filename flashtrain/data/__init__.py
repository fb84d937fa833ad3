"""flashtrain.data: LM corpora and token caches, BERT MLM data, Pathfinder, synthetic tasks.

    build_data(data_cfg, *, seq_len, micro_batch_size, seed, rank=0, world_size=1, eval_batches=None)
    prepare_data(data_cfg) -> summary of the caches made (scripts/prepare_data.py)
    flashtrain.data.pathfinder.generate_pathfinder(num, resolution=128, contour_length=14, seed=0)

Imports are lazy so that `import flashtrain.data.pathfinder` (e.g. in generator worker
processes) does not pull in torch or `datasets`.
"""

from __future__ import annotations

__all__ = ["DataModule", "build_data", "prepare_data"]


def __getattr__(name: str):
    if name in ("build_data", "prepare_data"):
        from flashtrain.data import registry

        return getattr(registry, name)
    if name == "DataModule":
        from flashtrain.data.module import DataModule

        return DataModule
    raise AttributeError(f"module 'flashtrain.data' has no attribute '{name}'")
