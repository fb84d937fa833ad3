"""Inference tests share checkpoints written by short `python train.py` runs of a tiny GPT-2:
one on the default data (synthetic recall), one on a byte-level text corpus."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A GPT-2 small enough for a CPU step in tens of milliseconds.
TINY = [
    "model.n_layer=2",
    "model.n_head=2",
    "model.d_model=64",
    "seq_len=64",
    "micro_batch_size=4",
    "global_batch_size=8",
    "trainer.eval_batches=2",
    "trainer.max_steps=6",
    "trainer.eval_interval=0",
    "logger=none",
]


def train(run_dir: Path, *overrides: str, tiny: bool = True, timeout: float = 300) -> Path:
    """`python train.py [TINY] overrides` into run_dir (PyTorch attention path, no logger);
    returns run_dir."""
    env = dict(os.environ, FLASHTRAIN_CPU_ATTENTION="torch", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO), WANDB_MODE="disabled")  # fmt: skip
    run = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *(TINY if tiny else ["logger=none"]), *overrides,
         f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run_dir


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
