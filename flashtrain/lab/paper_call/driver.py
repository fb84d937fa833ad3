"""The call's phases in order, each a child process whose command is printed, inside one budget.

1. images: Pathfinder-32's (then Path-X's) images generated in the background on the CPU cores
   (scripts/prepare_data.py), while the GPU does the rest.
2. probe: pysrc tokenized into its token cache, then a few steps of each run shape timed
   (flashtrain/lab/paper_call/probe.py).
3. context-length: the runs of the matrix's `gpu-call` scale, every one with the same steps
   (equal tokens at every context), as many as fit the context-length share of the time left
   (budget.equal_steps), each stopped at its deadline (SIGTERM: it checkpoints).
4. evaluation: every run at its own context on the same held-out tokens, by position.
5. pathfinder: Pathfinder-32 with the steps that fit its share of what is left.
6. Path-X: only when Pathfinder-32 is above chance by 3 standard deviations and its images are
   ready and its steps fit what is left.
7. the report (report.py), also when a phase failed or the call was stopped (SIGINT, SIGTERM).

Everything comes back flat in the output folder: call.md, call.json, call.log and the plots;
the run folders (checkpoints) stay in the work folder.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from flashtrain.lab import experiments
from flashtrain.lab.bench.results import write_json
from flashtrain.lab.checkout import REPO
from flashtrain.lab.experiments.overrides import setting
from flashtrain.lab.experiments.spec import Run
from flashtrain.lab.paper_call import report
from flashtrain.lab.paper_call.budget import (
    Clock,
    RunCost,
    above_chance,
    deadline_for,
    equal_steps,
)
from flashtrain.lab.paper_call.children import CallLog, Child, ChildResult
from flashtrain.lab.paper_call.evaluate_runs import EVAL_FOLDER
from flashtrain.lab.paper_call.settings import (
    CallSettings,
    context_run,
    pathfinder_run,
)
from flashtrain.lab.reports.runs import read_metrics
from flashtrain.lab.reproduce import child_env, command, finish_launch, record_launch
from flashtrain.utils import missing_modules

# What the children import beyond the GPU image (../shared/gpu/wheels.sh full carries them).
NEEDED_MODULES = ("hydra", "omegaconf", "datasets")
CALL_JSON = "call.json"
CALL_LOG = "call.log"
PROBE_IMAGES = {"gpu": 2000, "dry-run": 200}  # a probe's own small Pathfinder set
PATHFINDER_SHARE = 0.6  # of the time left at Pathfinder-32's start (the rest: Path-X)


class CallStopped(Exception):
    """SIGINT or SIGTERM reached the call: the running child is stopped, the report written."""


class Call:
    """One call's state: its clock, log, record (call.json) and the children running."""

    def __init__(self, settings: CallSettings, out_dir: Path, work_dir: Path, budget_s: float,
                 echo=print):  # fmt: skip
        self.settings = settings
        self.out_dir = out_dir
        self.work_dir = work_dir
        self.runs_dir = work_dir / "runs"
        out_dir.mkdir(parents=True, exist_ok=True)
        work_dir.mkdir(parents=True, exist_ok=True)
        self.clock = Clock(budget_s)
        self.log = CallLog(out_dir / CALL_LOG, echo)
        self.env = child_env()
        self.env.setdefault("FLASHTRAIN_DATA", str(work_dir / "data_cache"))
        # No network on a GPU machine: never wait on a hub; progress bars redraw rarely.
        self.env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TQDM_MININTERVAL="10")
        self.env.update(settings.child_env)
        self.running: list[Child] = []
        self.stop_reason: str | None = None
        self.record: dict = {
            "settings": settings.name,
            "budget_s": budget_s,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "work_dir": str(work_dir),
            "data_cache": self.env["FLASHTRAIN_DATA"],
            "phases": {},
            "commands": [],
        }

    # ---- bookkeeping

    def save(self) -> None:
        self.record["elapsed_s"] = round(self.clock.elapsed(), 1)
        write_json(self.out_dir / CALL_JSON, self.record)

    def phase(self, name: str, status: str, **facts) -> None:
        entry = self.record["phases"].setdefault(name, {})
        entry.update(status=status, at_s=round(self.clock.elapsed(), 1), **facts)
        self.log.say(f"[{self.clock.elapsed():6.1f} s] {name}: {status}")
        self.save()

    def start(self, argv: list[str], tag: str) -> Child:
        if self.stop_reason:
            raise CallStopped(self.stop_reason)
        child = Child(argv, tag, self.log, self.env, REPO)
        self.running.append(child)
        if self.stop_reason:  # the signal came while it started: stop_children did not see it
            child.stop(self.settings.grace_s, self.stop_reason)
        return child

    def deadline(self, seconds: float) -> float:
        """A child's own time limit: `seconds` (what it should take here, with slack) times
        settings.deadline_scale (the dry run's limits are hang guards)."""
        return seconds * self.settings.deadline_scale

    def wait_for(self, child: Child, timeout_s: float | None) -> ChildResult:
        """Wait for a child (stopping it at timeout_s) and record its command and outcome."""
        result = child.wait(timeout_s, self.settings.grace_s)
        if child in self.running:
            self.running.remove(child)
        entry = {"tag": child.tag, "command": result.command, "exit_code": result.exit_code,
                 "seconds": round(result.seconds, 1), "stopped": result.stopped}  # fmt: skip
        self.record["commands"].append(entry)
        return result

    def finish(self, child: Child, timeout_s: float | None) -> ChildResult:
        """wait_for, then call.json saved; CallStopped when the call was stopped meanwhile."""
        result = self.wait_for(child, timeout_s)
        self.save()
        if self.stop_reason:
            raise CallStopped(self.stop_reason)
        return result

    def stop_children(self, why: str) -> None:
        for child in list(self.running):
            child.stop(self.settings.grace_s, why)

    def on_signal(self, signum, frame) -> None:
        self.stop_reason = f"stopped by {signal.Signals(signum).name}"
        threading.Thread(target=self.stop_children, args=(self.stop_reason,), daemon=True).start()

    def python(self, *args: str) -> list[str]:
        return [sys.executable, *args]


