"""The paper call (flashtrain.lab.paper_call, scripts/paper_call.py): its budget arithmetic, the
gpu-call scale it runs, its report, its Pathfinder gate, and its CPU dry run end to end (every
phase at toy sizes, real child processes) including a stop by SIGINT mid-call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashtrain.lab.experiments import plan
from flashtrain.lab.experiments.overrides import setting
from flashtrain.lab.paper_call import driver, report
from flashtrain.lab.paper_call.budget import (
    Clock,
    RunCost,
    above_chance,
    deadline_for,
    equal_steps,
)
from flashtrain.lab.paper_call.children import ChildResult
from flashtrain.lab.paper_call.cli import MAX_OUT_FILES, check_folders
from flashtrain.lab.paper_call.probe import steady_step_s
from flashtrain.lab.paper_call.settings import DRY_RUN, GPU, context_run, pathfinder_run

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 900  # the dry run takes about a minute on 2 idle cores, a few on busy ones


# ---- the budget -------------------------------------------------------------------------------


def test_equal_steps_fill_the_time_with_every_run_taking_the_same_steps():
    costs = [RunCost(step_s=0.5, fixed_s=10), RunCost(step_s=1.5, fixed_s=20)]
    # 100 s: 30 s fixed, 70 s of steps at 2 s a step (one step of each run) -> 35 steps
    assert equal_steps(costs, 100.0) == 35
    assert sum(c.seconds(35) for c in costs) <= 100.0 < sum(c.seconds(36) for c in costs)
    assert equal_steps(costs, 100.0, cap=3) == 3
    assert equal_steps(costs, 25.0) == 0  # not even the fixed costs fit
    with pytest.raises(ValueError, match="at least one"):
        equal_steps([], 10.0)
    with pytest.raises(ValueError, match="> 0 s"):
        equal_steps([RunCost(0.0, 1.0)], 10.0)


def test_a_deadline_leaves_slack_over_the_prediction():
    cost = RunCost(step_s=1.0, fixed_s=20.0)
    assert deadline_for(cost, 100) == pytest.approx(120 * 1.25)
    assert deadline_for(cost, 1) == pytest.approx(21 + 10)  # at least 10 s of slack


def test_above_chance_needs_three_standard_deviations():
    # 400 images: sd 0.025, the bar 0.575
    assert not above_chance(230, 400)
    assert above_chance(231, 400)
    assert not above_chance(0, 0)
    assert not above_chance(60, 100)  # 0.60 < 0.65 with 100 images


def test_the_clock_counts_down_from_the_budget():
    now = [100.0]
    clock = Clock(60, now=lambda: now[0])
    now[0] += 15
    assert clock.elapsed() == 15 and clock.left() == 45 and clock.at(5) == 20


def test_the_probe_times_a_steady_step_after_the_first():
    assert steady_step_s([9.0, 1.0, 3.0, 2.0]) == 2.0
    with pytest.raises(ValueError, match="at least 2 steps"):
        steady_step_s([1.0])


# ---- what runs --------------------------------------------------------------------------------


def test_the_gpu_call_scale_is_context_length_and_pathfinder_only():
    context = plan("context-length", "gpu-call")
    lengths = [int(setting(r.args, "seq_len")) for r in context.runs]
    assert sorted(lengths) == [1024, 1024, 4096, 16384]
    seeds = {setting(r.args, "seed") for r in context.runs if setting(r.args, "seq_len") == "1024"}
    assert len(seeds) == 2  # the seed-to-seed spread at 1K
    assert setting(context.runs[0].args, "data") == "pysrc"
    assert setting(context.runs[0].args, "data.pysrc_packages") == "true"
    pathfinder = plan("pathfinder", "gpu-call")
    assert [setting(r.args, "seq_len") for r in pathfinder.runs] == ["1024", "16384"]
    with pytest.raises(ValueError, match="bert has no scale 'gpu-call'; its scales: tiny, gpu"):
        plan("bert", "gpu-call")


@pytest.mark.parametrize("settings", [GPU, DRY_RUN], ids=lambda s: s.name)
def test_every_context_run_takes_the_same_tokens_per_step(settings):
    runs = [context_run(r, settings) for r in plan("context-length", "gpu-call").runs]
    per_step = set()
    for run in runs:
        seq_len = int(setting(run.args, "seq_len"))
        micro = int(setting(run.args, "micro_batch_size"))
        tokens = int(setting(run.args, "global_batch_tokens"))
        assert tokens % (seq_len * micro) == 0, run.name
        per_step.add(tokens)
    assert len(per_step) == 1
    lengths = sorted(int(setting(r.args, "seq_len")) for r in runs)
    assert lengths == sorted(settings.seq_lens[c] for c in (1024, 1024, 4096, 16384))


def test_the_dry_run_runs_path_x_code_at_a_cpu_size():
    pathx = plan("pathfinder", "gpu-call").runs[1]
    run = pathfinder_run(pathx, DRY_RUN, pathx=True)
    assert setting(run.args, "data") == "pathx" and setting(run.args, "seq_len") == "1024"
    assert pathfinder_run(pathx, GPU, pathx=True).args == pathx.args


def test_the_output_folder_stays_flat_and_the_work_folder_fresh(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "old").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        check_folders(tmp_path / "out", tmp_path / "work")
    with pytest.raises(ValueError, match="inside it"):
        check_folders(tmp_path / "out", tmp_path / "out" / "work")
    check_folders(tmp_path / "out", tmp_path / "new")


# ---- the report -------------------------------------------------------------------------------


def _evaluated_run(seq_len: int, seed: int, loss: float) -> dict:
    positions = [{"start": 0, "end": 4, "loss": loss + 1, "tokens": 4},
                 {"start": 4, "end": seq_len, "loss": loss, "tokens": seq_len - 4}]  # fmt: skip
    return {
        "name": f"ctx{seq_len}-s{seed}", "seq_len": seq_len, "seed": seed, "steps": 10,
        "planned_steps": 10, "seconds": 12.0, "exit_code": 0, "stopped": None,
        "train": [{"step": 10, "train/tokens_seen": 1000.0, "perf/tokens_per_s": 99.0}],
        "evals": [],
        "evaluation": {"data": {"name": "pysrc"}, "lengths": [{"loss": loss, "tokens": 512,
                       "bits_per_byte": loss / 0.693, "positions": positions}]},
    }  # fmt: skip


def test_a_longer_context_meets_the_target_only_beyond_the_seed_spread():
    runs = [_evaluated_run(1024, 1, 1.00), _evaluated_run(1024, 2, 1.02),
            _evaluated_run(4096, 1, 1.00), _evaluated_run(16384, 1, 0.95)]  # fmt: skip
    verdict = report.context_verdict(runs)
    assert verdict["short_mean"] == pytest.approx(1.01)
    assert verdict["spread"] == pytest.approx(0.02)
    assert verdict["gains"][4096] == {"gain": pytest.approx(0.01), "beats_spread": False}
    assert verdict["gains"][16384] == {"gain": pytest.approx(0.06), "beats_spread": True}
    assert report.context_verdict(runs[1:])["spread"] is None  # one seed: no spread


def test_the_report_is_written_whatever_the_call_reached(tmp_path):
    record = {"settings": "gpu", "budget_s": 540.0, "started": "now", "environment": {},
              "phases": {"probe": {"status": "failed: exit 1", "at_s": 3.0}}, "commands": []}  # fmt: skip
    paths = report.write(record, tmp_path)
    text = (tmp_path / report.REPORT).read_text()
    assert [p.name for p in paths] == [report.REPORT]
    assert "failed: exit 1" in text and "not started" in text
    assert not report.all_done(record)
    record["context_length"] = {"steps": 10, "runs": [
        _evaluated_run(1024, 1, 1.0), _evaluated_run(1024, 2, 1.01),
        _evaluated_run(16384, 1, 0.9), {"name": "ctx4096", "skipped": "budget"}]}  # fmt: skip
    record["pathfinder"] = {"path32": {"name": "p32", "skipped": "images not ready in time"}}
    paths = report.write(record, tmp_path)
    text = (tmp_path / report.REPORT).read_text()
    assert "| 16384 | 0.1050 | 0.0100 | met |" in text
    assert "not run: images not ready in time" in text
    assert report.CONTEXT_PNG in [p.name for p in paths]
    failed = report.write_failure(record, tmp_path, "Traceback: boom")
    assert "boom" in failed.read_text()


# ---- the Pathfinder gate ----------------------------------------------------------------------


class _Images:
    def __init__(self, ready):
        self.ready = ready

    def wait(self, name, timeout_s):
        return "ready" if self.ready[name] else "not ready in time"


def _gate(tmp_path, monkeypatch, accuracy: float, pathx_ready: bool):
    """driver.pathfinder with its runs replaced: Pathfinder-32 ends at `accuracy` on 200 images."""
    call = driver.Call(DRY_RUN, tmp_path, tmp_path / "work", 100.0, echo=lambda text: None)
    trained = []

    def fake_train(call, run, probe, point, seconds):
        trained.append((point, seconds))
        return {"name": run.name, "steps": 5, "planned_steps": 5, "seconds": 1.0,
                "exit_code": 0, "stopped": None,
                "evals": [{"step": 5, "eval/accuracy": accuracy}]}  # fmt: skip

    monkeypatch.setattr(driver, "pathfinder_train", fake_train)
    monkeypatch.setattr(driver, "final_accuracy", lambda result, run: (round(accuracy * 200), 200))
    probe = {"startup_s": 1.0, "points": {"path32": {"build_s": 0.1, "step_s": [0.2, 0.1],
             "steady_step_s": 0.1}}}  # fmt: skip
    runs = plan("pathfinder", "gpu-call").runs
    driver.pathfinder(call, _Images({"path32": True, "pathx": pathx_ready}), probe, *runs)
    call.log.close()
    return call.record["pathfinder"], trained


def test_path_x_runs_only_after_pathfinder_32_leaves_chance(tmp_path, monkeypatch):
    results, trained = _gate(tmp_path / "a", monkeypatch, accuracy=0.52, pathx_ready=True)
    assert [p for p, _ in trained] == ["path32"]
    assert results["pathx"]["skipped"] == "Pathfinder-32 is not above chance"
    assert results["path32"]["above_chance"] is False
    results, trained = _gate(tmp_path / "b", monkeypatch, accuracy=0.75, pathx_ready=True)
    assert [p for p, _ in trained] == ["path32", "pathx"]
    assert trained[0][1] < trained[1][1] + trained[0][1]  # Path-X gets what is left
    results, trained = _gate(tmp_path / "c", monkeypatch, accuracy=0.75, pathx_ready=False)
    assert results["pathx"]["skipped"] == "its images not ready in time"


def test_too_little_time_skips_context_length_without_starting_a_run(tmp_path):
    call = driver.Call(DRY_RUN, tmp_path, tmp_path / "work", 10.0, echo=lambda text: None)
    runs = [context_run(r, DRY_RUN) for r in plan("context-length", "gpu-call").runs]
    point = {"build_s": 1.0, "step_s": [2.0, 1.0], "steady_step_s": 1.0}
    probe = {"startup_s": 4.0, "points": {f"ctx{n}": point for n in (32, 64, 128)}}
    assert driver.context_length(call, runs, probe) == []
    call.log.close()
    assert call.record["phases"]["context-length"]["status"].startswith("skipped: budget")
    assert call.record["commands"] == []


class _Finished:
    """A child that has already ended (exit 0), keeping the time limit the call gave it."""

    limits: dict[str, float] = {}

    def __init__(self, argv, tag, log, env, cwd):
        self.tag = tag

    def wait(self, timeout_s, grace_s):
        self.limits[self.tag] = timeout_s
        return ChildResult(self.tag, 0, 0.0)


def _limits(tmp_path, monkeypatch, settings) -> dict[str, float]:
    """The time limits one call with `settings` gives its probe, a run of 3 steps (0.1 s each,
    2 s fixed) and the evaluation."""
    monkeypatch.setattr(driver, "Child", _Finished)
    _Finished.limits = {}
    call = driver.Call(settings, tmp_path / "out", tmp_path / "work", settings.budget_s,
                       echo=lambda text: None)  # fmt: skip
    driver.run_probe(call, {"ctx32": []}, [])
    run = context_run(plan("context-length", "gpu-call").runs[0], settings)
    cost = RunCost(step_s=0.1, fixed_s=2.0)
    trained = driver.train_run(call, run, plan("context-length", "gpu-call"), 3, cost, [], 1e9)
    call.record["context_length"] = {"evaluation_estimate_s": 3.0}
    driver.evaluate(call, [{**trained, "steps": 3}])
    call.log.close()
    return {("run" if tag == run.name else tag): s for tag, s in _Finished.limits.items()}


def test_the_dry_runs_time_limits_are_hang_guards(tmp_path, monkeypatch):
    """The dry run of a loaded machine (load 6 on 2 cores) once met its own deadlines: "probe:
    failed: exit -15 (deadline)". Its limits are scaled up (settings.deadline_scale) so that
    only a hung child meets one; the GPU call's stay its predictions with their slack."""
    gpu = _limits(tmp_path / "gpu", monkeypatch, GPU)
    assert gpu == {"probe": GPU.probe_limit_s, "run": deadline_for(RunCost(0.1, 2.0), 3),
                   "evaluate": 60.0}  # fmt: skip
    dry = _limits(tmp_path / "dry", monkeypatch, DRY_RUN)
    assert dry.keys() == gpu.keys()
    assert all(limit >= 180 for limit in dry.values()), dry  # minutes, not seconds
    assert dry["run"] == DRY_RUN.deadline_scale * gpu["run"]


def test_a_signal_while_a_child_starts_stops_it(tmp_path, monkeypatch):
    """SIGINT between a child's start and its entry among the running ones (the signal handler
    stops only those): the child is stopped as it is entered, not left to run to its end."""
    call = driver.Call(DRY_RUN, tmp_path, tmp_path / "work", 100.0, echo=lambda text: None)
    stops = []

    class SignalledWhileStarting:
        def __init__(self, argv, tag, log, env, cwd):
            call.on_signal(signal.SIGINT, None)  # nothing is running yet: nothing stopped

        def stop(self, grace_s, why):
            stops.append(why)

    monkeypatch.setattr(driver, "Child", SignalledWhileStarting)
    call.start(["true"], "probe")
    call.log.close()
    assert stops == ["stopped by SIGINT"]


# ---- the dry run ------------------------------------------------------------------------------


def _call(out: Path, work: Path) -> subprocess.Popen:
    """scripts/paper_call.py --dry-run as a user runs it."""
    cmd = [sys.executable, str(REPO / "scripts" / "paper_call.py"), "--dry-run", "--out",
           str(out), "--work", str(work)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def test_the_dry_run_runs_every_phase_and_reports_flat(tmp_path):
    """~50 s on 2 cores: the images in the background, the probe, four context-length runs of
    equal steps and tokens, their evaluation by position, Pathfinder-32, the report."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = _call(out, work)
    output = proc.communicate(timeout=HANG_GUARD_S)[0]
    assert proc.returncode == 0, output[-4000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["call.json", "call.log", "call.md", "context-length.png", "pathfinder.png"]
    assert len(files) <= MAX_OUT_FILES and all((out / f).is_file() for f in files)
    record = json.loads((out / "call.json").read_text())
    assert all(p["status"].startswith("done") for p in record["phases"].values())
    # every command printed, in the report and in the log
    text = (out / "call.md").read_text()
    for command in record["commands"]:
        assert f"$ {command['command']}" in output
        assert command["command"] in text and command["exit_code"] == 0
    tags = [c["tag"] for c in record["commands"]]
    assert tags.count("evaluate") == 1 and "probe" in tags and "images path32" in tags
    # equal steps and tokens at every context, each evaluated on the same held-out tokens
    runs = record["context_length"]["runs"]
    assert len(runs) == 4 and {r["planned_steps"] for r in runs} == {DRY_RUN.max_steps}
    assert {r["steps"] for r in runs} == {DRY_RUN.max_steps}
    assert len({r["train"][-1]["train/tokens_seen"] for r in runs}) == 1
    scored = {r["evaluation"]["lengths"][0]["tokens"] for r in runs}
    assert all(abs(t - DRY_RUN.eval_tokens) <= 128 for t in scored), scored
    assert "Seed-to-seed spread" in text
    path32 = record["pathfinder"]["path32"]
    assert path32["steps"] == DRY_RUN.max_steps and path32["correct_evaluated"] is not None
    assert "skipped" in record["pathfinder"]["pathx"]  # a 3-step model is not above chance
    assert (work / "runs" / runs[0]["name"] / "checkpoints").is_dir()


def _commands(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("$ ")]


def test_a_stopped_call_still_reports(tmp_path):
    """SIGINT while context-length trains: the run in flight is stopped (SIGTERM: it
    checkpoints), nothing else starts, the report says so; exit 1."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = _call(out, work)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        log = out / driver.CALL_LOG
        # the first train.py command is context-length's first run, started (a run not yet
        # started when the signal came would never start, and none would be in flight)
        while not (log.is_file() and "train.py" in "".join(_commands(log))):
            assert proc.poll() is None, "the call ended before the signal"
            assert time.monotonic() < deadline, "context-length never started a run"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=HANG_GUARD_S)[0]
    finally:
        proc.kill()
    assert proc.returncode == 1, output[-3000:]
    record = json.loads((out / "call.json").read_text())
    assert record["phases"]["call"]["status"] == "stopped by SIGINT"
    assert "evaluation" not in record["phases"]
    stopped = [c for c in record["commands"] if c["stopped"]]
    assert stopped and all(c["stopped"] == "stopped by SIGINT" for c in stopped)
    assert "stopped by SIGINT" in (out / "call.md").read_text()
