"""The hang and fault guard of the GPU suite's hopper section: the first launches of the Gluon
kernels for Hopper, the forward's then the backward's (hopper_checks.guard_plan, small shapes and
the shapes that first exercise what can hang: many work items a persistent program, query and
key tails that leave a whole 64-row half past the end), in a child process with limits. A kernel
that deadlocks (an mbarrier phase bug) cannot be interrupted from Python, and a CUDA fault kills
the process's context: in a child, either costs only the child, and the suite goes on with an
outcome that says what happened.

    python -m flashtrain.lab.bench.hopper_guard [--dry-run]     (the child; run_guard starts it)
    python -m flashtrain.lab.bench.hopper_guard --consan forward|backward     (a ConSan child)

The child first runs every case with the built-in kernels, side by side on a thread pool (the
forward's compiles, and the results the Gluon kernels' are compared with), then each case under
its Gluon config in turn. It prints one protocol line per event on stdout, `GUARD {json}`: the
case names ({"cases": [...]}), then for each case of each phase ("built-in", "Gluon")
{"start": name, "phase": ...} when it starts and {"done": name, "phase": ...} when it ends (a
Gluon case's with its hopper_checks.guard_row). Each case has its own limit (LIMITS.cases_s, by
phase): a case started and not done within it is a hang of that case, so a slow cold compile of
one case is never one of another, and the child that prints nothing for a while because its
cases compile is not hung. Outcomes:
    passed    every case ran and agreed with the built-in kernels (on the GPU: every one on the
              Gluon kernel it asks for)
    hung      a case past its limit (the detail names it and its phase), no line for idle_s
              while no case runs (imports, between cases), or no exit within timeout_s in all
              (the last resort): the child's process group is killed
    faulted   a CUDA error or a fatal signal (the stderr line that says so)
    failed    any other non-zero exit (the stderr line that says why)
    wrong     every case ran, and a Gluon result is NaN or off the built-in kernels' beyond the
              sweep's agreement gate (tile_sweep.AGREEMENT): the case, the tensor, the difference
    declined  every case ran, but the route gave one to the Triton kernels (GPU only); the
              detail names the case and the kernel (forward or backward)
    race      ConSan reported a concurrency error (below): the case and its message
    stopped   the suite was asked to stop (SIGINT / SIGTERM) while the child ran

ConSan, Triton's concurrency sanitizer for Gluon (TRITON_INSTRUMENTATION_MODE=consan: the
compiler instruments every shared-memory access and mbarrier operation, and a race between
partitions or a deadlock on mbarriers is a device-side assert quoting "Buffer being accessed has
outstanding writes" and the like), checks the smallest case once per Gluon kernel on a GPU, in
two more children started beside the guard child (hopper_checks.consan_plan): an instrumented
compile takes minutes (ptxas, at -O1 as CONSAN_ENV asks; measured for sm_90 on a loaded 2-core
CPU: 94 s for the forward, 311 s for the backward), so they compile while the guard runs, and
each may take the wait after it (consan_wait_s) and its own limit, never past timeout_s (in a
3.5-minute guard the backward's is likely cut: `--consan backward` alone is a call of its own).
Their rows (ConSan "clean", "race", "error", "skipped" or "unfinished": not done in time, no
failure) go into the guard's; only a race fails it. The mode is one of Triton's compile options
(CUDAOptions.instrumentation_mode), so it is part of every cache key, in memory and on disk:
the instrumented binaries never stand in for the others. (Triton 3.6 adds the sanitizer pass
when the knob is set at compile time, so a ConSan child compiles nothing else while it is set:
the backward's forward runs before it, uninstrumented.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import triton

from flashtrain.lab.bench import hopper_checks
from flashtrain.lab.checkout import REPO

BUILTIN, GLUON, CONSAN = "built-in", "Gluon", "ConSan"  # the phases of a case


@dataclass(frozen=True)
class Limits:
    """The guard's limits, in seconds: timeout_s in all (the last resort), idle_s without a line
    while no case runs, cases_s a case of each phase, consan_s a ConSan child from its start,
    consan_wait_s how long the ConSan children may run on once the guard child is done."""

    timeout_s: float
    idle_s: float
    cases_s: dict[str, float]
    consan_s: float
    consan_wait_s: float


# On an H200, cold (docs/gpu_session.md "Call H"): a built-in case compiles its Triton kernels
# (2-5 s each) on a pool of a thread a core whose front ends share the GIL, so it may wait most
# of the phase (30-45 s); a Gluon case compiles its Gluon kernel (measured: 4-6 s to a cubin for
# sm_90 on a CPU; 10-30 s allowed for) and traces one launch; each limit is about 3x that. The
# idle limit now covers only imports (10-20 s) and the moments between cases: 60 s (was 90, when
# it covered compiles too). The guard takes about 3.5 minutes in all (32 cases): the timeout,
# now a last resort behind the cases' limits, is 300 s (was 240, under 15% above that). ConSan:
# the forward's child needs about 2 minutes; the guard waits for neither more than 30 s.
LIMITS = Limits(timeout_s=300.0, idle_s=60.0, cases_s={BUILTIN: 150.0, GLUON: 90.0},
                consan_s=240.0, consan_wait_s=30.0)  # fmt: skip
# The dry run (CPU, toy sizes, a case well under a second): generous for a loaded machine
DRY_LIMITS = Limits(timeout_s=180.0, idle_s=90.0, cases_s={BUILTIN: 90.0, GLUON: 90.0},
                    consan_s=90.0, consan_wait_s=30.0)  # fmt: skip
PREFIX = "GUARD "
STDERR_TAIL = 2000  # characters of the child's stderr kept in the row
# Faults the tests plant, read in the dry run only: the Gluon launch of the case named in
# PLANT_HANG_ENV blocks for ever; PLANT_NAN_ENV, "<case>|<tensor>" (out, dq, dk or dv), makes
# that Gluon result NaN before it is compared with the built-in kernels'
PLANT_HANG_ENV = "FLASHTRAIN_GUARD_PLANT_HANG"
PLANT_NAN_ENV = "FLASHTRAIN_GUARD_PLANT_NAN"
CONSAN_MESSAGES = ("Buffer being accessed has outstanding", "Deadlock detected")  # Triton 3.6's
# How a ConSan report surfaces in Python: its assert, or the trap it ends the kernel with
CONSAN_ERRORS = ("device-side assert", "unspecified launch failure")
RACE_EXIT_CODE = 3  # a ConSan child whose launch ConSan stopped
# ptxas at -O1 for the instrumented kernels, as Triton after 3.6 does for ConSan by itself: its
# default level miscompiles some large ConSan kernels into invalid global accesses, and takes
# far longer. Triton reads it at import (CUDAOptions.ptx_options): a ConSan child's environment
CONSAN_ENV = {"PTXAS_OPTIONS": "--opt-level 1"}


def child_command(dry: bool) -> list[str]:
    return [sys.executable, "-m", "flashtrain.lab.bench.hopper_guard", *(["--dry-run"] * dry)]


def consan_command(what: str) -> list[str]:
    return [sys.executable, "-m", "flashtrain.lab.bench.hopper_guard", "--consan", what]


def _child_env(**more: str) -> dict[str, str]:
    """This checkout first on the path (the GPU machine runs an uninstalled copy of the tree)."""
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **more)


_EMIT_LOCK = threading.Lock()  # the built-in phase's threads print too: one whole line at a time


def _emit(**event) -> None:
    with _EMIT_LOCK:
        sys.stdout.write(PREFIX + json.dumps(event) + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------------- the children
def child_main(argv=None) -> int:
    """The guard child (every case, announced, so a hang names its case) or a ConSan child."""
    parser = argparse.ArgumentParser(description="the hopper section's guard child")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on CPU")
    parser.add_argument("--consan", choices=[w for w, _, _ in hopper_checks.consan_plan(True)],
                        help="run that Gluon kernel's ConSan case instead")  # fmt: skip
    args = parser.parse_args(argv)
    if args.consan:
        return consan_main(args.consan, args.dry_run)
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    plan = hopper_checks.guard_plan(dry)
    _emit(cases=[case.name for case, _ in plan])
    hang, nan = _planted(dry)

    def builtin(case):
        start = time.monotonic()
        _emit(start=case.name, phase=BUILTIN)
        results = hopper_checks.builtin_results(case, device)
        _emit(done=case.name, phase=BUILTIN, seconds=round(time.monotonic() - start, 2))
        return results

    workers = 1 if dry else os.cpu_count() or 8  # Triton's compiler releases the GIL
    with ThreadPoolExecutor(max_workers=workers) as pool:
        references = list(pool.map(builtin, [case for case, _ in plan]))
    for (case, overrides), reference in zip(plan, references):
        _emit(start=case.name, phase=GLUON)
        start = time.monotonic()
        if case.name == hang:
            threading.Event().wait()  # never set: the planted hang
        ours, routes, seen = hopper_checks.guard_launch(case, overrides, device)
        if device == "cuda":
            torch.cuda.synchronize()  # a fault of this case is reported as this case's
        if nan and nan[0] == case.name:
            ours = [torch.full_like(t, float("nan")) if name == nan[1] else t
                    for name, t in zip(hopper_checks.RESULTS, ours)]  # fmt: skip
        row = hopper_checks.guard_row(case, overrides, ours, routes, seen, reference)
        _emit(done=case.name, phase=GLUON, **row, seconds=round(time.monotonic() - start, 2))
    return 0


def _planted(dry: bool) -> tuple[str | None, tuple[str, str] | None]:
    """(the case whose Gluon launch hangs, (case, tensor) made NaN): PLANT_*_ENV, dry run only."""
    if not dry:
        return None, None
    nan = os.environ.get(PLANT_NAN_ENV)
    return os.environ.get(PLANT_HANG_ENV), tuple(nan.rsplit("|", 1)) if nan else None


def consan_blocker(device) -> str | None:
    """Why ConSan cannot check the Gluon kernels here, or None: this Triton has no knob
    (TRITON_INSTRUMENTATION_MODE) or no sanitizer pass, or there is no GPU."""
    from triton._C import libtriton

    knob = hasattr(getattr(triton, "knobs", None), "compilation") and hasattr(
        triton.knobs.compilation, "instrumentation_mode")  # fmt: skip
    sanitizer = hasattr(getattr(libtriton.passes, "ttgpuir", None), "add_concurrency_sanitizer")
    if not (knob and sanitizer):
        return f"triton {triton.__version__} has no ConSan (TRITON_INSTRUMENTATION_MODE=consan)"
    if torch.device(device).type != "cuda":
        return f"ConSan needs a CUDA GPU; this is {torch.device(device).type}"
    return None


def _profile_scratch(size: int, alignment: int, stream) -> torch.Tensor:  # noqa: ARG001
    return torch.empty(size, dtype=torch.int8, device="cuda")


@contextlib.contextmanager
def _instrumented(device):
    """ConSan in force for what compiles inside: the knob TRITON_INSTRUMENTATION_MODE=consan
    sets, restored after (off CUDA, the dry run's code path, nothing compiles for a GPU); gives
    the mode in force."""
    if torch.device(device).type == "cuda":
        from triton.runtime import _allocation

        # Triton after 3.6 keeps ConSan's state in the profile scratch, whose allocator is
        # process-wide (3.6 uses the global scratch, which every launcher provides)
        if hasattr(_allocation, "set_profile_allocator"):
            _allocation.set_profile_allocator(_profile_scratch)
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.instrumentation_mode = "consan"
        yield triton.knobs.compilation.instrumentation_mode


def consan_main(what: str, dry: bool) -> int:
    """One ConSan case (hopper_checks.consan_plan), announced; its row says "clean", "race"
    (ConSan's device-side assert or trap: exit RACE_EXIT_CODE), "error" or "skipped" (the route
    did not give it to the Gluon kernel)."""
    device = "cpu" if dry else "cuda"
    _, case, overrides = next(p for p in hopper_checks.consan_plan(dry) if p[0] == what)
    name = f"ConSan {what}: {case.name}"
    _emit(cases=[name])
    _emit(start=name, phase=CONSAN)
    start = time.monotonic()
    try:
        row = hopper_checks.consan_launch(what, case, overrides, device, _instrumented(device))
    except Exception as err:  # noqa: BLE001  (the row says what happened; the parent judges)
        traceback.print_exc()
        race = any(e in str(err) for e in CONSAN_ERRORS)
        _emit(done=name, phase=CONSAN, consan="race" if race else "error",
              detail=_key_line(f"{type(err).__name__}: {err}"),
              seconds=round(time.monotonic() - start, 2))  # fmt: skip
        return RACE_EXIT_CODE if race else 1
    declined = hopper_checks.declined(row)
    verdict = ("skipped", f"the route declined it: {declined}") if declined else (
        "clean", "no race, no deadlock")  # fmt: skip
    _emit(done=name, phase=CONSAN, **row, consan=verdict[0], detail=verdict[1],
          seconds=round(time.monotonic() - start, 2))  # fmt: skip
    return 0


# ---------------------------------------------------------------------------- the parent
class _Lines:
    """A pipe read into lines on a thread of its own, each with the time it came."""

    def __init__(self, stream):
        self.lines: list[tuple[float, str]] = []
        self.last = time.monotonic()
        self._taken = 0
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.last = time.monotonic()
            self.lines.append((self.last, line))

    def take(self) -> list[tuple[float, str]]:
        """The lines that came since the last take."""
        new = self.lines[self._taken : len(self.lines)]
        self._taken += len(new)
        return new

    def text(self) -> str:
        self._thread.join(timeout=10)  # EOF once the child's process group is gone
        return "".join(line for _, line in self.lines)


class _Child:
    """A child of the guard: its process (a session of its own), its protocol events as they
    come, and the cases it has started and not finished ((phase, case) -> when)."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.started = time.monotonic()
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=_child_env(**env), cwd=REPO,
                                     start_new_session=True)  # fmt: skip
        self.out, self.err = _Lines(self.proc.stdout), _Lines(self.proc.stderr)
        self.events: list[dict] = []
        self.running: dict[tuple[str, str], float] = {}
        self.cut: str | None = None  # why the parent killed it

    def poll(self) -> bool:
        """Take its new events; True while it runs."""
        for when, line in self.out.take():
            if not line.startswith(PREFIX):
                continue
            try:
                event = json.loads(line[len(PREFIX) :])
            except json.JSONDecodeError:
                continue
            self.events.append(event)
            if "start" in event:
                self.running[(event.get("phase", GLUON), event["start"])] = when
            elif "done" in event:
                self.running.pop((event.get("phase", GLUON), event["done"]), None)
        return self.proc.poll() is None

    def overdue(self, now: float, limits: Limits) -> str | None:
        """A case of it past its limit, or no line for idle_s while no case runs, or None."""
        for (phase, case), since in self.running.items():
            limit = limits.cases_s.get(phase, limits.timeout_s)
            if now - since > limit:
                return f"{phase} case {case} past its limit of {limit:g} s"
        if not self.running and now - self.out.last > limits.idle_s:
            return f"no line in {limits.idle_s:g} s while no case ran"
        return None

    def kill(self, why: str) -> None:
        """SIGKILL its process group (a hung kernel ignores everything else)."""
        self.cut = self.cut or why
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the driver: go on without it
            pass

    def done(self, phase: str) -> list[dict]:
        return [e for e in self.events if "done" in e and e.get("phase", GLUON) == phase]


