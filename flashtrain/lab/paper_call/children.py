"""The call's child processes: each command printed, its output into the call's log, a deadline.

A child runs in a session of its own (a Ctrl-C or `timeout -s INT` reaches the call, which
stops its children itself). At its deadline it gets SIGTERM (a train run then writes a
checkpoint at its step boundary and exits 143), then, after a grace period, SIGKILL for its
whole process group. A background child (the Pathfinder images) runs beside the others and is
stopped the same way when the call no longer needs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from flashtrain.lab.reproduce import shown


class CallLog:
    """Lines to the console and to <out>/call.log (flushed each line: a killed call keeps it)."""

    def __init__(self, path: Path, echo=print):
        self.path = path
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._echo = echo
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        """A line of the call's own: console and log."""
        with self._lock:
            self._echo(text)
            self._file.write(text + "\n")
            self._file.flush()

    def child_line(self, tag: str, line: str) -> None:
        """A child's output line: the log only (the console gets the call's own lines)."""
        with self._lock:
            self._file.write(f"[{tag}] {line.rstrip()}\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


@dataclass
class ChildResult:
    command: str
    exit_code: int | None  # None: still running (a background child not waited for)
    seconds: float
    stopped: str | None = None  # why the call stopped it: "deadline", "call stopped"

    def ok(self) -> bool:
        return self.exit_code == 0


class Child:
    """A started child process whose output goes to the log, tagged."""

    def __init__(self, argv: Sequence[str], tag: str, log: CallLog, env: dict[str, str],
                 cwd: Path):  # fmt: skip
        self.command = shown(argv)
        self.tag = tag
        self.log = log
        log.say(f"$ {self.command}")
        self.started = time.monotonic()
        self.stopped: str | None = None
        self.proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            for part in line.split("\r"):  # progress bars redraw with \r: one log line each
                if part.strip():
                    self.log.child_line(self.tag, part)

    def wait(self, timeout_s: float | None, grace_s: float, why: str = "deadline") -> ChildResult:
        """Wait up to timeout_s (None: no limit); then stop it (SIGTERM, SIGKILL after grace_s)."""
        try:
            self.proc.wait(timeout=None if timeout_s is None else max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.stop(grace_s, why)
        self._reader.join(timeout=5)
        return self.result()

    def stop(self, grace_s: float, why: str) -> None:
        if self.proc.poll() is not None:
            return
        self.stopped = why
        self.log.say(f"stopping {self.tag} ({why}): SIGTERM, SIGKILL after {grace_s:.0f} s")
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # the child's workers too
        except ProcessLookupError:
            pass

    def result(self) -> ChildResult:
        return ChildResult(
            self.command, self.proc.poll(), time.monotonic() - self.started, self.stopped
        )
