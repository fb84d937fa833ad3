"""Trainer tests: every run uses the PyTorch attention path (FLASHTRAIN_CPU_ATTENTION=torch);
these tests check the trainer, not the kernels, and the Triton interpreter would make them far
too slow. Tests marked slow are deselected by default (pyproject addopts); `pytest -m slow`.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _torch_attention(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
