"""Reproduce one of the FlashAttention paper's experiments at a chosen scale.

    python scripts/reproduce.py context-length --scale tiny               # pysrc, 2-core CPU
    python scripts/reproduce.py context-length --scale tiny --data synthetic
    python scripts/reproduce.py pathfinder --scale gpu --out results/
    python scripts/reproduce.py speed-memory --scale tiny
    python scripts/reproduce.py bert --scale paper                        # prints; --run starts

Scales: tiny (a 2-core CPU, minutes per run), gpu-call (context-length and pathfinder: the
presets' standalone steps here; scripts/paper_call.py runs both in one 9-minute GPU call with
steps from measured throughput), gpu (~20 minutes on one GPU), paper (the paper's setting, hours
to days on 8 GPUs: printed with its documented cost, run only with --run).
Each run is an ordinary train.py run (its command is printed) in <out>/runs/<name> with
trainer.resume=auto: run the same command again to continue; finished runs are skipped.
At the end <out>/<experiment>.md and its plots are written (scripts/report.py).

How a plan runs: every command is printed, finished runs are skipped, the rest run as
subprocesses with their folders pinned under <out>/runs/<name>, then the report is written.

A train run is `train.py <overrides> name=<run> hydra.run.dir=<out>/runs/<run>
trainer.resume=auto`, so a killed run continues from its newest checkpoint when run again, and
a run whose metrics.jsonl shows its final step (and final evaluation) is not run again. A
benchmark run is finished once its result file is in its folder.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from flashtrain.lab import experiments
from flashtrain.lab.bench.results import write_json
from flashtrain.lab.checkout import REPO
from flashtrain.lab.experiments import EXPERIMENT_NAMES, SCALES
from flashtrain.lab.experiments.overrides import merge_overrides, setting
from flashtrain.lab.experiments.spec import Run, ScalePlan
from flashtrain.lab.reports import write_reports
from flashtrain.lab.reports.runs import (
    BENCH_GLOB,
    LAUNCH_FILE,
    METRICS_FILE,
    TILE_COUNTS,
    read_metrics,
)
from flashtrain.utils import git_commit

_PLAIN_VALUE = re.compile(r"^[\w./:@+-]+$")  # needs no quoting in a Hydra override


def hydra_value(text: str) -> str:
    """A string as a Hydra override value: as is when plain, else single-quoted."""
    if _PLAIN_VALUE.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_overrides(run: Run, run_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """A train run's overrides: the matrix's, the user's, then the pinned name, folder, resume."""
    runs_dir = hydra_value(str(run_dir.parent))
    table = [a.replace("{runs}", runs_dir) for a in run.args]
    pinned = [
        f"name={run.name}",
        f"hydra.run.dir={hydra_value(str(run_dir))}",
        "trainer.resume=auto",
    ]
    return merge_overrides(table, extra, pinned)


