"""Data config helpers: the cache directory, required keys, vocab sizes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEFAULT_CACHE_ROOT = "data_cache"  # relative to the working directory; FLASHTRAIN_DATA overrides


def cache_root(cfg: dict) -> Path:
    """The configured cache directory (`cache_dir`), else $FLASHTRAIN_DATA, else ./data_cache."""
    root = cfg.get("cache_dir") or os.environ.get("FLASHTRAIN_DATA") or DEFAULT_CACHE_ROOT
    return Path(root).expanduser()


def require(cfg: dict, key: str, what: str) -> Any:
    if cfg.get(key) is None:
        raise ValueError(f"data config '{cfg.get('name', '?')}' needs `{key}`: {what}")
    return cfg[key]


def check_vocab_size(cfg: dict, needed: int, tokenizer_name: str) -> int:
    """The configured vocab_size (may exceed the tokenizer's for GPU-friendly padding)."""
    size = cfg.get("vocab_size")
    if size is None:
        return needed
    if int(size) < needed:
        raise ValueError(
            f"data.vocab_size={size} is smaller than the {needed} ids of tokenizer "
            f"'{tokenizer_name}'; set data.vocab_size >= {needed}"
        )
    return int(size)
