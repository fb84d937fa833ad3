"""Where a training step's time goes: matmul, attention, loss, elementwise, optimizer,
communication, memcpy, data and idle.

    python scripts/profile_step.py model=gpt2 seq_len=1024 micro_batch_size=1 global_batch_size=1
    python scripts/profile_step.py --steps 5 --warmup 2 --out /tmp/prof experiment=owt/gpt2s-1k

The arguments after the options are Hydra overrides of configs/train.yaml, as for train.py (the
data is built as the run would build it). The trainer runs warmup + steps optimizer steps under
torch.profiler; only the last `steps` are measured, and only what runs inside a step.

Buckets (flashtrain.lab.bench.step_split, the split the GPU suite uses too). On CUDA every
kernel launched inside a step counts once, by its own name (GEMMs, attention kernels, loss kernels,
NCCL, copies, optimizer kernels), else by the op that launched it; where kernels overlap (NCCL
beside compute) the time is shared, so the buckets add up to the GPU window. On CPU the ops' self
time (their own work, not their children's) counts, the same way:
  matmul        GEMM kernels / mm, addmm, bmm, linear ops, wherever they run (the LM head too)
  attention     flashtrain's attention kernels, SDPA's; generic kernels inside the attention
                custom ops (flashtrain::attention_*) or their backward
  loss          the fused LM-head loss (xent_*), cross-entropy kernels; generic kernels inside
                flashtrain::loss or a cross-entropy op
  elementwise   every other kernel or op (layer norms, GELU, adds, casts)
  optimizer     multi-tensor (fused Adam, foreach) kernels, anything inside Optimizer.step
  communication NCCL collectives
  memcpy        copies and memsets
  data          inside flashtrain::data (CPU: the whole range, the host waiting for the prefetch
                thread)
  idle          the window's time with no kernel running (CUDA) or no op working (CPU): Python,
                the dispatcher, launch gaps, waiting
The table gives the step's own time (the host's flashtrain::step range) and the GPU window.
Writes step-<device>-<tag>.json (device, torch, triton, commit, the overrides) and .md under
--out (default benchmarks/results/) and prints the table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from datetime import date
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from flashtrain.lab.bench import measure, results
from flashtrain.lab.bench.step_buckets import BUCKETS
from flashtrain.lab.bench.step_split import profile_split
from flashtrain.lab.bench.training import compose
from flashtrain.lab.checkout import RESULTS

STEP_RANGE = "flashtrain::step"  # the trainer's range around one optimizer step
NAME_CHARS = 60  # a kernel's C++ template name, cut in the table (whole in the JSON)


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


def profile_steps(cfg, steps: int, warmup: int, run_dir: Path) -> dict:
    """The step_split of `steps` optimizer steps after `warmup` (the trainer's flashtrain::step
    ranges); a CUDA device's kernels, or the host's ops on CPU."""
    from flashtrain.train.trainer import Trainer

    trainer = Trainer(cfg, run_dir)
    on_cuda = trainer.env.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    measured = []  # the active window's split, made when it closes
    ok = False
    try:
        with profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
            on_trace_ready=lambda prof: measured.append(profile_split(prof, STEP_RANGE)),
        ) as prof:
            trainer.fit(on_step=lambda _step: prof.step())
        ok = True
    finally:
        trainer.close(clean=ok)
    if not measured:
        raise RuntimeError("the profiler recorded no step (did the run end early?)")
    return measured[0]


def _short(name: str) -> str:
    name = name.replace("|", "\\|")  # a table cell
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def markdown(result: dict, env: dict) -> str:
    window = (
        f"; GPU window {result['window_ms']:.1f} ms (first to last kernel, per step)"
        if result["device"] == "cuda"
        else ""
    )
    lines = [
        f"# Training step profile ({env['device']})",
        "",
        f"`{' '.join(result['overrides'])}`: {result['steps']} measured steps after "
        f"{result['warmup']} warmup; step {result['step_ms']:.1f} ms (profiled){window}. "
        f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}.",
        "",
        "| bucket | ms / step | share | top kernels (ms / step, launches / step) |"
        if result["device"] == "cuda"
        else "| bucket | ms / step | share | top ops (ms / step, calls / step) |",
        "|---|---:|---:|---|",
    ]
    for b in BUCKETS:
        top = result["top"].get(b, [])
        heavy = ", ".join(
            f"`{_short(k['name'])}` {k['ms_per_step']:.2f} ({k['launches_per_step']:g})"
            for k in top
        )
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
    cfg = compose(overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        result = profile_steps(cfg, args.steps, args.warmup, Path(run_dir))
    result.update(overrides=args.overrides, steps=args.steps, warmup=args.warmup)
    result["cpu_attention"] = os.environ.get("FLASHTRAIN_CPU_ATTENTION", "auto")
    env = measure.environment()
    if result["device"] == "cpu":
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
