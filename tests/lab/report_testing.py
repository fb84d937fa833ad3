"""Run folders written by hand, as train.py (run.json: flashtrain/checkpoint/run_info.py),
bench_attention.py and reproduce.py write them."""

from __future__ import annotations

import json
import math
from pathlib import Path

from omegaconf import OmegaConf

CPU_RUN = {"device": "CPU (2 threads)", "commit": "abcdef1234567", "commits": ["abcdef1234567"]}
GPU_RUN = {
    "device": "8 x NVIDIA H100 80GB HBM3",
    "commit": "1234567890ab",
    "commits": ["1234567890ab"],
}


def write_run(
    run_dir: Path,
    config: dict,
    train: list[dict] = (),
    evals: list[dict] = (),
    run_info: dict = CPU_RUN,
    launch: dict | None = None,
) -> Path:
    """A train run folder; `train` / `evals` rows are written in order (eval after its step)."""
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), run_dir / ".hydra" / "config.yaml")
    rows = sorted(
        [*train, *evals], key=lambda r: (r["step"], any(k.startswith("eval/") for k in r))
    )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "run.json").write_text(json.dumps(run_info))
    if launch is not None:
        (run_dir / "reproduce.json").write_text(json.dumps(launch))
    return run_dir


def launch(experiment: str, scale: str = "tiny", data=None) -> dict:
    return {
        "experiment": experiment,
        "scale": scale,
        "data": data,
        "kind": "train",
        "launches": [{"command": "python train.py", "exit_code": 0}],
    }


def lm_config(data: dict, seq_len: int, max_steps: int = 20, impl: str = "flash") -> dict:
    return {
        "seq_len": seq_len,
        "model": {"arch": "gpt2", "name": "gpt2-tiny"},
        "attention": {"impl": impl},
        "data": data,
        "trainer": {"max_steps": max_steps},
    }


def lm_curve(final_loss: float, steps: int, tokens_per_step: int, extra=None) -> list[dict]:
    """Train rows every 10 steps falling to final_loss."""
    return [
        {
            "step": s,
            "loss": final_loss + 1.0 / s,
            "tokens_seen": float(s * tokens_per_step),
            "step_time_s": 0.5,
            "memory/max_rss_gib": 1.0,
            **(extra or {}),
        }
        for s in range(10, steps + 1, 10)
    ]


def lm_eval(step: int, loss: float) -> dict:
    return {"step": step, "eval/loss": loss, "eval/ppl": math.exp(loss)}
