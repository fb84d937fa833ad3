"""Run folders written by hand, as train.py (run.json: flashtrain/checkpoint/run_info.py),
bench_attention.py and reproduce.py write them. Metric rows carry today's names
(flashtrain/train/metric_names.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from omegaconf import OmegaConf

from flashtrain.train.metric_names import STEP_TIME_S, TRAIN_LOSS, TRAIN_TOKENS_SEEN

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
    model_choice: str | None = None,
) -> Path:
    """A train run folder; `train` / `evals` rows are written in order (eval after its step).
    model_choice: the model config Hydra records as chosen (.hydra/hydra.yaml), e.g. "gpt2-tiny"."""
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), run_dir / ".hydra" / "config.yaml")
    if model_choice is not None:
        # The slice of hydra.yaml the reports read; the real one interpolates Hydra's runtime.
        hydra = {"hydra": {"run": {"dir": "${now:%H-%M-%S}"}, "runtime": {"choices": {}}}}
        hydra["hydra"]["runtime"]["choices"] = {"model": model_choice, "hydra/env": "default"}
        OmegaConf.save(OmegaConf.create(hydra), run_dir / ".hydra" / "hydra.yaml")
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


def lm_config(
    data: dict, seq_len: int, max_steps: int = 20, impl: str = "flash", arch: str = "gpt2"
) -> dict:
    return {
        "seq_len": seq_len,
        "model": {"arch": arch, "n_layer": 2, "d_model": 128},
        "attention": {"impl": impl},
        "data": data,
        "trainer": {"max_steps": max_steps},
    }


def lm_curve(final_loss: float, steps: int, tokens_per_step: int, extra=None) -> list[dict]:
    """Train rows every 10 steps falling to final_loss."""
    return [
        {
            "step": s,
            TRAIN_LOSS: final_loss + 1.0 / s,
            TRAIN_TOKENS_SEEN: float(s * tokens_per_step),
            STEP_TIME_S: 0.5,
            "memory/max_rss_gib": 1.0,
            **(extra or {}),
        }
        for s in range(10, steps + 1, 10)
    ]


def lm_eval(step: int, loss: float) -> dict:
    return {"step": step, "eval/loss": loss, "eval/ppl": math.exp(loss)}
