"""Throughput, model FLOPs utilisation (MFU) and memory metrics.

MFU = (training FLOPs per token, from model.estimate_flops_per_token) x (tokens per second per
device) / (the device's peak FLOP/s). The peak comes from `trainer.peak_flops` when set, else from
the table below (dense tensor-core numbers from the vendors' data sheets, no sparsity), else, on a
CPU, from an estimate: threads x clock x FLOPs per cycle of the widest FMA units in /proc/cpuinfo.

The names (flashtrain/train/metric_names.py) are the same on the console, in metrics.jsonl, wandb
and TensorBoard: `perf/tokens_per_s` (all ranks), `perf/tokens_per_s_per_device`,
`perf/step_time_s`, `perf/mfu` (percent), `memory/max_reserved_gib` and `memory/max_allocated_gib`
(CUDA; `memory/max_rss_gib` on CPU).
"""

from __future__ import annotations

import os
import re
import resource
import sys
import time
from dataclasses import dataclass

import torch

from flashtrain.train.metric_names import (
    MAX_ALLOCATED_GIB,
    MAX_RESERVED_GIB,
    MAX_RSS_GIB,
    MFU,
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_DEVICE,
)

# (substring of torch.cuda.get_device_name(), peak bf16/fp16 FLOP/s, peak TF32 FLOP/s).
# First match wins, so more specific names come first.
GPU_PEAK_FLOPS: list[tuple[str, float, float]] = [
    ("GB200", 2.5e15, 1.25e15),
    ("B200", 2.25e15, 1.1e15),
    ("GH200", 989.4e12, 494.7e12),
    ("H200", 989.4e12, 494.7e12),
    ("H100 NVL", 835.5e12, 417.5e12),
    ("H100 PCIe", 756.0e12, 378.0e12),
    ("H100", 989.4e12, 494.7e12),  # SXM
    ("H800", 989.4e12, 494.7e12),
    ("A100", 312.0e12, 156.0e12),
    ("A800", 312.0e12, 156.0e12),
    ("L40S", 362.05e12, 183.0e12),
    ("L4", 121.0e12, 60.0e12),
    ("A6000", 154.8e12, 77.4e12),
    ("A10", 125.0e12, 62.5e12),
    ("RTX 4090", 165.2e12, 82.6e12),
    ("RTX 3090", 71.0e12, 35.6e12),
    ("V100", 125.0e12, 15.7e12),  # fp16 tensor cores; no TF32
    ("T4", 65.0e12, 8.1e12),
    ("MI300X", 1307.4e12, 653.7e12),
    ("MI250X", 383.0e12, 95.7e12),
]


@dataclass(frozen=True)
class PeakFlops:
    flops: float | None  # FLOP/s, None when unknown
    source: str  # "configured", "table: H100", "estimated: ...", "unknown"


def lookup_gpu_peak(device_name: str, precision: str) -> float | None:
    for pattern, half, tf32 in GPU_PEAK_FLOPS:
        if pattern.lower() in device_name.lower():
            return half if precision in ("bf16", "fp16") else tf32
    return None


def cpu_flops_per_cycle(flags: set[str]) -> int:
    """fp32 FLOPs per cycle per core: 2 FMA units x lanes x 2 (multiply and add)."""
    if "avx512f" in flags:
        return 64
    if "avx2" in flags and "fma" in flags:
        return 32
    if "avx" in flags:
        return 16
    return 8


def _cpuinfo() -> tuple[set[str], float | None]:
    flags: set[str] = set()
    mhz: float | None = None
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            mhz = int(f.read().strip()) / 1000.0
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return flags, mhz
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    if m:
        flags = set(m.group(1).split())
    if mhz is None:
        m = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
        if m:
            mhz = float(m.group(1))
        else:
            m = re.search(r"^bogomips\s*:\s*([\d.]+)", text, re.M | re.I)
            if m:
                mhz = float(m.group(1)) / 2
    return flags, mhz


def estimate_cpu_peak_flops(threads: int | None = None) -> PeakFlops:
    flags, mhz = _cpuinfo()
    if mhz is None:
        return PeakFlops(None, "unknown")
    threads = threads or torch.get_num_threads()
    per_cycle = cpu_flops_per_cycle(flags)
    peak = threads * mhz * 1e6 * per_cycle
    return PeakFlops(peak, f"estimated: {threads} threads x {mhz / 1000:.2f} GHz x {per_cycle}")


def device_peak_flops(
    device: torch.device,
    precision: str,
    configured: float | None = None,
    measured: float | None = None,
) -> PeakFlops:
    """The peak FLOP/s used for MFU on `device` at `precision` (fp32 | bf16 | fp16).

    measured: a CPU's measured matmul FLOP/s; used when the cpuinfo estimate is lower (virtual
    machines report base clocks, and turbo clocks are higher), so MFU never exceeds 100%.
    """
    if configured:
        return PeakFlops(float(configured), "configured")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = lookup_gpu_peak(name, precision)
        if peak is None:
            return PeakFlops(None, f"unknown GPU {name!r}; set trainer.peak_flops")
        return PeakFlops(peak, f"table: {name}")
    if device.type == "cpu":
        est = estimate_cpu_peak_flops()
        if measured and (est.flops is None or measured > est.flops):
            return PeakFlops(measured, "measured: fp32 matmul")
        return est
    return PeakFlops(None, "unknown")


