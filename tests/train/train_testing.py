"""Helpers for the trainer tests: tiny-model overrides, subprocess runs, metrics files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from config_testing import REPO

from flashtrain.train.metric_names import TRAIN_LOSS

# A GPT-2 small enough for a CPU step in tens of milliseconds.
TINY = [
    "model=gpt2-tiny",
    "model.n_layer=2",
    "model.n_head=2",
    "model.d_model=64",
    "seq_len=64",
    "micro_batch_size=4",
    "global_batch_size=8",
    "trainer.eval_batches=4",
    "logger=none",
    "trainer.progress=lines",
    "trainer.log_interval=1",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FLASHTRAIN_CPU_ATTENTION="torch",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1",
    )
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "WANDB_MODE"):
        env.pop(key, None)
    env.update(extra)
    return env


# A child's time limit, a hang guard: a tiny train.py run takes seconds on 2 idle cores and
# minutes on a loaded machine (a limit that load can meet fails tests that are right).
HANG_GUARD_S = 900


def run_train(args: list[str], cwd: Path, *, timeout: float = HANG_GUARD_S, nproc: int = 0,
              env=None):  # fmt: skip
    """`python train.py args` (or under torchrun with nproc processes) in cwd."""
    if nproc:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={free_port()}",
            "--monitor-interval=0.2",
            str(REPO / "train.py"),
        ]
    else:
        cmd = [sys.executable, str(REPO / "train.py")]
    return subprocess.run(
        cmd + list(args),
        cwd=cwd,
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def step_losses(path: Path) -> dict[int, float]:
    """{step: train/loss} from a metrics.jsonl written with trainer.log_interval=1."""
    return {r["step"]: r[TRAIN_LOSS] for r in read_metrics(path) if r.get(TRAIN_LOSS) is not None}
