"""Where the profiled training steps' time goes: milliseconds per step in a fixed set of buckets
(step_buckets.BUCKETS: matmul, attention, loss, elementwise, optimizer, communication, memcpy,
data, idle) that add up to the measured time by construction.

The input is a recorded torch.profiler trace in the Chrome trace format
(`prof.export_chrome_trace(path)`): "X" events with ts/dur in µs, on host threads (cpu_op,
user_annotation, and the cuda_runtime/cuda_driver launch calls) and on GPU streams (kernel,
gpu_memcpy, gpu_memset). The measured steps are the host ranges named `step_range`
(ProfilerStep#N, the ranges torch.profiler's schedule writes; profile_step.py uses
flashtrain::step).

GPU trace: every kernel/copy launched inside a measured step counts once. A launch is matched to
its kernel by args.correlation; the host ops around the launch (same thread, by time) are its
ancestry. A sweep over the GPU timeline shares each instant equally among the kernels running
then (two streams, NCCL beside compute), so overlap is never counted twice; the window runs from
the first such kernel's start to the last one's end, and idle is the window's time with no
kernel. CPU trace (no kernels): the step thread's dispatcher ops (aten::..., custom ops) count
their self time (their duration minus their children's), the whole flashtrain::data range is
data (the host waiting for the prefetcher), and idle is the steps' wall time minus all that
(Python, the dispatcher, autograd bookkeeping).
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from flashtrain.lab.bench.step_buckets import BUCKETS, MEMCPY_CATEGORIES, bucket_of

PROFILER_STEP = "ProfilerStep#"  # torch.profiler's schedule: one range per prof.step()
TOP_KERNELS = 5  # the heaviest kernels (ops) listed per bucket
TOLERANCE = 0.02  # buckets + idle must equal the window within this fraction
HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # cudaLaunchKernel, Triton's cuLaunchKernelEx
DEVICE_CATEGORIES = ("kernel", *MEMCPY_CATEGORIES)
STEP_RANGE_CATEGORIES = ("user_annotation", "cpu_op")  # host ranges, not their GPU-side copies
DATA_RANGE = "flashtrain::data"
# Host ops that do work of their own (a dispatcher op "namespace::name": aten::mm,
# flashtrain::attention_forward); autograd wrappers and Python ranges only hold others.
DISPATCHER_OP = re.compile(r"^(?!autograd::|torch::)\w+::\w+$")
EDGE_US = 1e-3  # the trace's ns rounding: a child may end this far past its parent


@dataclass(eq=False, slots=True)
class _Event:
    name: str
    category: str
    start: float  # µs
    end: float  # µs
    thread: tuple  # (pid, tid)
    correlation: int | None
    parent: _Event | None = None

    @property
    def dur(self) -> float:
        return self.end - self.start

    def ancestors(self) -> list[str]:
        """The enclosing ops' and ranges' names, innermost first."""
        names, event = [], self.parent
        while event is not None:
            names.append(event.name)
            event = event.parent
        return names


def load_trace(trace_or_path) -> dict:
    """A Chrome trace: the dict itself, or read from a .json / .json.gz file."""
    if isinstance(trace_or_path, dict):
        return trace_or_path
    path = Path(trace_or_path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _events(trace: dict) -> tuple[list[_Event], list[_Event]]:
    """(host events, device events) of the trace's complete ("X") events."""
    host, device = [], []
    for raw in trace.get("traceEvents", []):
        category = raw.get("cat")
        if raw.get("ph") != "X" or category not in HOST_CATEGORIES + DEVICE_CATEGORIES:
            continue
        start = float(raw["ts"])
        event = _Event(
            name=raw.get("name", ""),
            category=category,
            start=start,
            end=start + float(raw.get("dur", 0.0)),
            thread=(raw.get("pid"), raw.get("tid")),
            correlation=(raw.get("args") or {}).get("correlation"),
        )
        (device if category in DEVICE_CATEGORIES else host).append(event)
    return host, device