def measure_matmul_flops(
    device: torch.device, size: int = 512, repeats: int = 2, trials: int = 8
) -> float:
    """FLOP/s this device reaches on a float32 matmul (best of several short trials): a
    sustained-speed yardstick for the CPU time estimate, not the theoretical peak. Many short
    trials rather than a few long ones: on a machine shared with other work the best of them is
    the speed between interruptions, so the estimate varies less from run to run."""
    # its own generator: measuring must not move the run's seeded stream (initial weights)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=gen)
    b = torch.randn(size, size, device=device, generator=gen)
    a @ b  # warm up
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 * repeats / max(best, 1e-9)


def mfu_percent(flops_per_token: float, tokens_per_s_per_device: float, peak: float | None):
    if not peak or not flops_per_token:
        return None
    return 100.0 * flops_per_token * tokens_per_s_per_device / peak


def memory_metrics(device: torch.device) -> dict[str, float]:
    gib = 1024**3
    if device.type == "cuda":
        return {
            MAX_RESERVED_GIB: torch.cuda.max_memory_reserved(device) / gib,
            MAX_ALLOCATED_GIB: torch.cuda.max_memory_allocated(device) / gib,
        }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    return {MAX_RSS_GIB: rss * scale / gib}


def peak_memory_gib(metrics: dict[str, float]) -> float | None:
    for key in (MAX_RESERVED_GIB, MAX_RSS_GIB):
        if key in metrics:
            return metrics[key]
    return None


class Throughput:
    """Accumulates step times and tokens between log intervals, and a smoothed step time for the
    ETA (see eta_seconds)."""

    # The ETA's memory, in steps: an interval's weight halves after this many later steps. Long
    # enough that one slow interval (another job on the machine, a checkpoint) barely moves the
    # ETA (10 steps 10x slower: ~1.6x, not 10x), short enough to follow a lasting change of
    # speed within a few hundred steps.
    ETA_HALF_LIFE_STEPS = 100

    def __init__(self, flops_per_token: float, peak: PeakFlops, world_size: int):
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.world_size = world_size
        self._time = 0.0
        self._tokens = 0
        self._steps = 0
        self._warmup: tuple[float, int] | None = None  # (seconds, steps) of the first interval
        self._eta_time = 0.0  # decayed sums over the intervals after the first
        self._eta_steps = 0.0

    def add(self, step_time: float, tokens: int) -> None:
        self._time += step_time
        self._tokens += tokens
        self._steps += 1

    def flush(self) -> dict[str, float]:
        """Metrics for the steps since the last flush (global tokens/s, per-device MFU)."""
        if self._steps == 0:
            return {}
        step_time = self._time / self._steps
        tps = self._tokens / max(self._time, 1e-9)
        per_device = tps / self.world_size
        out = {TOKENS_PER_S: tps, TOKENS_PER_S_PER_DEVICE: per_device, STEP_TIME_S: step_time}
        mfu = mfu_percent(self.flops_per_token, per_device, self.peak.flops)
        if mfu is not None:
            out[MFU] = mfu
        self._add_to_eta(self._time, self._steps)
        self._time, self._tokens, self._steps = 0.0, 0, 0
        return out

    def _add_to_eta(self, seconds: float, steps: int) -> None:
        # The first interval holds the first steps (compile, allocator and cache warm-up, often
        # many times slower than the rest): it stands in only until a second interval arrives.
        if self._warmup is None:
            self._warmup = (seconds, steps)
            return
        keep = 0.5 ** (steps / self.ETA_HALF_LIFE_STEPS)
        self._eta_time = keep * self._eta_time + seconds
        self._eta_steps = keep * self._eta_steps + steps

    def smoothed_step_time(self) -> float | None:
        """Seconds per step: an exponentially weighted mean over the steps since the first
        interval, each step weighted alike. While the run is young (steps << half-life) this is
        the plain mean over every step so far; later the recent ~100 steps dominate."""
        if self._eta_steps > 0:
            return self._eta_time / self._eta_steps
        if self._warmup is not None:
            seconds, steps = self._warmup
            return seconds / steps
        return None

    def eta_seconds(self, remaining_steps: int) -> float | None:
        step_time = self.smoothed_step_time()
        if step_time is None:
            return None
        return step_time * max(0, remaining_steps)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    if h >= 24:
        d, h = divmod(h, 24)
        return f"{d}d{h:02d}h{m:02d}m"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def build_peak_line(device: torch.device, estimate) -> str:
    """This rank's measured peaks so far (the GPU's allocated bytes, the process's resident
    set), beside the build estimate (memory_estimate.BuildMemory) they are checked against."""
    import resource

    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    measured = f"host peak RSS {host / 2**30:.2f} GiB"
    if device.type == "cuda":
        measured = (
            f"GPU peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB, " + measured
        )
    return (
        f"{measured} (estimate for a GPU run: {estimate.device / 2**30:.2f} GiB GPU, "
        f"{estimate.host / 2**30:.2f} GiB host beyond the process's own; {estimate.how})"
    )