def _key_line(stderr: str) -> str:
    """The line of a child's stderr that says what went wrong: the last exception line
    ("torch.AcceleratorError: CUDA error: ..."; CUDA's hints follow it), else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    raised = [ln for ln in lines if re.match(r"[\w.]+(Error|Exception|Interrupt)\b.*:", ln)]
    return (raised or lines or ["(no stderr)"])[-1][:300]


def child_commands(dry: bool) -> tuple[dict[str, list[str]], str | None]:
    """({"guard": command, "ConSan <what>": command, ...}, why no ConSan child or None)."""
    blocker = consan_blocker("cpu" if dry else "cuda")
    commands = {"guard": child_command(dry)}
    if blocker is None:
        commands |= {
            f"{CONSAN} {w}": consan_command(w) for w, _, _ in hopper_checks.consan_plan(dry)
        }
    return commands, blocker


def run_guard(dry: bool, *, require_gluon: bool, limits: Limits,
              should_stop: Callable[[], str | None] = lambda: None,
              commands: dict[str, list[str]] | None = None) -> dict:  # fmt: skip
    """Start the guard child and the ConSan children (commands: in place of child_commands(dry);
    "guard" and any "ConSan ..."), and wait for them within `limits`. A row with "outcome" (see
    the module docstring), "detail", the Gluon cases' rows, the built-in phase's, ConSan's and
    the guard child's stderr tail."""
    start = time.monotonic()
    blocker = None
    if commands is None:
        commands, blocker = child_commands(dry)
    guard = _Child(commands["guard"], {})
    sanitizers = {
        role: _Child(cmd, CONSAN_ENV) for role, cmd in commands.items() if role != "guard"
    }
    hung = stopped = None
    ended = None  # when the guard child exited
    while True:
        time.sleep(0.2)
        now, stopped, alive = time.monotonic(), should_stop(), guard.poll()
        if alive and now - start > limits.timeout_s:
            running = ", ".join(case for _, case in guard.running) or "none"
            hung = f"no answer in {limits.timeout_s:g} s (running: {running})"
        elif alive:
            hung = guard.overdue(now, limits)
        if stopped or hung:
            for child in (guard, *sanitizers.values()):
                child.kill(stopped or "the guard hung")
            break
        ended = ended or (None if alive else now)
        _watch_sanitizers(sanitizers, now, start, ended, guard.proc.returncode, limits)
        if ended and not any(child.proc.poll() is None for child in sanitizers.values()):
            break
    stderr, _ = guard.err.text(), guard.out.text()
    guard.poll()  # what came between the last poll and its exit
    planned = next((e["cases"] for e in guard.events if "cases" in e), [])
    consan = _consan_rows(sanitizers, blocker)
    outcome, detail = _outcome(guard.proc.returncode, stderr, planned, guard.done(BUILTIN),
                               guard.done(GLUON), hung, stopped, require_gluon, consan)  # fmt: skip
    return {"outcome": outcome, "detail": detail, "seconds": round(time.monotonic() - start, 1),
            "timeout_s": limits.timeout_s, "idle_s": limits.idle_s, "cases_s": limits.cases_s,
            "exit_code": guard.proc.returncode, "cases": guard.done(GLUON),
            "builtin_cases": guard.done(BUILTIN), "planned_cases": planned, "consan": consan,
            "stderr_tail": stderr[-STDERR_TAIL:]}  # fmt: skip


