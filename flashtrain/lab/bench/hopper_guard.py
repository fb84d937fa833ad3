"""The hang and fault guard of the GPU suite's hopper section: the first launches of the Gluon
kernels for Hopper, the forward's then the backward's (hopper_checks.guard_plan, small shapes),
in a child process with a timeout. A kernel that deadlocks (an mbarrier phase bug) cannot be
interrupted from Python, and a CUDA fault kills the process's context: in a child, either costs
only the child, and the suite goes on with an outcome that says what happened.

    python -m flashtrain.lab.bench.hopper_guard [--dry-run]     (the child; run_guard starts it)

The child first runs every case with the built-in kernels, side by side on a thread pool (the
forward's compiles, and the results the Gluon kernels' are compared with), then each case under
its Gluon config in turn. It prints one protocol line per event on stdout, `GUARD {json}`: the
case names, then {"start": name} before a case's Gluon launch and its hopper_checks.guard_result
row after it. Outcomes:
    passed    every case ran (on the GPU: every one on the Gluon kernel it asks for)
    hung      no line from the child for IDLE_S, or no exit within TIMEOUT_S (its process
              group is killed); the detail names the case that started last
    faulted   a CUDA error or a fatal signal (the stderr line that says so)
    failed    any other non-zero exit (the stderr line that says why)
    declined  every case ran, but the route gave one to the Triton kernels (GPU only); the
              detail names the case and the kernel (forward or backward)
    stopped   the suite was asked to stop (SIGINT / SIGTERM) while the child ran
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from flashtrain.lab.bench import hopper_checks
from flashtrain.lab.checkout import REPO

TIMEOUT_S = 240.0  # in all: imports, compiles on a cold Triton cache, every launch (25 cases)
IDLE_S = 90.0  # without a line from the child: a case's compile and launch take seconds
DRY_RUN_TIMEOUT_S, DRY_RUN_IDLE_S = 90.0, 60.0  # CPU: imports and toy launches
PREFIX = "GUARD "
STDERR_TAIL = 2000  # characters of the child's stderr kept in the row


def child_command(dry: bool) -> list[str]:
    return [sys.executable, "-m", "flashtrain.lab.bench.hopper_guard", *(["--dry-run"] * dry)]


def _child_env() -> dict[str, str]:
    """This checkout first on the path (the GPU machine runs an uninstalled copy of the tree)."""
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")


def _emit(**event) -> None:
    print(PREFIX + json.dumps(event), flush=True)


def child_main(argv=None) -> int:
    """Each guard case in turn, announced before it starts (so a hang names its case)."""
    parser = argparse.ArgumentParser(description="the hopper section's guard child")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on CPU")
    dry = parser.parse_args(argv).dry_run
    device = "cpu" if dry else "cuda"
    plan = hopper_checks.guard_plan(dry)
    _emit(cases=[case.name for case, _ in plan])
    workers = 1 if dry else os.cpu_count() or 8  # Triton's compiler releases the GIL
    with ThreadPoolExecutor(max_workers=workers) as pool:
        builtin = list(pool.map(lambda p: hopper_checks.builtin_results(p[0], device), plan))
    for (case, overrides), reference in zip(plan, builtin):
        _emit(start=case.name)
        start = time.monotonic()
        row = hopper_checks.guard_result(case, overrides, device, reference)
        if device == "cuda":
            torch.cuda.synchronize()  # a fault of this case is reported as this case's
        _emit(**row, seconds=round(time.monotonic() - start, 2))
    return 0


class _Lines:
    """A pipe read into lines on a thread of its own, with the time of the last line."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.last = time.monotonic()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)
            self.last = time.monotonic()

    def text(self) -> str:
        self._thread.join(timeout=10)  # EOF once the child's process group is gone
        return "".join(self.lines)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (a hung kernel ignores everything else)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # stuck in the driver: go on without it
        pass


def _key_line(stderr: str) -> str:
    """The line of a child's stderr that says what went wrong: the last exception line
    ("torch.AcceleratorError: CUDA error: ..."; CUDA's hints follow it), else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    raised = [ln for ln in lines if re.match(r"[\w.]+(Error|Exception|Interrupt)\b.*:", ln)]
    return (raised or lines or ["(no stderr)"])[-1][:300]


def _events(stdout: str) -> list[dict]:
    return [json.loads(ln[len(PREFIX) :]) for ln in stdout.splitlines() if ln.startswith(PREFIX)]


def run_guard(dry: bool, *, require_gluon: bool, timeout_s: float, idle_s: float | None = None,
              should_stop: Callable[[], str | None] = lambda: None,
              command=None) -> dict:  # fmt: skip
    """Start the guard child (command: in place of child_command(dry)) and wait for it: at most
    idle_s (default: timeout_s) without a line from it, timeout_s in all. A row with "outcome"
    (see the module docstring), "detail", the cases' rows and the child's stderr tail."""
    idle_s = idle_s or timeout_s
    start = time.monotonic()
    proc = subprocess.Popen(command or child_command(dry), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_child_env(), cwd=REPO,
                            start_new_session=True)  # fmt: skip
    out, err = _Lines(proc.stdout), _Lines(proc.stderr)
    hung = stopped = None
    while proc.poll() is None:
        time.sleep(0.2)
        now, stopped = time.monotonic(), should_stop()
        if now - start > timeout_s:
            hung = f"no answer in {timeout_s:.0f} s"
        elif now - out.last > idle_s:
            hung = f"no progress in {idle_s:.0f} s"
        if stopped or hung:
            _kill(proc)
            break
    stdout, stderr = out.text(), err.text()
    events = _events(stdout)
    planned = next((e["cases"] for e in events if "cases" in e), [])
    started = [e["start"] for e in events if "start" in e]
    done = [e for e in events if "kernel" in e]
    outcome, detail = _outcome(proc.returncode, stderr, planned, started, done, hung, stopped,
                               require_gluon)  # fmt: skip
    return {"outcome": outcome, "detail": detail, "seconds": round(time.monotonic() - start, 1),
            "timeout_s": timeout_s, "idle_s": idle_s, "exit_code": proc.returncode,
            "cases": done, "planned_cases": planned, "stderr_tail": stderr[-STDERR_TAIL:]}  # fmt: skip


def _outcome(code, stderr, planned, started, done, hung, stopped,
             require_gluon) -> tuple[str, str]:  # fmt: skip
    progress = f"{len(done)} of {len(planned) or '?'} cases done"
    if stopped:
        return "stopped", f"{stopped} ({progress})"
    if hung:
        last = started[-1] if started else "none (imports or the first compiles)"
        return "hung", f"{hung} (last started: {last}; {progress})"
    if code is None:  # killed and still not gone (hung == stopped == None cannot reach here)
        return "hung", f"the child did not exit ({progress})"
    if code != 0:
        fatal = code < 0 or "CUDA error" in stderr or "AcceleratorError" in stderr
        what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        return ("faulted" if fatal else "failed"), f"{what}: {_key_line(stderr)} ({progress})"
    declined = [f"{r['case']}: {why}" for r in done if (why := hopper_checks.declined(r))]
    if require_gluon and declined:
        return "declined", declined[0]
    if len(done) < len(planned) or not planned:
        return "failed", f"the child exited 0 with {progress}"
    return "passed", progress


if __name__ == "__main__":
    sys.exit(child_main())
