"""Checkpoint stall on a CPU: how long training waits for a checkpoint, synchronous saves
(trainer.async_checkpoint=false) against saves written in the background (true), side by side
in one process.

One GPT-2 of ~57M parameters (8 layers x 768 wide; a checkpoint of ~0.7 GB: weights and AdamW's
two moments in fp32), one real Trainer per run, a checkpoint every SAVE_EVERY steps (more than a
background write takes, so no save waits for the one before); the runs go sync, async, async,
sync (ABBA: load that drifts over the minutes hits both alike), every one on the same number of
intra-op threads: one core fewer than the machine has, by default (--threads), so that the
writer has a core of its own, as on a GPU host; with every core in the step's OpenMP team, a
step that runs beside the writer waits for the team's slowest thread. Kept per run:
- each step's time: the interval between two consecutive optimizer steps (Trainer.fit's
  on_step). A save runs after its step, so it lands in the next interval, "the step that saves";
  the step time without a save is the median interval with no save in it and, async, no
  background write running meanwhile;
- the stall itself: the time the training thread spends in Trainer.save (sync: the whole save;
  async: the copy and starting the writer) and, async, in finishing the save at a later step
  boundary (trainer.pt, meta.json, the rename: RunCheckpoints.poll);
- the write of model and optimizer (write.write_model_optim, on the writer thread when async),
  timed by wrapping it here, and the steps that ran while it did (on a CPU the writer takes
  cycles from the step: their extra time is part of an async save's cost).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import flashtrain.checkpoint.async_write as async_write
import flashtrain.checkpoint.write as checkpoint_write
from flashtrain.checkpoint.run_info import cpu_model
from flashtrain.lab.bench import measure, results
from flashtrain.lab.bench.training import compose
from flashtrain.train.cpu_threads import available_cores

MODEL = (
    "model=gpt2",
    "model.n_layer=8",  # 768 wide, 12 heads: GPT-2 small's blocks, 8 of its 12
    "seq_len=128",
    "micro_batch_size=1",
    "global_batch_size=1",
)
QUIET = (
    "logger=none",
    "trainer.progress=none",
    "trainer.metrics_file=null",
    "trainer.eval_interval=0",
    "trainer.eval_at_end=false",
    "trainer.ckpt_at_end=false",
    "trainer.keep_last=1",  # the disk holds two checkpoints at most
    "trainer.allow_slow_cpu=true",
)
SAVE_EVERY = 6
SAVES = 3  # per run
ORDER = ("sync", "async", "async", "sync")
MODES = ("sync", "async")


def timed(fn, spans: list):
    """fn, noting each call's (start, end) in `spans`."""

    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spans.append((start, time.perf_counter()))

    return call


class WriteTimes:
    """write_model_optim's (start, end) on whichever thread runs it: wrapped where write.py's
    synchronous save and async_write.py's background writer call it."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._real = checkpoint_write.write_model_optim

    def __enter__(self) -> WriteTimes:
        wrapped = timed(self._real, self.spans)
        checkpoint_write.write_model_optim = async_write.write_model_optim = wrapped
        return self

    def __exit__(self, *exc) -> None:
        checkpoint_write.write_model_optim = async_write.write_model_optim = self._real


def one_run(mode: str, folder: Path, saves: int, threads: int) -> dict:
    """A Trainer saving every SAVE_EVERY steps (`saves` times, each followed by SAVE_EVERY - 1
    steps without one); each step's interval and what happened in it."""
    from flashtrain.train import Trainer

    steps = SAVE_EVERY * (saves + 1) - 1
    cfg = compose(
        [
            *MODEL,
            *QUIET,
            f"trainer.max_steps={steps}",
            f"trainer.ckpt_interval={SAVE_EVERY}",
            f"trainer.async_checkpoint={'true' if mode == 'async' else 'false'}",
            f"trainer.cpu_threads={threads}",
        ]
    )
    load = os.getloadavg()[0]
    ends: list[float] = []
    trainer = Trainer(cfg, folder)
    logging.getLogger("flashtrain").setLevel(logging.WARNING)  # the summary only; this prints
    saving, finishing = [], []  # the training thread's time in save(), and in the poll()s
    trainer.save = timed(trainer.save, saving)  # that put a background save into place
    poll, checkpoints = trainer.checkpoints.poll, trainer.checkpoints

    def timed_poll() -> None:
        before, start = checkpoints.state.last_ckpt, time.perf_counter()
        poll()
        if checkpoints.state.last_ckpt != before:
            finishing.append(time.perf_counter() - start)

    checkpoints.poll = timed_poll
    ok = False
    with WriteTimes() as writes:
        try:
            ends.append(time.perf_counter())
            trainer.fit(on_step=lambda step: ends.append(time.perf_counter()))
            ok = True
        finally:
            trainer.close(clean=ok)
    rows = []
    for step in range(2, steps + 1):  # step 1: warm-up (first allocations)
        start, end = ends[step - 1], ends[step]
        saves_here = (step - 1) % SAVE_EVERY == 0  # the save after step - 1 runs in this one
        overlap = any(s < end and e > start for s, e in writes.spans)
        rows.append(
            {
                "step": step,
                "seconds": end - start,
                "save": saves_here,
                "writing": overlap and not saves_here,  # a background write ran meanwhile
            }
        )
    return {
        "mode": mode,
        "params": trainer.num_params,
        "threads": trainer.cpu_threads.threads if trainer.cpu_threads else None,
        "load_avg_1min": round(load, 2),
        "steps": rows,
        "write_s": [e - s for s, e in writes.spans],
        "in_save_s": [e - s for s, e in saving],
        "finish_s": finishing,
        "checkpoint_bytes": _checkpoint_bytes(folder / "checkpoints"),
    }


