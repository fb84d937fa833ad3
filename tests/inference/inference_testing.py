"""Helpers of the inference tests: short `python train.py` runs of a tiny GPT-2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
