"""CPU intra-op threads: training step time with 1 thread, with every core, and what the rule
(flashtrain/train/cpu_threads.py) chooses, for a few model sizes; the evidence behind
MIN_SPLIT_FLOPS.

Two parts:
- sizes: one real Trainer per size in this process; its steps alternate between the thread
  counts (1, 2, 2, 1, ...: load that comes and goes hits both alike) and the median step time of
  each count is kept, with the cores other processes kept busy meanwhile; "auto" is the count
  the rule picks for the size with that many busy.
- default run: the README's main job (`python train.py`, shortened) as subprocesses with
  OMP_NUM_THREADS unset (the trainer's own choice), =1 and =all cores, interleaved; median step
  time from each run's metrics file: the check that the default is as fast as the best.

CPU timings depend on what else runs: a MIN_SPLIT_FLOPS comes only from a quiet machine's run
(others' cores ~0); the table says which threshold the points suggest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flashtrain.checkpoint.run_info import cpu_model
from flashtrain.lab.bench import measure, results
from flashtrain.lab.bench.training import compose
from flashtrain.lab.checkout import REPO, TRAIN_SCRIPT
from flashtrain.train.cpu_threads import (
    MIN_SPLIT_FLOPS,
    available_cores,
    choose_cpu_threads,
    projection_flops,
    read_cpu_times,
)
from flashtrain.train.metric_names import STEP_TIME_S, canonical_row

# name: (overrides on configs/train.yaml, measured steps in a full run). Global batch = micro
# batch beyond the default run: one micro-batch a step, so a step stays a few seconds.
SIZES = {
    "gpt2-tiny 128 (README)": ((), 40),
    "gpt2-tiny 256": (("seq_len=256", "global_batch_size=8"), 30),
    "gpt2-tiny 512": (("seq_len=512", "global_batch_size=8"), 20),
    "gpt2-tiny 1024": (("seq_len=1024", "global_batch_size=8"), 12),
    "width 384 at 512": (
        ("seq_len=512", "global_batch_size=8", "model.d_model=384", "model.n_head=6"),
        8,
    ),
}
QUICK_SIZES = ("gpt2-tiny 128 (README)", "gpt2-tiny 512", "width 384 at 512")
WARMUP_STEPS = 4
MIN_STEPS = 3  # per thread count, also when out of time
DEFAULT_RUN_INTERVAL = 5  # steps per logged step time in the train.py runs
QUIET = (
    "logger=none",
    "trainer.progress=none",
    "trainer.metrics_file=null",
    "trainer.eval_interval=0",
    "trainer.eval_at_end=false",
    "trainer.ckpt_interval=0",
    "trainer.ckpt_at_end=false",
    "trainer.allow_slow_cpu=true",
)


def thread_schedule(counts: list[int], steps: int) -> list[int]:
    """counts in ABBA order (a drift in load between steps hits every count alike)."""
    cycle = counts + counts[::-1]
    return [cycle[i % len(cycle)] for i in range(steps)]


def own_cpu_s() -> float:
    """CPU seconds this process (all its threads) has used."""
    t = os.times()
    return t.user + t.system


def others_busy_cores(before: dict, after: dict, own_s: float, wall_s: float) -> float:
    """Cores other processes kept busy over wall_s: the machine's busy time between two
    read_cpu_times() samples less this process's own CPU time (children's not counted)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy_ticks = sum(
        (after[c][1] - before[c][1]) - (after[c][0] - before[c][0]) for c in after if c in before
    )
    return max(0.0, (busy_ticks / tick - own_s) / max(wall_s, 1e-9))


def suggested_threshold(sizes: list[dict]) -> float | None:
    """A MIN_SPLIT_FLOPS from the measurements: between the largest projection that 1 thread
    ran faster and the next, from which every size ran faster on all cores (geometric mean);
    None when 1 thread won at the largest size."""
    rows = sorted(sizes, key=lambda r: r["projection_flops"])
    flops = [r["projection_flops"] for r in rows]
    one_wins = [i for i, r in enumerate(rows) if min(r["median_s"], key=r["median_s"].get) == 1]
    if not one_wins:
        return flops[0]  # all cores won everywhere: the threshold is at most the smallest size
    last = one_wins[-1]
    if last == len(rows) - 1:
        return None
    return (flops[last] * flops[last + 1]) ** 0.5