def command(run: Run, run_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """The argv of a run (the interpreter running this driver)."""
    script = str(REPO / run.script)
    if not Path(script).is_file():
        raise ValueError(
            f"{script} does not exist: the driver runs from a source checkout (train.py and "
            "scripts/ beside flashtrain/); install it with pip install -e ."
        )
    if run.kind == "bench":
        return [sys.executable, script, *run.args, "--out-dir", str(run_dir), "--tag", "reproduce"]
    launcher = [sys.executable]
    if run.nproc > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc_per_node={run.nproc}"]
    return [*launcher, script, *run_overrides(run, run_dir, extra)]


def shown(argv: Sequence[str]) -> str:
    """The command as a user would type it: python / torchrun, the script relative to here."""
    words = ["python", *argv[1:]]
    if words[1:3] == ["-m", "torch.distributed.run"]:
        words = ["torchrun", *words[3:]]
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is not None:  # python -m <module> has none
        path = Path(words[script])
        if path.is_relative_to(Path.cwd()):
            words[script] = str(path.relative_to(Path.cwd()))
    return shlex.join(words)


def train_state(run: Run, run_dir: Path, extra: Sequence[str] = ()) -> tuple[str, int]:
    """("finished" | "partial" | "new", last logged step) from the run's metrics.jsonl."""
    metrics = run_dir / METRICS_FILE
    if not metrics.is_file():
        return "new", 0
    overrides = run_overrides(run, run_dir, extra)
    planned = setting(overrides, "trainer.max_steps")
    if planned is None:
        raise ValueError(f"run {run.name} sets no trainer.max_steps; its preset or point must")
    train, evals = read_metrics(metrics)
    step = train[-1]["step"] if train else 0
    final_eval = setting(overrides, "trainer.eval_at_end") not in ("false", "False")
    evaluated = not final_eval or any(e["step"] >= int(planned) for e in evals)
    return ("finished" if step >= int(planned) and evaluated else "partial"), step


def bench_finished(run_dir: Path) -> bool:
    return any(run_dir.glob(BENCH_GLOB)) or (run_dir / TILE_COUNTS).is_file()


def record_launch(run: Run, plan: ScalePlan, run_dir: Path, argv: list[str]) -> dict:
    """Append this launch to the run's reproduce.json (atomic write); returns the entry."""
    path = run_dir / LAUNCH_FILE
    info = json.loads(path.read_text()) if path.is_file() else {"launches": []}
    info |= {
        "experiment": plan.experiment,
        "scale": plan.scale,
        "data": plan.data,
        "run": run.name,
        "kind": run.kind,
    }
    entry = {
        "command": shown(argv),
        "commit": git_commit(REPO),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    info["launches"].append(entry)
    write_json(path, info)
    return info


def finish_launch(run_dir: Path, info: dict, exit_code: int) -> None:
    info["launches"][-1] |= {
        "exit_code": exit_code,
        "ended": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    write_json(run_dir / LAUNCH_FILE, info)


def select(runs: Sequence[Run], patterns: Sequence[str] | None) -> list[Run]:
    """The runs whose names match any of the shell-style patterns (all when none given)."""
    if not patterns:
        return list(runs)
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(r.name, pattern) for r in runs):
            names = ", ".join(r.name for r in runs)
            raise ValueError(f"--only {pattern!r} matches no run; the runs are: {names}")
    return [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def child_env() -> dict[str, str]:
    """This environment, with the repository importable by the scripts."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def execute(
    plan: ScalePlan,
    out_dir: str | Path,
    *,
    extra: Sequence[str] = (),
    only: Sequence[str] | None = None,
    dry_run: bool = False,
    run_paper: bool = False,
    echo=print,
) -> int:
    """Print the plan and run what is not finished; returns the exit code (1: a run failed)."""
    out_dir = Path(out_dir).absolute()
    runs_dir = out_dir / "runs"
    runs = select(plan.runs, only)
    echo(f"{plan.experiment} at scale {plan.scale}" + (f", data {plan.data}" if plan.data else ""))
    echo(f"  cost:  {plan.cost}\n  needs: {plan.needs}")
    todo = []
    for i, run in enumerate(runs, 1):
        run_dir = runs_dir / run.name
        argv = command(run, run_dir, extra)
        if run.kind == "bench":
            state = "finished" if bench_finished(run_dir) else "new"
            where = ""
        else:
            state, step = train_state(run, run_dir, extra)
            where = f" at step {step}" if state != "new" else ""
        echo(f"[{i}/{len(runs)}] {run.name}: {state}{where}\n  {shown(argv)}")
        if state != "finished":
            todo.append((run, run_dir, argv))
    if dry_run:
        echo("--dry-run: nothing was run")
        return 0
    if plan.scale == "paper" and not run_paper:
        echo("scale paper: the commands above are the paper's setting; add --run to start them")
        return 0
    failed = []
    for run, run_dir, argv in todo:
        echo(f"running {run.name}")
        sys.stdout.flush()
        run_dir.mkdir(parents=True, exist_ok=True)
        info = record_launch(run, plan, run_dir, argv)
        code = subprocess.run(argv, env=child_env()).returncode
        finish_launch(run_dir, info, code)
        if code != 0:
            echo(f"{run.name} failed with exit code {code}; see {run_dir}")
            failed.append(run.name)
    write_experiment_report(plan.experiment, out_dir, echo)
    if failed:
        echo(f"{len(failed)} run(s) failed: {', '.join(failed)}")
    return 1 if failed else 0


def experiment_runs(experiment: str, runs_dir: Path) -> list[Path]:
    """Every run folder under runs_dir that reproduce.py ran for this experiment (any scale)."""
    found = []
    for info in sorted(runs_dir.glob(f"*/{LAUNCH_FILE}")):
        if json.loads(info.read_text()).get("experiment") == experiment:
            found.append(info.parent)
    return found


def write_experiment_report(experiment: str, out_dir: Path, echo=print) -> None:
    run_dirs = experiment_runs(experiment, out_dir / "runs")
    if not run_dirs:
        echo("no runs to report")
        return
    for path in write_reports(run_dirs, out_dir):
        echo(f"report: {path}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("experiment", choices=EXPERIMENT_NAMES)
    p.add_argument("--scale", choices=SCALES, required=True)
    p.add_argument("--out", type=Path, default=Path("reproduce"), help="default: ./reproduce")
    p.add_argument("--data", default=None, help="context-length: pysrc | synthetic | openwebtext")
    p.add_argument("--only", nargs="+", metavar="RUN", help="run names or shell patterns")
    p.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra overrides added to every train run (after the matrix's)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--run", action="store_true", help="scale paper: really start the runs")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        the_plan = experiments.plan(args.experiment, args.scale, args.data)
        return execute(
            the_plan,
            args.out,
            extra=args.override,
            only=args.only,
            dry_run=args.dry_run,
            run_paper=args.run,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
