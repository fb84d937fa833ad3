"""A test's own Hugging Face hub cache.

huggingface_hub reads HF_HUB_CACHE (HF_HOME, ...) once, when it is imported, and flashtrain
follows the library's constants.HF_HUB_CACHE (flashtrain/data/hub.py): a test that points the
cache elsewhere sets that constant, and the environment variable for the processes it starts.
"""

from __future__ import annotations

from pathlib import Path


def use_hub_cache(monkeypatch, cache: Path) -> Path:
    """Make `cache` the hub cache of this process and of the processes it starts."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache
