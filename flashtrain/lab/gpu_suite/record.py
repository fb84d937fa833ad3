"""The suite's record on disk and its stop rules: OUT/suite.json and OUT/summary.md rewritten
atomically after every measurement, so a call killed at any second returns everything measured
until then; SIGINT/SIGTERM and the budget stop it at the next measurement boundary.

A section holds its planned measurements and, for each, "ok", "failed: why" or "skipped: why".
It is "done" only when every planned measurement finished ok; otherwise its status says what
failed or what stopped it ("incomplete: 3 of 8 measured (stopped by SIGINT)"). A section that
launches flashtrain's kernels compiles them first (Section.compile: every first launch at once),
so its measurements never wait on a cold compile.

While a measurement (or a compile pass) runs, its section's status is "running: <name>", on disk
before it starts: a call killed from outside (`timeout -k`) still names what it was doing. A
measurement given a limit (limit_s) has a watchdog: past the limit it is recorded as
"failed: hung: <name> (past its limit of N s)", the section's status says the same, the record is
saved, every thread's Python stack goes to stderr and the process ends with HUNG_EXIT_CODE. A
hung CUDA kernel cannot be interrupted, and nothing after it could run on the GPU anyway: ending
the call names the hang at once instead of stalling until the outer kill.

The watchdog is a Python thread, not faulthandler.dump_traceback_later alone: only Python can
write the record, and a thread waiting on a hung kernel sits in a call that released the GIL
(torch's synchronize and copies, Triton's launcher). faulthandler's timer (a C thread) is the
backstop, STACKS_GRACE_S later, for a hang that holds the GIL: it can only dump the stacks and
exit (code 1), and "running: <name>" is then what names the hang.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from flashtrain.lab.bench.measure import is_cuda_fault

STATE_FILE = "suite.json"
SUMMARY_FILE = "summary.md"
HUNG_EXIT_CODE = 3  # a watchdog ended the call (the CLI's own: 0, 1, 2 usage, 130, 143)
STACKS_GRACE_S = 30.0  # faulthandler's backstop after a limit, should the watchdog not get to run


class SectionFailed(Exception):
    """A whole section cannot run here (a wheel missing, no such feature); the message says why."""


def write_atomic(path: Path, text: str) -> None:
    """Readers (and a copy taken when the call is killed) never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Record:
    def __init__(self, out: Path, budget_s: float, render: Callable[[dict], str], derive=None):
        """render(state) -> summary.md's text; derive(state) updates computed fields first."""
        self.out = out
        self.render = render
        self.derive = derive
        path = out / STATE_FILE  # earlier calls' sections stay (a session splits the protocol)
        self.state = json.loads(path.read_text()) if path.is_file() else {}
        self.state.setdefault("runs", [])
        self.state.setdefault("sections", {})
        self.deadline = time.monotonic() + budget_s
        self.stop_reason: str | None = None
        self._signals = 0
        self._previous_handlers: dict = {}
        # held while the files are written, and by a watchdog from its verdict to the exit, so
        # neither sees the other's half-written state (reentrant: the watchdog saves under it)
        self.lock = threading.RLock()

    # ---- stopping ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """The first SIGINT/SIGTERM asks for a stop at the next measurement boundary; a second
        one interrupts at once (KeyboardInterrupt), and the record is still written."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def restore_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self._signals += 1
        name = signal.Signals(signum).name
        self.stop(f"stopped by {name}")
        print(f"[suite] {name}: stopping at the next measurement boundary", flush=True)
        if self._signals > 1:
            raise KeyboardInterrupt(name)

    def stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    # ---- writing -----------------------------------------------------------------------------

    def save(self) -> None:
        with self.lock:
            self.out.mkdir(parents=True, exist_ok=True)
            if self.derive:
                self.derive(self.state)
            text = json.dumps(self.state, indent=2, default=str) + "\n"
            write_atomic(self.out / STATE_FILE, text)
            write_atomic(self.out / SUMMARY_FILE, self.render(self.state))

    def section(self, name: str) -> Section:
        return Section(self, name)