def time_size(
    name: str, overrides: tuple, steps: int, counts: list[int], run_dir: Path, budget_s: float
) -> dict:
    """One Trainer on the size; step times by thread count (median, min), warm-up dropped;
    ends early after budget_s once every count has MIN_STEPS steps (a loaded machine's slow
    steps)."""
    from flashtrain.train import Trainer

    total = WARMUP_STEPS + steps
    schedule = thread_schedule(counts, total)
    cfg = compose([*overrides, *QUIET, f"trainer.max_steps={total}"])
    load = os.getloadavg()[0]
    machine_before, own_before, wall_before = read_cpu_times(), own_cpu_s(), time.perf_counter()
    trainer = Trainer(cfg, run_dir)
    times: dict[int, list[float]] = {n: [] for n in counts}
    last = [0.0]

    def next_step(step: int) -> None:  # after optimizer step `step` (1-based)
        now = time.perf_counter()
        if step > WARMUP_STEPS:
            times[schedule[step - 1]].append(now - last[0])
        if now > deadline and min(map(len, times.values())) >= MIN_STEPS:
            trainer.cfg.trainer.max_steps = step  # out of time: fit() ends after this step
            return
        if step < total:
            torch.set_num_threads(schedule[step])
        last[0] = time.perf_counter()

    deadline = time.perf_counter() + budget_s
    ok = False
    try:
        torch.set_num_threads(schedule[0])
        last[0] = time.perf_counter()
        trainer.fit(on_step=next_step)
        ok = True
    finally:
        trainer.close(clean=ok)
    others = others_busy_cores(
        machine_before,
        read_cpu_times(),
        own_cpu_s() - own_before,
        time.perf_counter() - wall_before,
    )
    m = cfg.model
    work = projection_flops(trainer.plan.micro_batch_size, cfg.seq_len, m.d_model)
    return {
        "size": name,
        "d_model": m.d_model,
        "n_layer": m.n_layer,
        "seq_len": cfg.seq_len,
        "micro_batch": trainer.plan.micro_batch_size,
        "projection_flops": work,
        "load_avg_1min": round(load, 2),
        "others_busy_cores": round(others, 2),
        "median_s": {n: statistics.median(v) for n, v in times.items()},
        "min_s": {n: min(v) for n, v in times.items()},
        "steps": {n: len(v) for n, v in times.items()},
    }


def default_run(setting: str, steps: int, budget_s: float, folder: Path) -> dict:
    """`python train.py` (the README's main job, up to `steps` steps) with OMP_NUM_THREADS per
    `setting` ("auto": unset), stopped after budget_s once MIN_STEPS intervals are logged; its
    median step time and the thread count its summary reports."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if setting != "auto":
        env["OMP_NUM_THREADS"] = setting
    folder.mkdir(parents=True)
    metrics, log = folder / "metrics.jsonl", folder / "output.txt"
    cmd = [
        sys.executable,
        str(TRAIN_SCRIPT),
        "logger=none",
        "trainer.progress=lines",
        f"trainer.max_steps={steps}",
        f"trainer.log_interval={DEFAULT_RUN_INTERVAL}",
        "trainer.eval_interval=0",
        "trainer.eval_at_end=false",
        "trainer.ckpt_interval=0",
        "trainer.ckpt_at_end=false",
        f"hydra.run.dir={folder}",
    ]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                if time.perf_counter() - start > budget_s and len(_step_times(metrics)) > MIN_STEPS:
                    break  # enough intervals; a loaded machine's slow run is cut here
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode and len(_step_times(metrics)) <= MIN_STEPS:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{log.read_text()[-2000:]}")
    threads = re.search(r"threads: (\d+)", log.read_text())
    return {
        "setting": setting,
        "threads": int(threads.group(1)) if threads else None,
        "median_s": statistics.median(_step_times(metrics)[1:]),  # the first: warm-up
        "intervals": len(_step_times(metrics)) - 1,
        "load_avg_1min": round(load, 2),
    }


def _step_times(metrics: Path) -> list[float]:
    """Each logged interval's mean step time so far (lines are flushed as they are logged)."""
    if not metrics.exists():
        return []
    lines = metrics.read_text().splitlines()
    complete = lines[:-1] + [line for line in lines[-1:] if line.endswith("}")]
    rows = [canonical_row(json.loads(line)) for line in complete]
    return [r[STEP_TIME_S] for r in rows if STEP_TIME_S in r]


def auto_threads(row: dict, cores: float) -> int:
    """The rule's choice for a size with `cores`, as busy as other processes kept them."""
    return choose_cpu_threads(cores, row["projection_flops"], busy=row["others_busy_cores"]).threads


