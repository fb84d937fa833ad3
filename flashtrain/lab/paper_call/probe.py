"""The call's probe: a few optimizer steps of each run shape, timed, in one process.

    python -m flashtrain.lab.paper_call.probe PLAN.json --out PROBE.json

PLAN.json: {"steps": N, "prepare": [overrides...], "points": [{"name": ..., "overrides": [...]}]}.
First the data of `prepare` is made ready (pysrc tokenized into its token cache: the runs then
find it), timed on its own; then each point is composed as train.py composes it (with
train.py's data settings), built by the Trainer and trained for N steps with nothing saved or
evaluated. PROBE.json gets, per point, the build time, every step's wall time and the steady
step (the median after the first); the process's start-up (imports, the device's first use) and
the preparation once. Written atomically after every point, so a killed probe keeps what it
measured.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the start-up is timed from here: imports, the device's first use

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

PROBE_ONLY = (
    "trainer.log_interval=1",
    "trainer.eval_interval=0",
    "trainer.eval_at_end=false",
    "trainer.ckpt_interval=0",
    "trainer.ckpt_at_end=false",
    "trainer.progress=none",
    "trainer.metrics_file=null",
    "logger=none",
)


def steady_step_s(step_s: list[float]) -> float:
    """The median step after the first (whose compiles and first allocations it leaves out)."""
    if len(step_s) < 2:
        raise ValueError(f"the probe needs at least 2 steps to time one steady step, got {step_s}")
    return statistics.median(step_s[1:])


def _compose(overrides: list[str]):
    from flashtrain.lab.bench.training import compose
    from flashtrain.train.entry import with_command_line_settings

    return with_command_line_settings(compose(overrides))


def _free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def probe_point(overrides: list[str], steps: int, run_dir: Path) -> dict:
    """One shape's build time and step times (s)."""
    from flashtrain.train import Trainer

    cfg = _compose([*overrides, *PROBE_ONLY, f"trainer.max_steps={steps}"])
    start = time.perf_counter()
    trainer = Trainer(cfg, run_dir)
    built = time.perf_counter()
    marks = [built]
    ok = False
    try:
        trainer.fit(on_step=lambda step: marks.append(time.perf_counter()))
        ok = True
    finally:
        trainer.close(clean=ok)
        _free_device_memory()
    step_s = [b - a for a, b in zip(marks, marks[1:])]
    return {
        "build_s": built - start,
        "step_s": step_s,
        "steady_step_s": steady_step_s(step_s),
        "tokens_per_step": trainer.plan.tokens_per_step,
        "micro_batch_size": trainer.plan.micro_batch_size,
        "grad_accum": trainer.plan.grad_accum,
        "device": str(trainer.env.device),
    }


def _write(path: Path, result: dict) -> None:
    from flashtrain.lab.bench.results import write_json

    write_json(path, result)


def import_everything() -> None:
    """What every train.py process imports before its run."""
    import torch  # noqa: F401

    import flashtrain.train  # noqa: F401
    from flashtrain.lab.bench.training import compose  # noqa: F401  (hydra)


def first_device_use() -> None:
    """A CUDA context, as a train run's first step makes one (nothing on a CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()


def run_probe(plan: dict, out: Path, work: Path, started: float) -> dict:
    """The preparation first, before this process touches the GPU: its reading processes are
    forked, and a fork is safest before a CUDA context exists."""
    from flashtrain.data.registry import prepare_data

    import_everything()
    result: dict = {"startup_s": time.perf_counter() - started, "points": {}}
    if plan.get("prepare"):
        start = time.perf_counter()
        summary = prepare_data(_compose(plan["prepare"]).data, progress=False)
        result["prepare_s"] = time.perf_counter() - start
        result["prepared"] = {k: v for k, v in summary.items() if isinstance(v, (int, str))}
        print(f"probe: data ready in {result['prepare_s']:.1f} s: {result['prepared']}", flush=True)
    start = time.perf_counter()
    first_device_use()
    result["startup_s"] += time.perf_counter() - start  # imports and the device's first use
    _write(out, result)
    for point in plan["points"]:
        name = point["name"]
        measured = probe_point(point["overrides"], plan["steps"], work / name)
        result["points"][name] = measured
        _write(out, result)
        print(
            f"probe: {name}: build {measured['build_s']:.1f} s, steps "
            + ", ".join(f"{s:.3f}" for s in measured["step_s"])
            + f" s (steady {measured['steady_step_s']:.3f} s, "
            f"{measured['tokens_per_step'] / measured['steady_step_s']:,.0f} tokens/s)",
            flush=True,
        )
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("plan", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    run_probe(plan, args.out, args.out.parent / "probe-runs", STARTED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
