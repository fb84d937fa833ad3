"""Helpers of the inference tests: short `python train.py` runs of a tiny GPT-2, and a tiny
Llama with every option the KV cache and the head must honour."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from flashtrain.models import build_model

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


def tiny_llama(seed: int = 0, final_logit_softcap: float | None = 1.0, vocab_size: int = 23):
    """A random Llama-family decoder with GQA (4 query heads over 2 K/V heads), a sliding window
    of 5 tokens and both Gemma-2 softcaps (the final one small enough to change every logit);
    weights scaled up so that the next token depends on the context."""
    torch.manual_seed(seed)
    cfg = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=48,
               max_seq_len=64, vocab_size=vocab_size, rope_theta=10000.0, sliding_window=5,
               attn_logit_softcap=2.0, final_logit_softcap=final_logit_softcap,
               loss_impl="chunked")  # fmt: skip
    model = build_model(cfg, "flash").eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.4)
    return model
