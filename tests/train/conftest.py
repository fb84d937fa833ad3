"""Trainer tests: every run uses the PyTorch attention path (FLASHTRAIN_CPU_ATTENTION=torch);
these tests check the trainer, not the kernels, and the Triton interpreter would make them far
too slow. Tests marked slow are deselected by default (pyproject addopts); `pytest -m slow`.

Set for each module before its module-scoped fixtures (autouse runs first within a scope), so
the runs those fixtures train take the PyTorch path too; each test sees it as well.
"""

from __future__ import annotations

import pytest

TRAINER_ENV_UNSET = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_MODE")


@pytest.fixture(scope="module", autouse=True)
def _torch_attention():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
        for key in TRAINER_ENV_UNSET:
            mp.delenv(key, raising=False)
        yield


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch):
    """Each test starts without a launcher's or wandb's variables, whatever the last one set."""
    for key in TRAINER_ENV_UNSET:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
