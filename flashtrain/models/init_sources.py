"""Where `model.init_from` reads weights from, beyond a plain torch file: by prefix, or a folder.

A package above the models registers the loaders, so the models never import upward:

    register_init_source("hf:", load)      # flashtrain.hf: transformers checkpoints
    register_folder_source(load)           # flashtrain.train: a trainer checkpoint folder
                                           # (a step folder or a checkpoints folder)

Each `load(ref, model)` returns a state dict in the model's names. The trainer imports both
packages (flashtrain.train always, flashtrain.hf for a config that names "hf:").
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

InitLoader = Callable[[str, torch.nn.Module], dict[str, torch.Tensor]]

INIT_SOURCES: dict[str, InitLoader] = {}
KNOWN_PREFIXES = {"hf:": "flashtrain.hf"}  # prefix -> the module that registers it
FOLDER_SOURCES: list[InitLoader] = []  # the folder loader, once registered
FOLDER_MODULE = "flashtrain.train"  # the package that registers it


def register_init_source(prefix: str, load: InitLoader) -> None:
    INIT_SOURCES[prefix] = load


def register_folder_source(load: InitLoader) -> None:
    FOLDER_SOURCES[:] = [load]


def init_source_for(ref: str) -> InitLoader | None:
    """The registered loader of `ref`'s prefix, or of a folder; None for a plain file path. A
    known prefix, or a folder, whose module was not imported is a ValueError saying which
    import registers it."""
    for prefix, load in INIT_SOURCES.items():
        if ref.startswith(prefix):
            return load
    for prefix, module in KNOWN_PREFIXES.items():
        if ref.startswith(prefix):
            raise ValueError(
                f"model.init_from={ref!r}: the {prefix!r} source is registered by {module} "
                f"(train.py imports it; in Python: import {module})"
            )
    if os.path.isdir(os.path.expanduser(ref)):
        if not FOLDER_SOURCES:
            raise ValueError(
                f"model.init_from={ref!r} is a folder: trainer checkpoint folders are read by "
                f"{FOLDER_MODULE} (train.py imports it; in Python: import {FOLDER_MODULE})"
            )
        return FOLDER_SOURCES[0]
    return None
