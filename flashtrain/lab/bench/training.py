"""Training throughput for the GPU suite (GPT-2 small, Llama ~125M): the real trainer
(flashtrain.train.Trainer on a Hydra-composed configs/train.yaml), tokens/s, MFU and peak memory
from its metrics file, and a torch.profiler split of a few steps into loss, matmuls, attention,
elementwise and idle."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import torch

from flashtrain.lab.checkout import CONFIGS
from flashtrain.train.metric_names import MFU, TOKENS_PER_S, TRAIN_LOSS, canonical_row

CATEGORIES = {  # first match wins; names of CUDA kernels and of aten ops (CPU)
    "attention": r"attn|attention|flash|fmha|sdpa|_fwd_kernel|_bwd_kernel|dkdv|_dq",
    "loss": r"cross_entropy|nll_loss|log_softmax|linear_cross_entropy|_lce",
    "matmul": r"gemm|matmul|aten::mm|addmm|bmm|aten::linear|cutlass|nvjet|xmma|sm90_|sm80_",
}


def compose(overrides: list[str]):
    """configs/train.yaml with overrides, as train.py composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from flashtrain.train import register_schemas

    register_schemas()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


# The measured models at GPT-2's vocabulary (so the two compare at the same size), and the tiny
# stand-ins of the dry run.
MODELS = {"gpt2": ("model=gpt2",), "llama-125m": ("model=llama-125m",)}
DRY_MODELS = {
    "gpt2": ("model=gpt2-tiny", "model.n_layer=2", "model.n_head=2", "model.d_model=64"),
    "llama-125m": ("model=llama-tiny", "model.n_layer=2", "model.d_model=64"),
}


def overrides_for(model: str, seqlen: int, attention: str, compile_: bool, steps: int,
                  dry_run: bool) -> list[str]:  # fmt: skip
    """`model` (a MODELS key) on the synthetic data, ~16K tokens a step; the dry run shrinks
    everything to the tiny model of the same family on CPU."""
    base = [
        f"attention={attention}",
        f"seq_len={seqlen}",
        f"trainer.max_steps={steps}",
        f"trainer.compile={str(compile_).lower()}",
        "trainer.log_interval=1",
        "trainer.eval_interval=0",
        "trainer.eval_at_end=false",
        "trainer.ckpt_interval=0",
        "trainer.ckpt_at_end=false",
        "trainer.progress=lines",
        "logger=none",
        "data=synthetic",
    ]
    if dry_run:
        return base + [*DRY_MODELS[model], "micro_batch_size=2", "global_batch_size=2",
                       "trainer.device=cpu"]  # fmt: skip
    micro = max(1, 16384 // seqlen)
    return base + [
        *MODELS[model],
        "data.vocab_size=50257",
        f"micro_batch_size={micro}",
        f"global_batch_size={micro}",
    ]


def _category(name: str) -> str:
    for category, pattern in CATEGORIES.items():
        if re.search(pattern, name, re.I):
            return category
    return "elementwise/other"


def step_split(prof, cuda: bool) -> dict[str, float]:
    """Milliseconds per profiled step by category; idle = step wall time not covered by kernels
    (CUDA) or by aten ops' own time (CPU)."""
    steps = [e for e in prof.key_averages() if e.key.startswith("ProfilerStep")]
    wall_us = sum(e.cpu_time_total for e in steps)
    n_steps = max(1, sum(e.count for e in steps))
    split: dict[str, float] = {}
    for e in prof.key_averages():
        if e.key.startswith("ProfilerStep"):
            continue
        if cuda:
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
        else:
            if not e.key.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
        cat = _category(e.key)
        split[cat] = split.get(cat, 0.0) + us / 1e3 / n_steps
    split["idle"] = max(0.0, wall_us / 1e3 / n_steps - sum(split.values()))
    return {k: round(v, 3) for k, v in split.items()}


def run_training(model, seqlen, attention, compile_, steps, run_dir: Path, dry_run: bool) -> dict:
    """One trainer run: median tokens/s and MFU of the steps before the profiled ones, peak
    memory, and the profiler split of the last few steps."""
    from flashtrain.train import Trainer

    cfg = compose(overrides_for(model, seqlen, attention, compile_, steps, dry_run))
    cuda = torch.cuda.is_available() and not dry_run
    active = max(1, min(4, steps // 4))
    wait = steps - active - 1
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=wait, warmup=1, active=active, repeat=1),
    )

    class ProfiledTrainer(Trainer):
        def _train_step(self, preempt):
            stop = super()._train_step(preempt)
            prof.step()
            return stop

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = ProfiledTrainer(cfg, run_dir)
    ok = False
    try:
        with prof:
            trainer.fit()
        ok = True
    finally:
        trainer.close(clean=ok)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [canonical_row(json.loads(line)) for line in lines]
    timed = [r for r in rows if TOKENS_PER_S in r and 2 < r["step"] <= wait] or rows[-1:]
    return {
        "model": model,
        "seqlen": seqlen,
        "attention": attention,
        "compile": compile_,
        "steps": steps,
        "tokens_per_s": statistics.median(r[TOKENS_PER_S] for r in timed),
        "mfu_percent": statistics.median(r.get(MFU, float("nan")) for r in timed),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "step_split_ms": step_split(prof, cuda),
        "final_loss": rows[-1].get(TRAIN_LOSS),
    }
