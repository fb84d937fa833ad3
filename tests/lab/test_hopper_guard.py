"""The hopper section's guard (flashtrain/lab/bench/hopper_guard.py) on CPU: its cases cover what
can hang on the GPU (many work items a persistent program, tails that leave a whole 64-row half
past the end); a case started and not done within its limit is a hang naming that case, while a
slow built-in case that keeps its limit is not; a Gluon result that is NaN or off the built-in
kernels' fails the guard as wrong after every case ran; ConSan's race fails it, an unfinished
ConSan child does not, and a Triton without ConSan (or no GPU) is recorded as skipped."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import triton

from flashtrain.kernels.hopper import route
from flashtrain.lab.bench import correctness, hopper_checks, hopper_guard, tile_sweep, ws_route
from flashtrain.lab.gpu_suite import cli

H200_SMS = 132  # the persistent forward runs one program a SM
BUILTIN, GLUON = hopper_guard.BUILTIN, hopper_guard.GLUON
GATE = f"gate {tile_sweep.AGREEMENT:g}"


def _items(case: correctness.Case) -> int:
    """The Gluon forward's work items: 128-row query tiles x heads x sequences."""
    return -(-case.seqlen // route.FWD_BLOCK_M) * case.heads * case.batch


def _half_past_the_end(rows: int) -> bool:
    """A last 128-row tile whose second 64-row half is wholly past the end."""
    return 1 <= rows % route.FWD_BLOCK_M <= route.FWD_BLOCK_M // 2


class _Packed(Exception):
    pass


def _last_document(case: correctness.Case, monkeypatch) -> int:
    """The length of the last document correctness packs a varlen case into (its own cuts)."""

    def capture(q, k, v, cu_seqlens_q, *args, **kwargs):
        raise _Packed(cu_seqlens_q.tolist())

    monkeypatch.setattr(correctness, "flash_attn_varlen_func", capture)
    with pytest.raises(_Packed) as packed:
        correctness.run_ours(case, *correctness.case_inputs(case, "cpu"))
    cuts = packed.value.args[0]
    return cuts[-1] - cuts[-2]


def test_the_guard_covers_what_can_hang(monkeypatch):
    """For each Gluon kernel, at hd 64 and 128: a case with over 3x the H200's SMs of the
    forward's work items (so every persistent program takes several; causal and full; 16 heads,
    the timed 16K shapes' specialization), a fixed-length B=1 case and a varlen case whose last
    128-row tile has a whole 64-row half past the end; the dry run's stand-ins keep the tails."""
    plan = hopper_checks.guard_plan(False)
    for kind in ("fwd", "dkdv"):
        guarded = [case for case, overrides in plan if kind in overrides]
        many = [c for c in guarded if _items(c) > 3 * H200_SMS]
        assert {c.head_dim for c in many} == {64, 128} and {c.causal for c in many} == {True, False}
        assert all(c.heads % 16 == 0 and c.batch == 1 for c in many), many
        tails = [c for c in guarded if c.kind == "dense" and c.batch == 1
                 and _half_past_the_end(c.seqlen)]  # fmt: skip
        assert {c.head_dim for c in tails} == {64, 128}, kind
        documents = [c for c in guarded if c.kind == "varlen"
                     and _half_past_the_end(_last_document(c, monkeypatch))]  # fmt: skip
        assert {c.head_dim for c in documents} == {64, 128}, kind
    dry = [case for case, _ in hopper_checks.guard_plan(True)]
    assert {c.head_dim for c in dry if _half_past_the_end(c.seqlen) and c.seqlen < 48} == {16, 32}
    assert len(dry) == len(plan)  # a stand-in for every case


def test_a_planted_hang_in_a_guard_case_is_named(monkeypatch):
    """The real guard child (dry run) whose fourth Gluon case blocks for ever (PLANT_HANG_ENV):
    the guard is hung, naming that case and its phase, after every built-in case and the three
    Gluon cases before it; the rest never ran."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    plan = hopper_checks.guard_plan(True)
    stuck = plan[3][0].name
    monkeypatch.setenv(hopper_guard.PLANT_HANG_ENV, stuck)
    limits = replace(hopper_guard.DRY_LIMITS, cases_s={BUILTIN: 90.0, GLUON: 5.0})  # a case: ~0.1 s
    row = hopper_guard.run_guard(True, require_gluon=False, limits=limits)
    n = len(plan)
    assert row["outcome"] == "hung", row
    assert row["detail"] == (f"Gluon case {stuck} past its limit of 5 s ({n} of {n} built-in "
                             f"and 3 of {n} Gluon cases done)")  # fmt: skip
    assert [r["case"] for r in row["cases"]] == [case.name for case, _ in plan[:3]]


def test_a_nan_gluon_result_fails_the_guard_as_wrong(tmp_path, monkeypatch):
    """A guard run whose second Gluon result has a NaN dq (PLANT_NAN_ENV, read in the dry run
    only): every case still runs, the guard is wrong, naming the case, the tensor and the
    difference, and nothing else of the section runs."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    plan = hopper_checks.guard_plan(True)
    wrong = plan[1][0].name
    monkeypatch.setenv(hopper_guard.PLANT_NAN_ENV, f"{wrong}|dq")
    monkeypatch.setattr(hopper_checks, "run", lambda *a, **k: pytest.fail("ran after the guard"))
    code = cli.main(["--dry-run", "--out", str(tmp_path), "--sections", "hopper"])
    sec = json.loads((tmp_path / "suite.json").read_text())["sections"]["hopper"]
    assert code == 1
    assert sec["status"] == f"failed: guard wrong: {wrong}: dq: NaN ({GATE})"
    guard = sec["rows"][0]
    assert [r["case"] for r in guard["cases"]] == [case.name for case, _ in plan]
    rows = {r["case"]: r for r in guard["cases"]}
    assert rows[wrong]["wrong"] == f"dq: NaN ({GATE})" and math.isnan(rows[wrong]["diffs"]["dq"])
    assert rows[wrong]["diffs"]["out"] == 0.0
    assert all(r["wrong"] is None for name, r in rows.items() if name != wrong)
    summary = (tmp_path / "summary.md").read_text()
    assert f"| hopper | {sec['status']} |" in summary and f"| dq: NaN ({GATE}) |" in summary


def test_a_result_off_the_built_in_kernels_is_wrong():
    """The gate is the sweep's: a result within AGREEMENT of the built-in kernels' passes, one
    beyond it is wrong, the first such tensor named with its difference."""
    case = hopper_checks.guard_cases(True)[0]
    builtin = [torch.ones(2, 3) for _ in hopper_checks.RESULTS]
    routes = {"fwd": ("torch", "no GPU"), "dkdv": ("torch", "no GPU")}
    overrides = ws_route.variant_configs("dkdv")
    close = [t * (1 + tile_sweep.AGREEMENT / 2) for t in builtin]
    assert hopper_checks.guard_row(case, overrides, close, routes, None, builtin)["wrong"] is None
    off = [builtin[0], builtin[1], builtin[2] * 1.5, builtin[3] * 2]
    row = hopper_checks.guard_row(case, overrides, off, routes, None, builtin)
    assert row["wrong"] == f"dk: 0.5 off the built-in kernels' ({GATE})"
    assert row["max_diff_vs_builtin"] == 1.0 and row["diffs"]["dv"] == 1.0


PROTOCOL = """
import json, sys, threading, time
def emit(**event):
    print("GUARD " + json.dumps(event), flush=True)
emit(cases=["a"])
emit(start="a", phase="built-in")
if sys.argv[1] == "forever":
    threading.Event().wait()
time.sleep(float(sys.argv[1]))  # a slow cold compile: no line for a while
emit(done="a", phase="built-in", seconds=float(sys.argv[1]))
emit(start="a", phase="Gluon")
emit(done="a", phase="Gluon", case="a", gluon=[], wrong=None, seconds=0.0)
"""


def _protocol_child(tmp_path: Path, how: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(PROTOCOL)
    return [sys.executable, str(script), how]


@pytest.mark.parametrize("builtin", ["slow", "hung"])
def test_a_slow_built_in_case_is_no_hang_and_one_past_its_limit_is(tmp_path, builtin):
    """A built-in case that prints nothing for 4x idle_s but keeps its limit passes (the guard
    used to call that no progress); one that never ends is hung at its own limit, named."""
    cases = {BUILTIN: 60.0 if builtin == "slow" else 1.0, GLUON: 60.0}
    limits = hopper_guard.Limits(timeout_s=120.0, idle_s=0.5, cases_s=cases, consan_s=60.0,
                                 consan_wait_s=1.0)  # fmt: skip
    how = "2.0" if builtin == "slow" else "forever"
    row = hopper_guard.run_guard(True, require_gluon=False, limits=limits,
                                 commands={"guard": _protocol_child(tmp_path, how)})  # fmt: skip
    if builtin == "slow":
        passed = "1 of 1 built-in and 1 of 1 Gluon cases done; ConSan skipped"
        assert (row["outcome"], row["detail"]) == ("passed", passed), row
    else:
        assert (row["outcome"], row["detail"]) == (
            "hung", "built-in case a past its limit of 1 s (0 of 1 built-in and 0 of 1 Gluon "
            "cases done)"), row  # fmt: skip


RACE = """
import json, os, sys
open(os.environ["OPTS_FILE"], "w").write(os.environ.get("PTXAS_OPTIONS", ""))
def emit(**event):
    print("GUARD " + json.dumps(event), flush=True)
name = "ConSan forward: c (Gluon fwd)"
emit(cases=[name])
emit(start=name, phase="ConSan")
sys.stderr.write("flash_fwd_ws.py:301: block: [3,0,0], thread: [0,0,0] Assertion `Buffer being "
                 "accessed has outstanding writes.` failed.\\n")
emit(done=name, phase="ConSan", consan="error", detail="AcceleratorError: CUDA error: "
     "unspecified launch failure", seconds=1.0)
sys.exit(1)
"""
FOREVER = """
import os, threading
open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
threading.Event().wait()
"""


def test_a_consan_race_fails_the_guard_an_unfinished_child_does_not(tmp_path, monkeypatch):
    """ConSan children beside a guard child that passes: one ends its kernel with ConSan's
    assert on its stderr (its own row says only "error": the trap's CUDA error), the other
    never ends and is killed consan_wait_s after the guard child: the guard fails as a race
    quoting ConSan, and the other is "unfinished", no failure. ConSan children get ptxas at
    -O1 (CONSAN_ENV)."""
    monkeypatch.setenv("PID_FILE", str(tmp_path / "pid"))
    monkeypatch.setenv("OPTS_FILE", str(tmp_path / "ptxas_options"))
    (tmp_path / "race.py").write_text(RACE)
    (tmp_path / "forever.py").write_text(FOREVER)
    commands = {"guard": _protocol_child(tmp_path, "0"),
                "ConSan forward": [sys.executable, str(tmp_path / "race.py")],
                "ConSan backward": [sys.executable, str(tmp_path / "forever.py")]}  # fmt: skip
    limits = hopper_guard.Limits(120.0, 60.0, {BUILTIN: 60.0, GLUON: 60.0}, 60.0, 1.0)
    row = hopper_guard.run_guard(False, require_gluon=False, limits=limits, commands=commands)
    assert row["outcome"] == "race", row
    assert row["detail"].startswith("ConSan forward: c (Gluon fwd): flash_fwd_ws.py:301: ")
    assert "Buffer being accessed has outstanding writes" in row["detail"]
    race, unfinished = row["consan"]
    assert (race["role"], race["consan"]) == ("ConSan forward", "race")
    assert unfinished == {"role": "ConSan backward", "consan": "unfinished",
                          "detail": "not done 1 s after the guard child"}  # fmt: skip
    with pytest.raises(ProcessLookupError):  # killed, and reaped
        os.kill(int((tmp_path / "pid").read_text()), 0)
    assert (tmp_path / "ptxas_options").read_text() == "--opt-level 1"
    commands.pop("ConSan forward")
    row = hopper_guard.run_guard(False, require_gluon=False, limits=limits, commands=commands)
    assert (row["outcome"], row["consan"][0]["consan"]) == ("passed", "unfinished"), row
    assert row["detail"].endswith("; ConSan backward unfinished")


def test_consan_missing_from_triton_or_without_a_gpu_is_skipped_with_the_reason(monkeypatch):
    """No sanitizer pass in this Triton: no ConSan child, the reason recorded; no GPU (the dry
    run, test_gpu_suite_hopper's): the same; otherwise a child per Gluon kernel."""
    from triton._C import libtriton

    commands, blocker = hopper_guard.child_commands(False)
    assert blocker is None and commands == {
        "guard": hopper_guard.child_command(False),
        "ConSan forward": hopper_guard.consan_command("forward"),
        "ConSan backward": hopper_guard.consan_command("backward")}  # fmt: skip
    assert hopper_guard.consan_blocker("cpu") == "ConSan needs a CUDA GPU; this is cpu"
    monkeypatch.delattr(libtriton.passes.ttgpuir, "add_concurrency_sanitizer")
    why = f"triton {triton.__version__} has no ConSan (TRITON_INSTRUMENTATION_MODE=consan)"
    assert hopper_guard.consan_blocker("cuda") == why
    assert hopper_guard.child_commands(False) == ({"guard": hopper_guard.child_command(False)}, why)


@pytest.mark.parametrize("what", ["forward", "backward"])
def test_the_consan_child_runs_its_case_under_the_knob(what, monkeypatch, capsys):
    """A ConSan child's code path on CPU: its case announced, launched with the knob at
    "consan" (restored after), and, the route declining the Gluon kernel here, skipped saying
    so."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    _, case, overrides = next(p for p in hopper_checks.consan_plan(True) if p[0] == what)
    assert hopper_guard.child_main(["--consan", what, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(ln[len(hopper_guard.PREFIX) :]) for ln in lines
              if ln.startswith(hopper_guard.PREFIX)]  # fmt: skip
    name = f"ConSan {what}: {case.name}"
    assert events[:2] == [{"cases": [name]}, {"start": name, "phase": "ConSan"}]
    done = events[2]
    assert (done["done"], done["consan"], done["instrumentation_mode"]) == (name, "skipped",
                                                                           "consan")  # fmt: skip
    assert done["gluon"] == list(overrides)
    assert done["detail"].startswith(f"the route declined it: {what}: torch (route: ")
    assert triton.knobs.compilation.instrumentation_mode == ""