def markdown(sizes: list[dict], default: list[dict], env: dict) -> str:
    cores = env["cores"]
    lines = [
        "# CPU intra-op threads",
        "",
        f"{env['cpu']}: {cores:g} cores ({env['cores_source']}), torch {env['torch']}, commit "
        f"{env['commit']}. Median step time (s); auto = the rule's choice (flashtrain/train/cpu_threads.py) "
        "with the cores as busy as other processes kept them (last column).",
        "",
        "| size | projection FLOPs | 1 thread | all cores | auto | auto / best | others' cores |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sizes:
        med = r["median_s"]
        auto = auto_threads(r, cores)
        best = min(med.values())
        lines.append(
            f"| {r['size']} | {r['projection_flops']:.2g} | {med[1]:.3f} | "
            f"{med[max(med)]:.3f} | {auto} | {med[auto] / best:.2f} | {r['others_busy_cores']:.1f} |"
        )
    threshold = suggested_threshold(sizes)
    lines += [
        "",
        f"MIN_SPLIT_FLOPS is {MIN_SPLIT_FLOPS:.2g}; these points suggest "
        + (f"{threshold:.2g}." if threshold else "none: 1 thread won at the largest size.")
        + " Only points with ~0 others' cores can set it.",
    ]
    if default:
        lines += [
            "",
            "## The README's main job (`python train.py`, shortened), median step time",
            "",
            "| OMP_NUM_THREADS | threads used | median s/step (per run) | load |",
            "|---|---|---|---|",
        ]
        for setting in dict.fromkeys(r["setting"] for r in default):
            runs = [r for r in default if r["setting"] == setting]
            per_run = ", ".join(f"{r['median_s']:.3f}" for r in runs)
            used = sorted({r["threads"] for r in runs}, key=str)
            loads = ", ".join(f"{r['load_avg_1min']:.1f}" for r in runs)
            name = "unset (auto)" if setting == "auto" else setting
            lines.append(f"| {name} | {used} | {per_run} | {loads} |")
    lines += [
        "",
        "Load = the machine's 1-minute load average when the run started (this benchmark's own "
        "earlier points included); with cores busy the rule chooses fewer threads.",
    ]
    return "\n".join(lines) + "\n"


def plot(sizes: list[dict], path: Path) -> None:
    from flashtrain import plots

    fig, (ax,) = plots.panels(1, width=6.0)
    counts = sorted({int(n) for r in sizes for n in r["median_s"]})
    series = {}
    for i, n in enumerate(counts):
        pts = sorted((r["projection_flops"], r["median_s"][n]) for r in sizes)
        series[f"{n} thread{'s' * (n > 1)}"] = (*zip(*pts), {"color": plots.color(i, len(counts))})
    plots.curves(
        ax,
        series,
        title="training step time by intra-op threads",
        xlabel="FLOPs of a width x width projection per micro-batch",
        ylabel="median s/step",
        logy=True,
        marker="o",
    )
    ax.set_xscale("log")
    plots.save(fig, path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON, table and plot")
    p.add_argument("--quick", action="store_true", help="3 sizes, fewer steps (~2 minutes)")
    p.add_argument("--sizes", nargs="*", choices=list(SIZES), help="default: all (quick: 3)")
    p.add_argument("--repeats", type=int, default=None, help="default-run repeats (2; quick 1)")
    p.add_argument("--no-default-run", action="store_true", help="skip the train.py subprocesses")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())  # OpenMP pool up before anything is timed
    cores, source = available_cores()
    all_cores = max(1, round(cores))
    counts = sorted({1, all_cores})
    names = args.sizes or (list(QUICK_SIZES) if args.quick else list(SIZES))
    env = {**measure.environment(), "cores": cores, "cores_source": source, "counts": counts}
    env["cpu"] = cpu_model()
    start = time.time()
    budget = 20.0 if args.quick else 45.0  # seconds of steps per size, warm-up included
    sizes = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-threads-") as tmp:
        for name in names:
            overrides, steps = SIZES[name]
            steps = max(4, steps // 2) if args.quick else steps
            folder = Path(tmp) / results.slug(name)
            row = time_size(name, overrides, steps, counts, folder, budget)
            sizes.append(row)
            shown = "  ".join(f"{n} thr {s:.3f}s" for n, s in row["median_s"].items())
            print(f"[{time.time() - start:4.0f}s] {name}: {shown} (load {row['load_avg_1min']:.1f})",
                  flush=True)  # fmt: skip
        default = []
        if not args.no_default_run:
            repeats = args.repeats or (1 if args.quick else 2)
            run_budget = 15.0 if args.quick else 30.0
            settings = ["auto", "1", str(all_cores)] if all_cores > 1 else ["auto", "1"]
            for i in range(repeats):
                for setting in settings if i % 2 == 0 else settings[::-1]:
                    folder = Path(tmp) / f"default-{setting}-{i}"
                    row = default_run(setting, 100, run_budget, folder)
                    default.append(row)
                    print(f"[{time.time() - start:4.0f}s] train.py, OMP_NUM_THREADS={setting}: "
                          f"{row['median_s']:.3f}s/step on {row['threads']} threads "
                          f"(load {row['load_avg_1min']:.1f})", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    results.write_json(
        args.out / "cpu-threads.json",
        {"env": env, "args": vars(args) | {"out": str(args.out)}, "sizes": sizes,
         "default_run": default},
    )  # fmt: skip
    text = markdown(sizes, default, env)
    (args.out / "cpu-threads.md").write_text(text)
    plot(sizes, args.out / "cpu-threads.png")
    print("\n" + text + f"\nwrote {args.out}/cpu-threads.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