def _watch_sanitizers(sanitizers: dict[str, _Child], now: float, start: float,
                      ended: float | None, code: int | None, limits: Limits) -> None:  # fmt: skip
    """Kill a ConSan child once the guard child failed (exit `code`), past its own limit, past
    the wait after the guard child ended, or past the guard's timeout_s."""
    for child in sanitizers.values():
        if not child.poll():
            continue
        if ended and code:
            child.kill(f"the guard child failed (exit {code})")
        elif now - child.started > limits.consan_s:
            child.kill(f"not done within its limit of {limits.consan_s:g} s")
        elif ended and now - ended > limits.consan_wait_s:
            child.kill(f"not done {limits.consan_wait_s:g} s after the guard child")
        elif now - start > limits.timeout_s:
            child.kill(f"not done within the guard's {limits.timeout_s:g} s")


def _consan_rows(sanitizers: dict[str, _Child], blocker: str | None) -> list[dict]:
    """ConSan's verdict per child: its done row ("race" wherever ConSan's message is in its
    output), "unfinished" where the guard cut it (no failure: an instrumented compile takes
    minutes), "error" where it exited without one; or one "skipped" row saying why none ran."""
    if not sanitizers:
        return [{"consan": "skipped", "detail": blocker or "not asked for"}]
    rows = []
    for role, child in sanitizers.items():
        text = child.out.text() + child.err.text()
        child.poll()
        done = child.done(CONSAN)
        if done:
            row = dict(done[-1], role=role)
            said = [ln.strip() for ln in text.splitlines()
                    if any(m in ln for m in CONSAN_MESSAGES)]  # fmt: skip
            if said:  # ConSan's own words (the device's assert message): a race, whatever came
                row.update(consan="race", detail=f"{said[0][:300]} ({row.get('detail')})")
        elif child.cut:
            row = {"role": role, "consan": "unfinished", "detail": child.cut}
        else:
            why = f"exit {child.proc.returncode}: {_key_line(child.err.text())}"
            row = {"role": role, "consan": "error", "detail": why}
        rows.append(row)
    return rows


def _outcome(code, stderr, planned, builtin, done, hung, stopped, require_gluon,
             consan: list[dict]) -> tuple[str, str]:  # fmt: skip
    """(outcome, detail) of a guard (the module docstring): the guard child's exit code and
    stderr, its planned cases, the built-in and Gluon phases' done events, why it was judged hung
    or stopped (or None), and the ConSan rows."""
    total = len(planned) or "?"
    progress = f"{len(builtin)} of {total} built-in and {len(done)} of {total} Gluon cases done"
    if stopped:
        return "stopped", f"{stopped} ({progress})"
    if hung:
        return "hung", f"{hung} ({progress})"
    if code is None:  # killed and still not gone (hung == stopped == None cannot reach here)
        return "hung", f"the child did not exit ({progress})"
    if code != 0:
        fatal = code < 0 or "CUDA error" in stderr or "AcceleratorError" in stderr
        what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        return ("faulted" if fatal else "failed"), f"{what}: {_key_line(stderr)} ({progress})"
    wrong = [f"{r['case']}: {r['wrong']}" for r in done if r.get("wrong")]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        return "wrong", f"{wrong[0]}{more}"
    declined = [f"{r['case']}: {why}" for r in done if (why := hopper_checks.declined(r))]
    if require_gluon and declined:
        return "declined", declined[0]
    if len(done) < len(planned) or not planned:
        return "failed", f"the child exited 0 with {progress}"
    races = [f"{r['done']}: {r['detail']}" for r in consan if r["consan"] == "race"]
    if races:
        return "race", races[0]
    verdicts = ", ".join(f"{r.get('role', CONSAN)} {r['consan']}" for r in consan)
    return "passed", f"{progress}; {verdicts}"


if __name__ == "__main__":
    sys.exit(child_main())