class Section:
    """One section of this call: plan its measurements, run each through measure()."""

    def __init__(self, record: Record, name: str):
        self.record = record
        self.name = name
        self.started = time.monotonic()
        self.deadline = record.deadline
        self.data = record.state["sections"][name] = {
            "status": "running",
            "planned": [],
            "measured": {},
            "rows": [],
        }
        record.save()

    def plan(self, names: list[str]) -> None:
        self.data["planned"] = list(names)
        self.record.save()

    def why_not(self) -> str | None:
        """Why no further measurement may start now, or None."""
        if self.record.stop_reason:
            return self.record.stop_reason
        if time.monotonic() > self.deadline:
            return "budget"
        return None

    def measure(self, name: str, fn: Callable[[], list[dict] | dict | None],
                limit_s: float | None = None):  # fmt: skip
        """Run one planned measurement; its rows go to the section's rows. Returns its result,
        or None when it did not run or failed (the reason is on record). limit_s: past it, the
        watchdog records the hang and ends the process (module docstring)."""
        if name not in self.data["planned"]:
            self.data["planned"].append(name)
        reason = self.why_not()
        if reason:
            self.data["measured"][name] = f"skipped: {reason}"
            return None
        if limit_s is not None:
            self.data.setdefault("limits_s", {})[name] = limit_s
        self._running(name)
        start = time.monotonic()
        try:
            with self._watched(limit_s, lambda: (name, [])):
                result = fn()
        except SectionFailed:
            raise
        except Exception as err:  # noqa: BLE001  (one failure must not lose the rest)
            self._failed(name, err)
            result = None
        else:
            self.data["measured"][name] = "ok"
            rows = result if isinstance(result, list) else [result] if result else []
            self.data["rows"] += [dict(row, measurement=name) for row in rows]
        self.data.setdefault("measure_seconds", {})[name] = round(time.monotonic() - start, 2)
        self.data["status"] = "running"
        self.record.save()
        return result

    def _running(self, name: str) -> None:
        """On disk before `name` starts: an outer kill leaves it named."""
        self.data["status"] = f"running: {name}"
        self.record.save()

    def _watched(self, limit_s: float | None, names: Callable[[], tuple[str, list[str]]]):
        """A watchdog over the block (none without a limit); names() says, at the limit, what
        hung: (the measurement, others unfinished beside it)."""
        if limit_s is None:
            return contextlib.nullcontext()
        return _Watchdog(self, limit_s, names)

    def hung(self, name: str, others: list[str], limit_s: float) -> None:
        """The watchdog's verdict: `name` (and `others`, unfinished beside it: a compile pass's
        launches) past limit_s. Recorded as failed, in the section's status too, the rest of
        the section skipped (the process ends next), and saved."""
        more = f" and {len(others)} more unfinished" if others else ""
        what = f"hung: {name}{more} (past its limit of {limit_s:g} s)"
        for unfinished in (name, *others):
            self.data["measured"][unfinished] = f"failed: {what}"
            if unfinished not in self.data["planned"]:
                self.data["planned"].append(unfinished)
        for planned in self.data["planned"]:
            self.data["measured"].setdefault(planned, f"skipped: the call ended ({name} hung)")
        self.data["status"] = f"failed: {what}"
        self.data["seconds"] = round(time.monotonic() - self.started, 1)
        print(f"  {name}: HUNG past its limit of {limit_s:g} s: ending the call", flush=True)
        self.record.save()

    def _failed(self, name: str, err: BaseException) -> None:
        if name not in self.data["planned"]:
            self.data["planned"].append(name)
        self.data["measured"][name] = f"failed: {type(err).__name__}: {str(err)[:300]}"
        trace = "".join(traceback.format_exception(err))
        self.data.setdefault("tracebacks", {})[name] = trace[-3000:]
        print(f"  {name}: FAILED {type(err).__name__}: {str(err)[:200]}", flush=True)
        if is_cuda_fault(err):  # every later launch would fail alike: write what we have, stop
            self.record.stop(f"CUDA fault in {self.name} / {name}")

    def compile(self, launches: dict[str, Callable[[], object]], workers: int,
                limit_s: float | None = None) -> None:  # fmt: skip
        """Run every first launch of `launches` (what -> a call of the op at the shapes the
        section will time) on `workers` threads before any measurement, so Triton compiles the
        kernels side by side (its compiler releases the GIL) and no timed measurement waits on
        a cold compile. Its wall time adds to data["compile_seconds"] and to the section's
        budget; a launch that raises is a failed measurement "compile: <what>". limit_s: the
        whole pass's; past it, the watchdog names the launches still unfinished."""
        if not launches or self.why_not():
            return  # the measurements say why they were skipped
        if limit_s is not None:
            self.data["compile_limit_s"] = limit_s
        self._running(f"compile ({len(launches)} first launches)")
        start = time.monotonic()
        unfinished = dict.fromkeys(launches)  # in order; a launch leaves it as it finishes

        def names() -> tuple[str, list[str]]:
            left = [f"compile: {what}" for what in unfinished] or ["compile"]
            return left[0], left[1:]

        pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(launches))))
        try:
            with self._watched(limit_s, names):
                futures = {pool.submit(launch): what for what, launch in launches.items()}
                for future in as_completed(futures):
                    with self.record.lock:  # the watchdog reads it
                        unfinished.pop(futures[future])
                    if future.exception() is not None:
                        self._failed(f"compile: {futures[future]}", future.exception())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # a second signal must not wait
        seconds = time.monotonic() - start
        self.data["compile_seconds"] = round(self.data.get("compile_seconds", 0.0) + seconds, 2)
        print(f"  compile: {len(launches)} first launches in {seconds:.1f} s", flush=True)
        self.data["status"] = "running"
        self.record.save()

    def finish(self, failure: str | None = None) -> str:
        """Set the section's status from its measurements (or a whole-section failure)."""
        measured = self.data["measured"]
        planned = self.data["planned"]
        failed = [n for n in planned if str(measured.get(n, "")).startswith("failed")]
        unrun = [n for n in planned if n not in measured or measured[n].startswith("skipped")]
        if failure:
            status = f"failed: {failure}"
        elif failed:
            status = f"failed: {len(failed)} of {len(planned)} failed (first: {failed[0]}: "
            status += f"{measured[failed[0]][len('failed: ') :][:200]})"
        elif unrun:
            why = {measured.get(n, "skipped: not reached")[len("skipped: ") :] for n in unrun}
            status = f"incomplete: {len(planned) - len(unrun)} of {len(planned)} measured "
            status += f"({', '.join(sorted(why))})"
        else:
            status = "done"
        self.data["status"] = status
        self.data["seconds"] = round(time.monotonic() - self.started, 1)
        self.record.save()
        return status


class _Watchdog:
    """Ends the process when the block it watches runs past limit_s (the module docstring): a
    timer thread records the hang (Section.hung) and exits; faulthandler's timer is behind it."""

    def __init__(self, section: Section, limit_s: float,
                 names: Callable[[], tuple[str, list[str]]]):  # fmt: skip
        self.section, self.limit_s, self.names = section, limit_s, names
        self.finished = False
        self._timer = threading.Timer(limit_s, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        faulthandler.dump_traceback_later(self.limit_s + STACKS_GRACE_S, exit=True,
                                          file=sys.__stderr__)  # fmt: skip
        return self

    def __exit__(self, *exc) -> None:
        with self.section.record.lock:  # from here on the timer's verdict comes too late
            self.finished = True
        self._timer.cancel()
        faulthandler.cancel_dump_traceback_later()

    def _expire(self) -> None:
        with self.section.record.lock:  # held to the exit: the block cannot finish meanwhile
            if self.finished:
                return
            try:
                self.section.hung(*self.names(), limit_s=self.limit_s)
            except Exception as err:  # noqa: BLE001  (the call must end even so)
                print(f"[suite] the watchdog could not write the record: {err!r}", flush=True)
            faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
            os._exit(HUNG_EXIT_CODE)
