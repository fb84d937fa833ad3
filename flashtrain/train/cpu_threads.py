"""How many intra-op threads a CPU run uses: chosen from the cores actually free for it and the
size of the model's matmuls, printed once in the run's summary, overridable.

Why more threads can be slower. torch's default is one OpenMP thread per core. A training step
on a CPU is hundreds of small ops, each split over those threads and ended by a barrier where the
threads wait for each other (spinning first, then sleeping). That pays only when:
- every thread has a core of its own. The loop's thread, the data prefetch thread
  (flashtrain/train/prefetch.py) and the OpenMP workers already make more threads than a 2-core
  machine has; when other processes keep the cores busy too, the OS deschedules a worker and
  every barrier waits a time slice for it while the others spin. On this project's shared
  2-core machine, under a load of 2-5 from other jobs: a 512 x 512 float32 matmul ran at 65
  GFLOP/s on 1 thread and 17 on 2, and the README's main job's step took 0.2-0.3 s on 1 thread
  and 1.9-3.4 s on 2 (17 minutes instead of 87 s for the whole run).
- each op is large enough that splitting it saves more than the barrier costs. The default run's
  matmuls (1,024 tokens x width 128) are too small (MIN_SPLIT_FLOPS).

So the rule: cores = this process's CPU affinity capped by its cgroup CPU quota, shared between
the ranks on this node (LOCAL_WORLD_SIZE); one thread when a micro-batch's width x width
projection is smaller than MIN_SPLIT_FLOPS; else a thread per core that was idle over a short
sample at the start (/proc/stat; load that comes later is not seen: trainer.cpu_threads then).
trainer.cpu_threads wins over everything, up to this rank's share of the cores (more is refused
at start); an OMP_NUM_THREADS in the environment over the rule (capped at that share).
torchrun sets OMP_NUM_THREADS=1 itself when it starts several processes on a node and the
variable is unset, and leaves no mark that tells its value from the user's: it is respected
like the user's (several ranks on a CPU share its cores anyway; trainer.cpu_threads overrides).

Inter-op threads are left alone: a CPU training step does not use them (autograd runs the
backward pass on the calling thread), and torch allows setting them only before first use.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from flashtrain.train.distributed import local_ranks
from flashtrain.typed_config import ConfigError

# Where Linux puts this process's CPU quota (a container's --cpus): cgroup v2's single file
# "quota period" ("max period" = no quota), or cgroup v1's two files (quota -1 = none).
CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
PROC_STAT = Path("/proc/stat")  # per-CPU busy and idle time: which cores others are using now
BUSY_SAMPLE_S = 0.1  # how long the cores' idle time is sampled (only when it can matter)

# FLOPs of one micro-batch's width x width projection (2 x tokens x d_model^2) from which a
# second thread pays off. Measured 2026-11-27 on the 2-core EPYC (scripts/bench_cpu_threads.py;
# docs/benchmarks.md): with both cores idle, 2 threads beat 1 at every size measured, from the
# default run at micro-batch 1 (4.2e6: 0.025 vs 0.030 s a step) and the README's main job (3.4e7:
# 0.123 vs 0.187 s) to width 384 at 512 tokens (1.2e9: 1.13 vs 2.08 s); with the cores busy with
# other work, 1 thread won at every size by 2-10x. So the size decides only below the smallest
# size measured (one thread there: a wrong single thread costs little, a wrong second one under
# load 10x), and the busy cores decide above it.
MIN_SPLIT_FLOPS = 4.0e6


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str  # one line for the run's summary: why this many

    def describe(self) -> str:
        return f"{self.threads} ({self.reason})"


def _cgroup_quota(v2: Path, v1_quota: Path, v1_period: Path) -> tuple[float, str] | None:
    """Cores the cgroup CPU quota allows, and the file it came from; None without a quota."""
    try:
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            if quota == "max":
                return None
            return int(quota) / int(period), str(v2)
        if v1_quota.exists() and v1_period.exists():
            quota = int(v1_quota.read_text().strip())
            if quota <= 0:  # -1: no quota
                return None
            return quota / int(v1_period.read_text().strip()), str(v1_quota)
    except (OSError, ValueError):  # unreadable or unexpected content: no quota known
        return None
    return None


def available_cores(
    affinity: int | None = None,
    cgroup_v2: Path = CGROUP_V2_CPU_MAX,
    cgroup_v1_quota: Path = CGROUP_V1_QUOTA,
    cgroup_v1_period: Path = CGROUP_V1_PERIOD,
) -> tuple[float | int, str]:
    """Cores this process may run on: its CPU affinity capped by its cgroup CPU quota, and a
    short text saying where the figure came from. affinity: the core count to assume (default:
    os.sched_getaffinity, or os.cpu_count where there is none)."""
    if affinity is None:
        if hasattr(os, "sched_getaffinity"):
            affinity = len(os.sched_getaffinity(0))
        else:  # macOS, Windows: no affinity call
            affinity = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_v2, cgroup_v1_quota, cgroup_v1_period)
    if quota is not None and quota[0] < affinity:
        return quota[0], f"cgroup CPU quota {quota[0]:g} ({quota[1]})"
    return affinity, f"{affinity} in this process's CPU affinity"


def read_cpu_times(path: Path = PROC_STAT) -> dict[int, tuple[int, int]]:
    """Per CPU: (idle ticks, all ticks) since boot, from /proc/stat (idle and iowait are idle;
    steal, the hypervisor running something else, is not). {} where there is no such file."""
    times = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return times


def busy_cores(
    cores: float,
    before: dict[int, tuple[int, int]],
    after: dict[int, tuple[int, int]],
    cpus: set[int] | None = None,
) -> float:
    """Of `cores`, how many other processes kept busy between two read_cpu_times() samples:
    `cores` less the idle time summed over `cpus` (default: those this process may run on; a
    2-core quota on a half-idle 64-core machine has all it needs), at least 0."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(after)
    idle = 0.0
    for cpu in cpus & set(before) & set(after):
        idle_ticks = after[cpu][0] - before[cpu][0]
        all_ticks = after[cpu][1] - before[cpu][1]
        idle += idle_ticks / all_ticks if all_ticks > 0 else 1.0
    return max(0.0, cores - idle)


