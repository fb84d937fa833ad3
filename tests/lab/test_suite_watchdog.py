"""The GPU suite's watchdog (flashtrain/lab/gpu_suite/record.py): a measurement or a compile pass
names itself on disk before it starts, and one past its limit ends the process with
HUNG_EXIT_CODE, named as hung in suite.json and summary.md, with every thread's stack on stderr.
A hung CUDA kernel cannot be interrupted, so the planted hangs here block on an Event that is
never set, in a subprocess (the watchdog ends it); the tests wait for its exit, never on time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashtrain.lab.bench import hopper_checks
from flashtrain.lab.gpu_suite.record import HUNG_EXIT_CODE, Record
from flashtrain.lab.gpu_suite.summary import derive, summary_markdown

REPO = Path(__file__).resolve().parents[2]
EXIT_WAIT_S = 300  # a safety net for a broken watchdog, never met when it works


def state(out: Path) -> dict:
    return json.loads((out / "suite.json").read_text())


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", FLASHTRAIN_CPU_ATTENTION="torch")
    return subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=REPO, text=True,
                          capture_output=True, timeout=EXIT_WAIT_S)  # fmt: skip


def test_the_running_measurement_is_named_on_disk_before_it_starts(tmp_path):
    """While a measurement or a compile pass runs, the section's status on disk names it (an
    outer kill leaves the name); between them it is "running"; a limited measurement that keeps
    its limit is ok, its limit on record."""
    record = Record(tmp_path, 60.0, summary_markdown, derive)
    record.state["runs"].append({"dry_run": True})
    sec = record.section("peaks")
    sec.plan(["first", "second"])
    seen = []

    def status():
        seen.append(state(tmp_path)["sections"]["peaks"]["status"])
        return {"matmul_peak_tflops": 1.0}

    sec.measure("first", status, limit_s=60.0)
    sec.compile({"a launch": status}, workers=1, limit_s=60.0)
    sec.measure("second", status)
    assert seen == ["running: first", "running: compile (1 first launches)", "running: second"]
    on_disk = state(tmp_path)["sections"]["peaks"]
    assert on_disk["status"] == "running" and on_disk["measured"] == {"first": "ok", "second": "ok"}
    assert (on_disk["limits_s"], on_disk["compile_limit_s"]) == ({"first": 60.0}, 60.0)


HANG = """
import sys, threading
from pathlib import Path
from flashtrain.lab.gpu_suite.record import Record
from flashtrain.lab.gpu_suite.summary import derive, summary_markdown
record = Record(Path(sys.argv[1]), 60.0, summary_markdown, derive)
record.state["runs"].append({"dry_run": True})
sec = record.section("peaks")
sec.plan(["quick", "stuck", "after"])
sec.measure("quick", lambda: {"matmul_peak_tflops": 1.0}, limit_s=1.0)
never = threading.Event()
if sys.argv[2] == "measure":
    sec.measure("stuck", never.wait, limit_s=2.0)
else:
    sec.compile({"fast": lambda: None, "stuck": never.wait}, workers=2, limit_s=2.0)
sec.measure("after", lambda: None)
print("not reached")
"""


@pytest.mark.parametrize("where", ["measure", "compile"])
def test_a_measurement_past_its_limit_ends_the_call_naming_it(tmp_path, where):
    """A measurement (or a compile launch) that blocks past its limit: the process ends with
    HUNG_EXIT_CODE, the stacks on stderr; suite.json and summary.md name the hang, keep what
    finished (a limited measurement before it: ok) and skip the rest."""
    done = _run(HANG, str(tmp_path), where)
    assert done.returncode == HUNG_EXIT_CODE, done.stdout + done.stderr
    assert "not reached" not in done.stdout
    assert "most recent call first" in done.stderr  # faulthandler's dump of every thread
    hung = "stuck" if where == "measure" else "compile: stuck"
    status = f"failed: hung: {hung} (past its limit of 2 s)"
    sec = state(tmp_path)["sections"]["peaks"]
    assert sec["status"] == status
    ended = f"skipped: the call ended ({hung} hung)"
    assert sec["measured"] == {"quick": "ok", "stuck": ended, "after": ended, hung: status}
    assert (
        f"| peaks | {status} | 1/{len(sec['planned'])} |" in (tmp_path / "summary.md").read_text()
    )
    assert not list(tmp_path.glob("*.tmp"))


HOPPER_HANG = """
import sys, threading
from flashtrain.lab.bench import hopper_checks, hopper_guard
from flashtrain.lab.gpu_suite import cli, hopper
hopper.DRY_LIMITS_S = dict(hopper.DRY_LIMITS_S, check=5.0)  # a check here: ~0.1 s
passed = {"outcome": "passed", "detail": "stubbed", "seconds": 0.0, "timeout_s": 1.0,
          "idle_s": 1.0, "cases": [], "stderr_tail": ""}
hopper_guard.run_guard = lambda *a, **k: passed  # the guard child is test_hopper_guard's
stuck = hopper_checks.checks(True)[1].name
real = hopper_checks.run
def run(check, *args, **kwargs):
    if check.name == stuck:
        threading.Event().wait()  # never set: the planted hang
    return real(check, *args, **kwargs)
hopper_checks.run = run
sys.exit(cli.main(["--dry-run", "--out", sys.argv[1], "--sections", "hopper"]))
"""


def test_a_hung_check_ends_the_hopper_section_naming_it(tmp_path):
    """The hopper section's second correctness check hangs (the guard passed): the watchdog ends
    the call within the check's limit, and suite.json and summary.md name the check; the
    compile phase and the first check finished."""
    done = _run(HOPPER_HANG, str(tmp_path))
    assert done.returncode == HUNG_EXIT_CODE, done.stdout + done.stderr
    checks = hopper_checks.checks(True)
    status = f"failed: hung: {checks[1].name} (past its limit of 5 s)"
    sec = state(tmp_path)["sections"]["hopper"]
    assert sec["status"] == status
    assert sec["measured"][checks[0].name] == "ok" and sec["compile_seconds"] >= 0
    assert sec["measured"][checks[1].name] == status
    assert sec["measured"][checks[2].name] == f"skipped: the call ended ({checks[1].name} hung)"
    assert f"| hopper | {status} |" in (tmp_path / "summary.md").read_text()