def _link_parents(host: list[_Event]) -> None:
    """Each host event's parent: the innermost event of its thread that contains it in time."""
    by_thread: dict[tuple, list[_Event]] = defaultdict(list)
    for event in host:
        by_thread[event.thread].append(event)
    for events in by_thread.values():
        events.sort(key=lambda e: (e.start, -e.dur))
        open_ranges: list[_Event] = []
        for event in events:
            while open_ranges and open_ranges[-1].end + EDGE_US < event.end:
                open_ranges.pop()
            event.parent = open_ranges[-1] if open_ranges else None
            open_ranges.append(event)


class _Steps:
    """The measured step ranges; whether an instant lies inside one."""

    def __init__(self, host: list[_Event], step_range: str):
        self.ranges = sorted(
            (
                e
                for e in host
                if e.category in STEP_RANGE_CATEGORIES and e.name.startswith(step_range)
            ),
            key=lambda e: e.start,
        )
        if not self.ranges:
            seen = sorted({e.name for e in host if e.category == "user_annotation"})[:10]
            raise ValueError(
                f"no '{step_range}' range in the trace, so no measured step: profile with a "
                "torch.profiler.schedule and call prof.step() after each step (ProfilerStep#N), "
                f"or pass the step range's name (ranges seen: {seen or 'none'})"
            )
        self._starts = [e.start for e in self.ranges]

    def __len__(self) -> int:
        return len(self.ranges)

    def contains(self, t: float) -> bool:
        i = bisect.bisect_right(self._starts, t) - 1
        return i >= 0 and t <= self.ranges[i].end

    def mean_ms(self) -> float:
        return sum(e.dur for e in self.ranges) / len(self.ranges) / 1e3


class _Tally:
    """Busy µs per bucket and per (bucket, name), with launch counts."""

    def __init__(self):
        self.us: dict[str, float] = defaultdict(float)
        self.by_name: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])

    def add(self, bucket: str, name: str, us: float, launches: int = 0) -> None:
        self.us[bucket] += us
        entry = self.by_name[(bucket, name)]
        entry[0] += us
        entry[1] += launches


def _gpu_tally(host: list[_Event], device: list[_Event], steps: _Steps):
    """(tally, window µs, idle µs) of the kernels launched inside the steps."""
    launches = {e.correlation: e for e in host if e.category in LAUNCH_CATEGORIES}
    measured: list[tuple[_Event, str]] = []
    for kernel in device:
        launch = launches.get(kernel.correlation) if kernel.correlation is not None else None
        # a kernel whose launch was not recorded: placed by its own start
        if not steps.contains(launch.start if launch else kernel.start):
            continue
        ancestors = [launch.name, *launch.ancestors()] if launch else []
        measured.append((kernel, bucket_of(kernel.name, ancestors, kernel.category)))
    if not measured:
        raise ValueError("no kernel was launched inside the measured steps")
    tally = _Tally()
    for kernel, bucket in measured:
        tally.add(bucket, kernel.name, 0.0, launches=1)
    # The sweep: starts before ends at one instant, so a zero-length kernel opens and closes.
    points = sorted(
        [(k.start, 0, i) for i, (k, _) in enumerate(measured)]
        + [(k.end, 1, i) for i, (k, _) in enumerate(measured)]
    )
    running: set[int] = set()
    idle_us, last = 0.0, points[0][0]
    for t, is_end, i in points:
        if t > last:
            if running:  # the instant's time shared equally by the kernels running in it
                share = (t - last) / len(running)
                for j in running:
                    kernel, bucket = measured[j]
                    tally.add(bucket, kernel.name, share)
            else:
                idle_us += t - last
            last = t
        (running.discard if is_end else running.add)(i)
    window_us = points[-1][0] - points[0][0]
    return tally, window_us, idle_us


