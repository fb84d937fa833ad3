"""Inference tests share checkpoints written by short `python train.py` runs of a tiny GPT-2:
one on the default data (synthetic recall), one on a byte-level text corpus. They run on the
PyTorch attention path; test_generate's `route` fixture runs the cache tests on both routes."""

from __future__ import annotations

from pathlib import Path

import pytest
from inference_testing import train


@pytest.fixture(autouse=True)
def _torch_attention(monkeypatch):
    """The PyTorch attention path unless a test picks a route itself (test_generate's `route`):
    these tests check generation and evaluation, and the interpreter would make them slow."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")


@pytest.fixture(scope="session")
def recall_run(tmp_path_factory) -> Path:
    """A run directory with a checkpoint of the default data (synthetic recall)."""
    return train(tmp_path_factory.mktemp("runs") / "recall")


@pytest.fixture(scope="session")
def text_run(tmp_path_factory) -> Path:
    """A run directory with a checkpoint of a byte-level text corpus (data=text_files, one
    document per line, a private cache folder)."""
    root = tmp_path_factory.mktemp("text")
    corpus = root / "corpus.txt"
    lines = [
        f"line {i}: the quick brown fox {i % 7} jumps over the lazy dog {i % 5}."
        for i in range(600)
    ]
    corpus.write_text("\n".join(lines) + "\n")
    return train(
        root / "run", "data=text_files", f"data.data_files={corpus}", "data.sample_by=line",
        "data.val_fraction=0.2", f"data.cache_dir={root / 'cache'}",
    )  # fmt: skip
