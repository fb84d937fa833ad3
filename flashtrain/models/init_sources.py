"""Where `model.init_from` reads weights from, by prefix, beyond a plain torch file.

A package above the models registers a loader for its prefix (flashtrain.hf registers "hf:" for
transformers checkpoints when it is imported; the trainer imports it for a
config that names one), so the models never import upward:

    register_init_source("hf:", load)      # load(ref, model) -> a state dict in the model's names
"""

from __future__ import annotations

from collections.abc import Callable

import torch

InitLoader = Callable[[str, torch.nn.Module], dict[str, torch.Tensor]]

INIT_SOURCES: dict[str, InitLoader] = {}
KNOWN_PREFIXES = {"hf:": "flashtrain.hf"}  # prefix -> the module that registers it


def register_init_source(prefix: str, load: InitLoader) -> None:
    INIT_SOURCES[prefix] = load


def init_source_for(ref: str) -> InitLoader | None:
    """The registered loader of `ref`'s prefix; None for a plain file path. A known prefix whose
    module was not imported is a ValueError saying which import registers it."""
    for prefix, load in INIT_SOURCES.items():
        if ref.startswith(prefix):
            return load
    for prefix, module in KNOWN_PREFIXES.items():
        if ref.startswith(prefix):
            raise ValueError(
                f"model.init_from={ref!r}: the {prefix!r} source is registered by {module} "
                f"(train.py imports it; in Python: import {module})"
            )
    return None