def _cpu_tally(host: list[_Event], steps: _Steps):
    """(tally, window µs, idle µs) of the step thread's ops: self time, the data range whole."""
    thread = steps.ranges[0].thread
    children_us: dict[int, float] = defaultdict(float)
    for event in host:
        if event.parent is not None:
            children_us[id(event.parent)] += event.dur
    tally = _Tally()
    for event in host:
        if event.thread != thread or not steps.contains(event.start):
            continue
        ancestors = event.ancestors()
        if any(name == DATA_RANGE for name in ancestors):
            continue  # inside the data range: counted with it
        if event.name == DATA_RANGE:
            tally.add("data", event.name, event.dur, launches=1)
        elif event.category == "cpu_op" and DISPATCHER_OP.match(event.name):
            self_us = max(event.dur - children_us[id(event)], 0.0)
            tally.add(bucket_of(event.name, ancestors, event.category), event.name, self_us, 1)
    window_us = sum(e.dur for e in steps.ranges)
    idle_us = max(window_us - sum(tally.us.values()), 0.0)
    return tally, window_us, idle_us


def _top(tally: _Tally, bucket: str, n_steps: int, top: int) -> list[dict]:
    entries = [(name, us, count) for (b, name), (us, count) in tally.by_name.items() if b == bucket]
    entries.sort(key=lambda e: (-e[1], e[0]))
    return [
        {
            "name": name,
            "ms_per_step": round(us / n_steps / 1e3, 4),
            "launches_per_step": round(count / n_steps, 2),
        }
        for name, us, count in entries[:top]
    ]


def split_trace(trace_or_path, step_range: str = PROFILER_STEP, top: int = TOP_KERNELS) -> dict:
    """The split of a recorded trace (a Chrome-trace dict or a .json/.json.gz path).

    Returns a JSON-ready dict:
      device       "cuda" (the GPU timeline was swept) or "cpu" (host ops' self time)
      step_range   the range name (prefix) that marks a measured step
      steps        how many measured steps
      step_ms      the mean measured step range's duration on the host (the profiled step's own
                   time, with the profiler's overhead in it)
      window_ms    per step: the GPU window (first to last kernel of the steps) / steps; on CPU
                   the steps' wall time / steps (= step_ms)
      ms_per_step  {bucket: ms} for every bucket in BUCKETS order, idle included; they add up
                   to window_ms
      share        {bucket: fraction of window_ms}
      top          {bucket: [{"name", "ms_per_step", "launches_per_step"}, ...]} the heaviest
                   kernels (CPU: ops; launches = calls) of each busy bucket, at most `top`
    Raises ValueError when the trace has no step range or no kernel in one, and when the
    buckets and idle miss the window by more than 2%."""
    host, device = _events(load_trace(trace_or_path))
    _link_parents(host)
    steps = _Steps(host, step_range)
    on_gpu = bool(device)
    tally, window_us, idle_us = (
        _gpu_tally(host, device, steps) if on_gpu else _cpu_tally(host, steps)
    )
    n = len(steps)
    accounted_us = sum(tally.us.values()) + idle_us
    if abs(accounted_us - window_us) > TOLERANCE * window_us:
        raise ValueError(
            f"the buckets and idle ({accounted_us:.1f} µs) miss the window ({window_us:.1f} µs) "
            f"by more than {TOLERANCE:.0%}: time counted twice or lost"
        )
    ms_per_step = {b: tally.us.get(b, 0.0) / n / 1e3 for b in BUCKETS if b != "idle"}
    ms_per_step["idle"] = idle_us / n / 1e3
    window_ms = window_us / n / 1e3
    return {
        "device": "cuda" if on_gpu else "cpu",
        "step_range": step_range,
        "steps": n,
        "step_ms": round(steps.mean_ms(), 4),
        "window_ms": round(window_ms, 4),
        "ms_per_step": {b: round(ms, 4) for b, ms in ms_per_step.items()},
        "share": {
            b: round(ms / window_ms, 4) if window_ms else 0.0 for b, ms in ms_per_step.items()
        },
        "top": {
            b: _top(tally, b, n, top)
            for b in BUCKETS
            if b != "idle" and any(key[0] == b for key in tally.by_name)
        },
    }


def profile_split(prof, step_range: str = PROFILER_STEP, top: int = TOP_KERNELS) -> dict:
    """split_trace of a torch.profiler.profile whose trace is ready (after its active steps, in
    on_trace_ready or once the `with` block is left): exported to a temporary file and read."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return split_trace(path, step_range=step_range, top=top)
