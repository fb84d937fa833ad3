"""Where a training step's time goes: loss, matmuls, attention, elementwise, data and idle.

    python scripts/profile_step.py model=gpt2 seq_len=1024 micro_batch_size=1 global_batch_size=1
    python scripts/profile_step.py --steps 5 --warmup 2 --out /tmp/prof experiment=owt/gpt2s-1k

The arguments after the options are Hydra overrides of configs/train.yaml, as for train.py (the
data is built as the run would build it). The trainer runs warmup + steps optimizer steps under
torch.profiler; only the last `steps` are measured, and only what runs inside a step.

Buckets. On CPU an op's self time (its own work, not its children's) counts; on CUDA the time of
the kernels an op launched. Each op goes to the first bucket that claims it:
  data        inside flashtrain::data (waiting for the prefetch thread, host-to-device copies)
  loss        inside flashtrain::loss or a cross-entropy autograd node (its matmuls included)
  attention   inside the attention custom ops (flashtrain::attention_*) or their backward
  matmuls     mm / addmm / bmm / matmul / linear ops (and GEMM kernels) elsewhere
  elementwise every other op (layer norms, GELU, adds, the optimizer, copies)
  idle        step wall time that no op (CPU) or no kernel (CUDA) accounts for: Python, the
              dispatcher, launch gaps, waiting
Writes step-<device>-<tag>.json (device, torch, triton, commit, the overrides) and .md under
--out (default benchmarks/results/) and prints the table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import defaultdict
from datetime import date
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from flashtrain.lab.bench import measure, results
from flashtrain.lab.checkout import CONFIGS, RESULTS

BUCKETS = ("loss", "matmuls", "attention", "elementwise", "data", "idle")
STEP_RANGE = "flashtrain::step"
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"}
MATMUL_OPS |= {
    "aten::linear",
    "aten::_addmm_activation",
    "aten::addbmm",
    "aten::addmm_",
    "aten::baddbmm_",
}
TOP_OPS = 5  # the heaviest ops listed per bucket


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=3, help="measured optimizer steps")
    p.add_argument("--warmup", type=int, default=1, help="steps run before measuring")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--tag", default=str(date.today()), help="file name suffix")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (key=value)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    return args


def compose_config(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from flashtrain.train import register_schemas

    register_schemas()

    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=overrides)


def _ancestry(event):
    while event is not None:
        yield event.name
        event = event.cpu_parent


def bucket_of(names: list[str]) -> str | None:
    """The bucket of an op given its name and its ancestors' (innermost first); None: outside
    a step (not measured)."""
    if STEP_RANGE not in names:
        return None
    lowered = [n.lower() for n in names]
    if any(n.startswith("flashtrain::data") for n in names):
        return "data"
    if any(n == "flashtrain::loss" or "crossentropy" in n for n in lowered):
        return "loss"
    if any(n.startswith("flashtrain::attention") or "attention" in n for n in lowered):
        return "attention"
    if names[0] in MATMUL_OPS:
        return "matmuls"
    return "elementwise"


def _busy_us(event, on_cuda: bool) -> float:
    """An op's own time: its kernels' on CUDA; on CPU its self time, counting ATen ops only
    (a Python range's or autograd wrapper's self time is overhead: idle)."""
    if on_cuda:
        return float(event.self_device_time_total)
    return float(event.self_cpu_time_total) if event.name.startswith("aten::") else 0.0


def classify(events, on_cuda: bool, steps: int) -> dict:
    """Milliseconds per step by bucket, and the heaviest ops in each."""
    step_us = sum(e.cpu_time_total for e in events if e.name == STEP_RANGE)
    busy: dict[str, float] = defaultdict(float)
    ops: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in events:
        names = list(_ancestry(event))
        bucket = bucket_of(names)
        if bucket is None:
            continue
        if bucket == "data" and not on_cuda:  # the host waits or copies: its whole range
            if event.name == "flashtrain::data" and not any(
                n == "flashtrain::data" for n in names[1:]
            ):
                busy["data"] += event.cpu_time_total
            continue
        us = _busy_us(event, on_cuda)
        if us > 0:
            busy[bucket] += us
            ops[bucket][event.name] += us
    busy["idle"] = max(step_us - sum(busy.values()), 0.0)
    per_step_ms = {b: busy.get(b, 0.0) / steps / 1e3 for b in BUCKETS}
    total = sum(per_step_ms.values()) or 1.0
    return {
        "step_ms": step_us / steps / 1e3,
        "ms_per_step": per_step_ms,
        "share": {b: per_step_ms[b] / total for b in BUCKETS},
        "top_ops_ms_per_step": {
            b: {
                name: us / steps / 1e3
                for name, us in sorted(ops[b].items(), key=lambda kv: -kv[1])[:TOP_OPS]
            }
            for b in BUCKETS
            if ops[b]
        },
    }


def profile_steps(cfg, steps: int, warmup: int, run_dir: Path):
    from flashtrain.train.trainer import Trainer

    trainer = Trainer(cfg, run_dir)
    on_cuda = trainer.env.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    measured = []  # the active window's events, handed over when it closes
    ok = False
    try:
        with profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
            on_trace_ready=lambda prof: measured.append(prof.events()),
        ) as prof:
            trainer.fit(on_step=lambda _step: prof.step())
        ok = True
    finally:
        trainer.close(clean=ok)
    if not measured:
        raise RuntimeError("the profiler recorded no step (did the run end early?)")
    return measured[0], on_cuda


def markdown(result: dict, env: dict) -> str:
    lines = [
        f"# Training step profile ({env['device']})",
        "",
        f"`{' '.join(result['overrides'])}`: {result['steps']} measured steps after "
        f"{result['warmup']} warmup; step {result['step_ms']:.1f} ms. torch {env['torch']}, "
        f"triton {env['triton']}, commit {env['commit']}.",
        "",
        "| bucket | ms / step | share | heaviest ops (ms / step) |",
        "|---|---:|---:|---|",
    ]
    for b in BUCKETS:
        top = result["top_ops_ms_per_step"].get(b, {})
        heavy = ", ".join(f"{name} {ms:.1f}" for name, ms in top.items())
        lines.append(
            f"| {b} | {result['ms_per_step'][b]:.1f} | {result['share'][b]:.1%} | {heavy} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    overrides = [
        *args.overrides,
        f"trainer.max_steps={args.warmup + args.steps}",
        "trainer.eval_interval=0",
        "trainer.eval_at_end=false",
        "trainer.ckpt_interval=0",
        "trainer.allow_slow_cpu=true",
        "logger=none",
        "trainer.progress=none",
    ]
    cfg = compose_config(overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        events, on_cuda = profile_steps(cfg, args.steps, args.warmup, Path(run_dir))
    result = classify(events, on_cuda, args.steps)
    result.update(overrides=args.overrides, steps=args.steps, warmup=args.warmup)
    result["cpu_attention"] = os.environ.get("FLASHTRAIN_CPU_ATTENTION", "auto")
    env = measure.environment()
    if not on_cuda:
        env["threads"] = torch.get_num_threads()
    stem = args.out / f"step-{results.slug(env['device'])}-{args.tag}"
    results.write_json(stem.with_suffix(".json"), {"env": env, **result})
    text = markdown(result, env)
    md = stem.with_suffix(".md")
    tmp = md.with_suffix(".md.tmp")
    tmp.write_text(text)
    os.replace(tmp, md)
    print(text)
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    main()
