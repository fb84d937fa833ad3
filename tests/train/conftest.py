"""Trainer tests: every run uses the PyTorch attention path (FLASHTRAIN_CPU_ATTENTION=torch);
these tests check the trainer, not the kernels, and the Triton interpreter would make them far
too slow. Tests marked slow are deselected by default (pyproject addopts); `pytest -m slow`.
"""

from __future__ import annotations

import pytest
import train_testing  # noqa: F401  (puts the repository on sys.path)


@pytest.fixture(autouse=True)
def _torch_attention(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: the test models are tiny, and on a busy 2-core machine two OpenMP
    threads spin against each other and make every op many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