# ---- the images, in the background ------------------------------------------------------------


def prepare_argv(call: Call, run: Run, workers: int) -> list[str]:
    """scripts/prepare_data.py for a Pathfinder run's images: its data choice and settings."""
    keys = ("resolution", "contour_length", "num_samples", "generator_seed")
    data = composed(run.args).data
    values = [f"{k}={data[k]}" for k in keys] + [f"num_workers={workers}"]
    return call.python(str(REPO / "scripts" / "prepare_data.py"), setting(run.args, "data"),
                       *values)  # fmt: skip


def composed(overrides):
    from flashtrain.lab.bench.training import compose

    return compose(list(overrides))


class Images:
    """Generates the image sets one after the other on a thread; each has an event when done."""

    def __init__(self, call: Call, jobs: list[tuple[str, list[str]]]):
        self.call = call
        self.jobs = jobs
        self.done = {name: threading.Event() for name, _ in jobs}
        self.ok = dict.fromkeys(self.done, False)
        self.child: Child | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for name, argv in self.jobs:
            if self.stopping:
                return
            try:
                self.child = self.call.start(argv, f"images {name}")
            except CallStopped:
                return
            result = self.call.wait_for(self.child, None)
            self.ok[name] = result.ok()
            self.done[name].set()
            if not result.ok():
                return

    def wait(self, name: str, timeout_s: float) -> str:
        """ "ready", or why not: "failed (see call.log)" or "not ready in time"."""
        self.done[name].wait(max(0.0, timeout_s))
        if self.ok[name]:
            return "ready"
        return "failed (see call.log)" if self.done[name].is_set() else "not ready in time"

    def stop(self) -> None:
        self.stopping = True
        if self.child is not None:
            self.child.stop(self.call.settings.grace_s, "not needed any more")

    def status(self) -> str:
        """done when every set was made; otherwise which were and were not."""
        if all(self.ok.values()):
            return "done"
        made = [name for name, ok in self.ok.items() if ok]
        first = "done: " if self.ok[self.jobs[0][0]] else "incomplete: "
        return first + ", ".join(f"{name} {'made' if name in made else 'not made'}"
                                 for name in self.ok)  # fmt: skip


