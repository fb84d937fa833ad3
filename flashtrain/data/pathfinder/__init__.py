"""Pathfinder (Long Range Arena's Path-X / Path-256 task), generated here: no download.

    generator.py  the images: contours, markers, labels; in-process or over worker processes
    geometry.py   the vectorised 2-D geometry the generator draws with
    cache.py      the resumable image cache on disk (memory-mapped)
    dataset.py    a `datasets.DatasetDict` and the classification DataModule over the cache

    from flashtrain.data.pathfinder import generate_pathfinder
    images, labels = generate_pathfinder(200, resolution=32, contour_length=6)

The cache and dataset names load lazily: generator worker processes import this package and
need neither torch nor `datasets`.
"""

from __future__ import annotations

from flashtrain.data.pathfinder.generator import (
    CONTOUR_LENGTHS,
    GENERATOR_VERSION,
    RESOLUTIONS,
    PathfinderRecord,
    generate_pathfinder,
    generate_pathfinder_into,
)

_LAZY = {
    "load_or_generate": "cache",
    "pathfinder_cache_dir": "cache",
    "CLASS_NAMES": "dataset",
    "PathfinderClassification": "dataset",
    "pathfinder_dataset": "dataset",
    "split_ranges": "dataset",
}

__all__ = [
    "CONTOUR_LENGTHS",
    "GENERATOR_VERSION",
    "RESOLUTIONS",
    "PathfinderRecord",
    "generate_pathfinder",
    "generate_pathfinder_into",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