def _checkpoint_bytes(root: Path) -> int | None:
    """The size of the newest checkpoint the run left."""
    folders = sorted(p for p in root.glob("step_*") if p.is_dir())
    return sum(f.stat().st_size for f in folders[-1].iterdir()) if folders else None


def summary(runs: list[dict]) -> dict:
    """Per mode, over its runs: medians of the step time without a save, the step that saves,
    the training thread's time in save() and in finishing, the write; the steps that ran while
    a write did (per save, their median time and extra time), and the time lost per save."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        rows = [row for r in mine for row in r["steps"]]
        step = statistics.median(
            row["seconds"] for row in rows if not row["save"] and not row["writing"]
        )
        save_steps = [row["seconds"] for row in rows if row["save"]]
        writing = [row["seconds"] for row in rows if row["writing"]]
        saves = len(save_steps)
        finish = [f for r in mine for f in r["finish_s"]]
        stall = statistics.median(save_steps) - step
        extra = sum(w - step for w in writing) / saves
        out[mode] = {
            "saves": saves,
            "step_s": step,
            "save_step_s": statistics.median(save_steps),
            "in_save_s": statistics.median(f for r in mine for f in r["in_save_s"]),
            "finish_s": statistics.median(finish) if finish else None,
            "write_s": statistics.median(w for r in mine for w in r["write_s"]),
            "writing_steps_per_save": len(writing) / saves,
            "writing_step_s": statistics.median(writing) if writing else None,
            "extra_while_writing_s": extra,
            "lost_per_save_s": stall + extra + (statistics.median(finish) if finish else 0.0),
        }
    return out


def markdown(runs: list[dict], sums: dict, env: dict) -> str:
    r0 = runs[0]
    gb = (r0["checkpoint_bytes"] or 0) / 1e9
    loads = ", ".join(f"{r['mode']} {r['load_avg_1min']:.1f}" for r in runs)
    lines = [
        "# Checkpoint stall on a CPU: synchronous against asynchronous saves",
        "",
        f"{env['cpu']}, {env['cores']:g} cores ({env['cores_source']}), {r0['threads']} intra-op "
        f"thread(s) in every run (trainer.cpu_threads: a core left to the writer), torch {env['torch']}, commit {env['commit']}, "
        f"{env['date']}. GPT-2 {r0['params'] / 1e6:.0f}M parameters (`{' '.join(MODEL)}`), "
        f'fp32, AdamW; a checkpoint of {gb:.2f} GB (format "torch": one file, hashed as it is '
        f"written, fsynced) every {SAVE_EVERY} steps, {sums['sync']['saves']} per mode over "
        f"runs in the order {', '.join(ORDER)}; checkpoints written to "
        f"{env['ckpt_filesystem']}. The machine's 1-minute load average at each run's start: "
        f"{loads} (other processes share these cores: step times vary from run to run; the "
        f"JSON holds every step). `python scripts/checkpoint_stall.py` "
        "(flashtrain/lab/bench/checkpoint_stall.py says what each figure is).",
        "",
        "| median over the saves | sync | async |",
        "|---|---|---|",
    ]

    def row(name, key, fmt="{:.2f} s"):
        cells = [fmt.format(sums[m][key]) if sums[m][key] is not None else "-" for m in MODES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("step time without a save", "step_s")
    row("the step that saves", "save_step_s")
    row("training thread in save() (sync: the save; async: the copy)", "in_save_s")
    row("training thread finishing it at a later step (async)", "finish_s")
    row("write of model + optimizer (async: on the writer thread)", "write_s")
    row("steps that ran while it was written, per save", "writing_steps_per_save", "{:.1f}")
    row("their step time", "writing_step_s")
    row("their extra time, per save", "extra_while_writing_s")
    row("**training time lost per save**", "lost_per_save_s", "**{:.2f} s**")
    lines += [
        "",
        "Time lost per save: the step that saves less the step time, plus (async) the extra "
        "time of the steps while the writer shares the cores and the finishing at a later "
        "step boundary. The writer's work (torch.save's copy into the file, SHA-256, fsync) "
        "holds the GIL for milliseconds at a time only: what it costs the training step on a "
        "CPU is the core it runs on, here one left to it, but shared with the other processes "
        "on the machine (the load averages above).",
        "",
        "GPUs: not measured yet. There the copy is a device-to-host transfer and the writer "
        "competes with training for host CPU and disk only, not for the step's compute.",
    ]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], sums: dict, path: Path) -> None:
    from flashtrain import plots

    fig, (steps_ax, bars_ax) = plots.panels(2, width=6.0)
    series = {}
    colors = {"sync": "tab:red", "async": "tab:blue"}
    seen: dict[str, int] = {}
    for r in runs:
        seen[r["mode"]] = seen.get(r["mode"], 0) + 1
        label = f"{r['mode']} (run {seen[r['mode']]})"
        style = {"color": colors[r["mode"]], "alpha": 1.0 if seen[r["mode"]] == 1 else 0.5}
        series[label] = (
            [row["step"] for row in r["steps"]],
            [row["seconds"] for row in r["steps"]],
            style,
        )
    plots.curves(
        steps_ax,
        series,
        title=f"step time; a checkpoint every {SAVE_EVERY} steps",
        xlabel=f"step (the save after step {SAVE_EVERY}k lands in step {SAVE_EVERY}k+1)",
        ylabel="seconds",
        marker="o",
    )
    names = ["step", "step that saves", "in save()", "write", "lost per save"]
    keys = ["step_s", "save_step_s", "in_save_s", "write_s", "lost_per_save_s"]
    width = 0.38
    for i, mode in enumerate(MODES):
        xs = [k + (i - 0.5) * width for k in range(len(keys))]
        bars_ax.bar(xs, [sums[mode][k] for k in keys], width, label=mode, color=colors[mode])
    bars_ax.set_xticks(range(len(keys)), names)
    bars_ax.set_ylabel("seconds (median)")
    bars_ax.set_title("medians over the saves", fontsize=10)
    bars_ax.grid(alpha=0.3, axis="y")
    bars_ax.legend(fontsize=7)
    plots.save(fig, path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    today = datetime.date.today().isoformat()
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="result folder")
    p.add_argument("--name", default=f"checkpoint-stall-cpu-{today}", help="file name stem")
    p.add_argument("--saves", type=int, default=SAVES, help="checkpoints per run")
    p.add_argument(
        "--threads", type=int, default=None, help="intra-op threads (default: the cores less one)"
    )
    p.add_argument(
        "--ckpt-dir", type=Path, default=None, help="where checkpoints go (default: a temp folder)"
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.getLogger("flashtrain").setLevel(logging.WARNING)  # this prints its own lines
    torch.set_num_threads(torch.get_num_threads())  # OpenMP pool up before anything is timed
    cores, source = available_cores()
    threads = args.threads or max(1, round(cores) - 1)
    env = {**measure.environment(), "cpu": cpu_model(), "cores": cores, "cores_source": source}
    env["date"] = datetime.date.today().isoformat()
    start = time.time()
    runs = []
    parent = args.ckpt_dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-stall-", dir=parent) as tmp:
        env["ckpt_filesystem"] = _filesystem(Path(tmp))
        for i, mode in enumerate(ORDER):
            print(f"[{time.time() - start:4.0f}s] run {i + 1}/{len(ORDER)}: {mode} saves, "
                  f"{args.saves} checkpoints ...", flush=True)  # fmt: skip
            run = one_run(mode, Path(tmp) / f"{i}-{mode}", args.saves, threads)
            runs.append(run)
            got = summary([run])[mode]
            print(f"[{time.time() - start:4.0f}s]   step {got['step_s']:.2f}s, the step that "
                  f"saves {got['save_step_s']:.2f}s, in save() {got['in_save_s']:.2f}s, write "
                  f"{got['write_s']:.2f}s (load {run['load_avg_1min']:.1f})",
                  flush=True)  # fmt: skip
    sums = summary(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "model": MODEL,
               "save_every": SAVE_EVERY, "summary": sums, "runs": runs}  # fmt: skip
    results.write_json(args.out / f"{args.name}.json", payload)
    text = markdown(runs, sums, env)
    (args.out / f"{args.name}.md").write_text(text)
    plot(runs, sums, args.out / f"{args.name}.png")
    print("\n" + text + f"\nwrote {args.out}/{args.name}.{{json,md,png}}")
    return 0


def _filesystem(folder: Path) -> str:
    """The file system `folder` is on (its mount point and type, from /proc/mounts)."""
    best = ("?", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, kind, *_ = line.split()
            if str(folder.resolve()).startswith(mount) and len(mount) >= len(best[0]):
                best = (mount, kind)
    except OSError:
        pass
    return f"{folder.parent} ({best[1]} mounted at {best[0]})"


if __name__ == "__main__":
    sys.exit(main())