def measure_busy_cores(cores: float, seconds: float = BUSY_SAMPLE_S) -> float:
    """busy_cores() over `seconds` from now, this process idle meanwhile; 0 without /proc/stat."""
    before = read_cpu_times()
    if not before:
        return 0.0
    time.sleep(seconds)
    return busy_cores(cores, before, read_cpu_times())


def projection_flops(micro_batch_size: int, seq_len: int, d_model: int) -> float:
    """FLOPs of one width x width projection over a micro-batch (2 x tokens x d_model^2): the
    size of the step's typical matmul, which decides whether splitting it over threads pays."""
    return 2.0 * micro_batch_size * seq_len * d_model**2


def choose_cpu_threads(
    cores: float,
    work_flops: float,
    *,
    busy: float | Callable[[], float] = 0.0,
    ranks: int = 1,
    configured: int | None = None,
    omp_num_threads: str | None = None,
    cores_from: str = "",
) -> ThreadChoice:
    """The intra-op thread count for a CPU run, at most this rank's share of the cores: more
    threads than cores wait for each other at every barrier (69 s a step instead of 0.1 s).

    cores: available_cores() (cores_from: where that figure came from); work_flops:
    projection_flops() of the run; busy: of the cores, how many other processes use
    (busy_cores()), or a function measuring it, called only when the answer depends on it;
    ranks: processes on this node sharing the cores; configured: trainer.cpu_threads (more than
    the share is a ConfigError); omp_num_threads: the environment's OMP_NUM_THREADS (None:
    unset; more than the share is capped)."""
    share = f"{cores:g} cores" + (f" shared by {ranks} ranks" if ranks > 1 else "")
    limit = _whole_cores(cores / ranks)
    if configured is not None:
        if configured > limit:
            where = f" ({cores_from})" if cores_from else ""
            raise ConfigError(
                f"trainer.cpu_threads={configured} is more than this process's share of the "
                f"cores: {share}{where}, at most {limit} thread(s); lower it, or leave it unset "
                f"to choose from the cores that are free"
            )
        return ThreadChoice(configured, "trainer.cpu_threads")
    if omp_num_threads is not None:
        first = omp_num_threads.split(",")[0].strip()  # OpenMP also takes "outer,inner" lists
        if first.isdigit() and int(first) > limit:
            return ThreadChoice(
                limit, f"OMP_NUM_THREADS={first} from the environment capped at the {share}"
            )
        if first.isdigit() and int(first) >= 1:
            return ThreadChoice(
                int(first),
                "OMP_NUM_THREADS from the environment (yours or torchrun's); "
                "trainer.cpu_threads overrides it",
            )
    if limit == 1:
        return ThreadChoice(1, f"1 core: {share}")
    if work_flops < MIN_SPLIT_FLOPS:
        return ThreadChoice(
            1,
            f"matmuls too small to split: {work_flops:.2g} FLOPs a projection < "
            f"{MIN_SPLIT_FLOPS:.2g}",
        )
    busy = busy() if callable(busy) else busy
    # A core counts as taken when others use over a quarter of it: a thread that shares its core
    # with other work stalls every barrier of the step (2-10x slower); one thread fewer costs at
    # most that core's share.
    taken = math.floor(busy + 0.75)
    free = _whole_cores((cores - taken) / ranks)
    if free == 1:
        return ThreadChoice(1, f"other work keeps {busy:.1f} of the {share} busy")
    if busy >= 0.05:
        share += f", {busy:.1f} of them busy with other work"
    return ThreadChoice(free, f"a thread per free core: {share}")


def _whole_cores(cores: float) -> int:
    """Threads for a share of cores: half a core rounds up (a quota of 1.5 runs 2 threads well),
    never fewer than 1."""
    return max(1, math.floor(cores + 0.5))


def auto_cpu_threads(work_flops: float, configured: int | None = None) -> ThreadChoice:
    """choose_cpu_threads on this machine: its cores, this node's ranks, the environment's
    OMP_NUM_THREADS and, where the answer depends on it, how busy the cores are now (a
    BUSY_SAMPLE_S sample)."""
    cores, cores_from = available_cores()
    return choose_cpu_threads(
        cores,
        work_flops,
        busy=lambda: measure_busy_cores(cores),
        ranks=local_ranks(),
        configured=configured,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        cores_from=cores_from,
    )


def apply_cpu_threads(choice: ThreadChoice) -> None:
    """Use choice.threads intra-op threads from now on (before anything measures speed)."""
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