def generator_workers(settings: CallSettings) -> int:
    if settings.generator_workers is not None:
        return settings.generator_workers
    return max(1, (os.cpu_count() or 2) // 2 - 2)


# ---- the probe --------------------------------------------------------------------------------


def probe_points(call: Call, context: list[Run], path32: Run, pathx: Run) -> dict:
    """One point per context length (a seed changes no step time) and per Pathfinder shape,
    the Pathfinder ones on a small image set of their own."""
    images = PROBE_IMAGES[call.settings.name]
    points = {}
    for run in context:
        points.setdefault(f"ctx{setting(run.args, 'seq_len')}", list(run.args))
    for name, run in (("path32", path32), ("pathx", pathx)):
        points[name] = [*run.args, f"data.num_samples={images}"]
    return points


def run_probe(call: Call, points: dict, prepare: list[str]) -> dict | None:
    plan = {"steps": call.settings.probe_steps, "prepare": prepare,
            "points": [{"name": n, "overrides": o} for n, o in points.items()]}  # fmt: skip
    plan_path = call.work_dir / "probe-plan.json"
    write_json(plan_path, plan)
    out = call.work_dir / "probe.json"
    argv = call.python("-m", "flashtrain.lab.paper_call.probe", str(plan_path), "--out", str(out))
    limit = min(call.deadline(call.settings.probe_limit_s),
                call.clock.left() - call.settings.report_reserve_s)  # fmt: skip
    result = call.finish(call.start(argv, "probe"), limit)
    probe = json.loads(out.read_text()) if out.is_file() else None
    call.record["probe"] = probe
    if not result.ok() or probe is None or len(probe["points"]) < len(points):
        call.phase(
            "probe",
            f"failed: exit {result.exit_code}" + (f" ({result.stopped})" if result.stopped else ""),
        )
        return None
    call.phase("probe", "done", seconds=round(result.seconds, 1))
    return probe


def run_cost(call: Call, probe: dict, point: str) -> RunCost:
    """A run's step time and fixed seconds: the probe's start-up and build, its first step's
    extra time, and the end of a run (checkpoint, final evaluation, exit)."""
    measured = probe["points"][point]
    steady = measured["steady_step_s"]
    first_extra = max(0.0, measured["step_s"][0] - steady)
    fixed = probe["startup_s"] + measured["build_s"] + first_extra + call.settings.run_end_s
    return RunCost(step_s=steady, fixed_s=fixed)


# ---- the train runs ---------------------------------------------------------------------------


def train_run(call: Call, run: Run, plan, steps: int, cost: RunCost, extra: list[str],
              limit_s: float) -> dict:  # fmt: skip
    """One train run with `steps` steps; stopped at min(its deadline, limit_s)."""
    run_dir = call.runs_dir / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = command(run, run_dir, [f"trainer.max_steps={steps}", *extra])
    info = record_launch(run, plan, run_dir, argv)
    timeout = min(call.deadline(deadline_for(cost, steps)), limit_s)
    result = call.finish(call.start(argv, run.name), timeout)
    finish_launch(run_dir, info, result.exit_code if result.exit_code is not None else -9)
    train, evals = (
        read_metrics(run_dir / "metrics.jsonl")
        if (run_dir / "metrics.jsonl").is_file()
        else ([], [])
    )
    return {
        "name": run.name,
        "seq_len": int(setting(run.args, "seq_len")),
        "seed": int(setting(run.args, "seed")),
        "run_dir": str(run_dir),
        "planned_steps": steps,
        "predicted_s": round(cost.seconds(steps), 1),
        "timeout_s": round(timeout, 1),
        "seconds": round(result.seconds, 1),
        "exit_code": result.exit_code,
        "stopped": result.stopped,
        "steps": train[-1]["step"] if train else 0,
        "train": train,
        "evals": evals,
    }


def context_length(call: Call, runs: list[Run], probe: dict) -> list[dict]:
    s = call.settings
    plan = experiments.plan("context-length", "gpu-call")
    costs = [run_cost(call, probe, f"ctx{setting(r.args, 'seq_len')}") for r in runs]
    share = (call.clock.left() - s.report_reserve_s) * s.context_share
    evaluation = evaluation_estimate(call, runs, costs)
    steps = equal_steps(costs, share - evaluation, s.max_steps)
    call.record["context_length"] = {"steps": steps, "share_s": round(share, 1),
                                     "evaluation_estimate_s": round(evaluation, 1), "runs": []}  # fmt: skip
    if steps < s.min_steps:
        call.phase("context-length", f"skipped: budget ({steps} steps fit, {s.min_steps} needed)")
        return []
    call.phase("context-length", f"running: {len(runs)} runs of {steps} steps")
    results = []
    for run, cost in zip(runs, costs):
        limit = call.clock.left() - s.report_reserve_s - evaluation
        if limit < cost.seconds(1):
            results.append({"name": run.name, "skipped": "budget"})
            continue
        results.append(train_run(call, run, plan, steps, cost, [], limit))
        call.record["context_length"]["runs"] = results
        call.save()
    call.record["context_length"]["runs"] = results
    failed = [r["name"] for r in results if r.get("exit_code") not in (0, None) or r.get("skipped")]
    call.phase("context-length", "done" if not failed else f"incomplete: {', '.join(failed)}")
    return results


def evaluation_estimate(call: Call, runs: list[Run], costs: list[RunCost]) -> float:
    """The evaluation's seconds: its start-up and model loads, and forward passes over
    eval_tokens at each context (a third of a training step's time per token)."""
    s = call.settings
    seconds = 2 * s.eval_start_s + s.eval_start_s * len(runs)
    for run, cost in zip(runs, costs):
        tokens = int(setting(run.args, "global_batch_tokens"))
        seconds += s.eval_tokens / tokens * cost.step_s / 3
    return seconds


def evaluate(call: Call, results: list[dict]) -> None:
    done = [Path(r["run_dir"]) for r in results if r.get("steps")]
    if not done:
        call.phase("evaluation", "skipped: no run trained")
        return
    s = call.settings
    argv = call.python("-m", "flashtrain.lab.paper_call.evaluate_runs", "--tokens",
                       str(s.eval_tokens), "--batch-size", str(s.eval_batch_size),
                       *map(str, done))  # fmt: skip
    estimate = call.record["context_length"]["evaluation_estimate_s"]
    limit = min(call.clock.left() - s.report_reserve_s, call.deadline(max(60.0, 3 * estimate)))
    result = call.finish(call.start(argv, "evaluate"), limit)
    for r in results:
        path = Path(r.get("run_dir", "-")) / EVAL_FOLDER / "eval.json"
        if path.is_file():
            r["evaluation"] = json.loads(path.read_text())
    call.save()
    status = "done" if result.ok() else f"failed: exit {result.exit_code}"
    call.phase("evaluation", status + (f" ({result.stopped})" if result.stopped else ""))


# ---- pathfinder -------------------------------------------------------------------------------


def final_accuracy(result: dict, run: Run) -> tuple[int, int] | None:
    """(correct, evaluated) of the run's last evaluation: its accuracy times the images it
    evaluated (eval_batches x micro-batch, at most the validation split)."""
    evals = [e for e in result.get("evals", []) if "eval/accuracy" in e]
    if not evals:
        return None
    cfg = composed(run.args)
    images = min(int(cfg.trainer.eval_batches) * int(cfg.micro_batch_size),
                 int(cfg.data.num_samples) // 10)  # fmt: skip
    return round(evals[-1]["eval/accuracy"] * images), images


def pathfinder_train(call: Call, run: Run, probe: dict, point: str, seconds: float) -> dict | None:
    s = call.settings
    cost = run_cost(call, probe, point)
    steps = equal_steps([cost], seconds, s.max_steps)
    if steps < s.min_steps:
        return {"name": run.name, "skipped": f"budget ({steps} steps fit, {s.min_steps} needed)"}
    plan = experiments.plan("pathfinder", "gpu-call")
    every = max(1, steps // s.pathfinder_evals)
    return train_run(call, run, plan, steps, cost, [f"trainer.eval_interval={every}"], seconds)


def pathfinder(call: Call, images: Images, probe: dict, path32: Run, pathx: Run) -> None:
    s = call.settings
    results = call.record.setdefault("pathfinder", {})
    need = run_cost(call, probe, "path32").seconds(s.min_steps)
    ready = images.wait("path32", call.clock.left() - s.report_reserve_s - need)
    if ready != "ready":
        results["path32"] = {"name": path32.name, "skipped": f"its images {ready}"}
        call.phase("pathfinder", f"skipped: Pathfinder-32's images {ready}")
        return
    left = call.clock.left() - s.report_reserve_s
    call.phase("pathfinder", "running Pathfinder-32")
    results["path32"] = first = pathfinder_train(
        call, path32, probe, "path32", left * PATHFINDER_SHARE
    )
    if "skipped" in first:
        call.phase("pathfinder", f"skipped: Pathfinder-32: {first['skipped']}")
        return
    counts = final_accuracy(first, path32)
    first["above_chance"] = counts is not None and above_chance(*counts)
    first["correct_evaluated"] = counts
    call.save()
    if first["exit_code"] != 0:
        how = first["stopped"] or f"exit {first['exit_code']}"
        call.phase("pathfinder", f"incomplete: Pathfinder-32 ended with {how}; Path-X not run")
        return
    if not first["above_chance"]:
        results["pathx"] = {"name": pathx.name, "skipped": "Pathfinder-32 is not above chance"}
        call.phase("pathfinder", "done; Path-X not run: Pathfinder-32 is not above chance")
        return
    left = call.clock.left() - s.report_reserve_s
    ready = images.wait("pathx", 0)
    if ready != "ready":
        results["pathx"] = {"name": pathx.name, "skipped": f"its images {ready}"}
        call.phase("pathfinder", f"done; Path-X not run: its images {ready}")
        return
    results["pathx"] = pathfinder_train(call, pathx, probe, "pathx", left)
    call.phase(
        "pathfinder",
        "done, Path-X "
        + ("run" if "skipped" not in results["pathx"] else results["pathx"]["skipped"]),
    )


# ---- the call ---------------------------------------------------------------------------------


def run_call(settings: CallSettings, out_dir: Path, work_dir: Path, budget_s: float,
             echo=print) -> int:  # fmt: skip
    """All phases, then the report; 0 when every phase ran to its end, 1 otherwise."""
    call = Call(settings, out_dir, work_dir, budget_s, echo)
    previous = {sig: signal.signal(sig, call.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    images = None
    try:
        call.record["environment"] = environment()
        missing = missing_modules(NEEDED_MODULES)
        if missing:
            call.phase("environment", f"failed: {', '.join(missing)} missing (carry the wheels "
                       "of ../shared/gpu/wheels.sh full)")  # fmt: skip
            return 1
        call.phase("environment", "done")
        context = [
            context_run(r, settings) for r in experiments.plan("context-length", "gpu-call").runs
        ]
        pf_runs = experiments.plan("pathfinder", "gpu-call").runs
        path32, pathx = (pathfinder_run(r, settings, pathx=i == 1) for i, r in enumerate(pf_runs))
        workers = generator_workers(settings)
        images = Images(call, [("path32", prepare_argv(call, path32, workers)),
                               ("pathx", prepare_argv(call, pathx, workers))])  # fmt: skip
        call.phase("images", f"generating in the background ({workers} processes)")
        probe = run_probe(call, probe_points(call, context, path32, pathx), context[0].args)
        if probe is not None:
            results = context_length(call, context, probe)
            evaluate(call, results)
            pathfinder(call, images, probe, path32, pathx)
    except CallStopped as stopped:
        call.phase("call", str(stopped))
    finally:
        if images is not None:
            images.stop()
            images.thread.join(timeout=settings.grace_s + 5)
            call.phase("images", images.status())
        call.stop_children("the call ends")
        write_report(call)
        call.log.close()
        # only now: a second signal while the children stop and the report is written must
        # not interrupt them (it only repeats the stop)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if report.all_done(call.record) else 1


def write_report(call: Call) -> None:
    """The report; a failure to write it is logged with its traceback and call.md says so
    (call.json holds everything measured either way)."""
    try:
        written = report.write(call.record, call.out_dir)
    except Exception:  # noqa: BLE001 - the call's record must come back whatever the report does
        error = traceback.format_exc()
        call.record["report_error"] = error
        call.log.say(f"the report failed:\n{error}")
        written = [report.write_failure(call.record, call.out_dir, error)]
    call.log.say(f"[{call.clock.elapsed():6.1f} s] report: " + ", ".join(p.name for p in written))
    call.save()


def environment() -> dict:
    from flashtrain.lab.bench.measure import environment as measured

    return measured()
