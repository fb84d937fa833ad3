"""Tiny random transformers models for the interop tests (built from configs, never downloaded)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashtrain.train.metric_names import TRAIN_LOSS

transformers = pytest.importorskip("transformers")


def randomise_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights far from any init (attention far from uniform, LayerNorm gains away from 1), so a
    misplaced or transposed tensor shows in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            scale = 0.6 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.2
            p.copy_(noise * scale + (1.0 if p.dim() == 1 and "weight" in _name(model, p) else 0.0))
    return model


def _name(model, param) -> str:
    for name, p in model.named_parameters():
        if p is param:
            return name
    return ""


def tiny_gpt2(seed: int = 0, **overrides):
    cfg = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=40, vocab_size=61,
        bos_token_id=None, eos_token_id=None, **overrides,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return randomise_(transformers.GPT2LMHeadModel(cfg).double(), seed).eval()


def tiny_bert_config(**overrides):
    fields = dict(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=48,
        max_position_embeddings=40, vocab_size=53, type_vocab_size=2, pad_token_id=0,
    )  # fmt: skip
    fields.update(overrides)
    return transformers.BertConfig(**fields)


def tiny_bert_mlm(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(tiny_bert_config(**overrides)).double()
    model.config._attn_implementation = "eager"
    return randomise_(model, seed).eval()


def tiny_bert_classifier(seed: int = 0, num_labels: int = 3):
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(tiny_bert_config(num_labels=num_labels))
    model.config._attn_implementation = "eager"
    return randomise_(model.double(), seed).eval()


def assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


# ---- trainer runs and checkpoints ---------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]

# A GPT-2 small enough for a CPU step in tens of milliseconds (tests/train's TINY).
TINY_RUN = [
    "model=gpt2-tiny",
    "model.n_layer=2",
    "model.n_head=2",
    "model.d_model=64",
    "seq_len=64",
    "micro_batch_size=4",
    "global_batch_size=8",
    "trainer.eval_batches=2",
    "logger=none",
    "trainer.progress=lines",
    "trainer.log_interval=1",
]


def run_train(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLASHTRAIN_CPU_ATTENTION="torch", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def step_losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[TRAIN_LOSS] for r in rows if r.get(TRAIN_LOSS) is not None}


def save_model_checkpoint(root: Path, model, run_config: dict, *, sharded=False, step=1) -> Path:
    """A trainer-format checkpoint of `model` (sharded: the DCP format FSDP2 runs write; here
    from one process), with `run_config` as its config.yaml."""
    from omegaconf import OmegaConf

    from flashtrain.checkpoint.write import save_checkpoint

    optimizer = torch.optim.AdamW(model.parameters())
    meta = {"model_config": dataclasses.asdict(model.config), "run_name": "test"}
    return save_checkpoint(
        root, step, model=model, optimizer=optimizer, trainer_state={}, meta=meta,
        config_yaml=OmegaConf.to_yaml(run_config), sharded=sharded,
    )  # fmt: skip
