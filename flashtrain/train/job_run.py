"""A cluster job's run: which run folder a restarted or requeued job continues.

A job is what a scheduler or launcher starts again after a failure: torchrun's elastic agent
restarts every worker (`--max-restarts`) under one TORCHELASTIC_RUN_ID with
TORCHELASTIC_RESTART_COUNT counting up; Slurm requeues a job under the same SLURM_JOB_ID (one
task of an array: + SLURM_ARRAY_TASK_ID) with SLURM_RESTART_COUNT counting up. A job's identity
is its Slurm job when there is one (torchrun restarts inside it are the same job), else its
torchrun run id.

The rule (docs/cluster.md): rank 0 records its job and its command line (train.py's
overrides) in the run folder's run.json at every start; a process of the same job with the same
command line continues that run folder (the newest, if several), and resumes from the newest
intact checkpoint there. The command line tells apart two runs one job script starts one after
the other. torchrun's default run id, "none", names no job in particular: it continues a run
only in a restart (TORCHELASTIC_RESTART_COUNT > 0), never in a new launch. A first start
behaves as before.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flashtrain.checkpoint.run_info import RUN_INFO_FILE, read_run_info

log = logging.getLogger("flashtrain")

JOB_KEY = "job"  # run.json's record of the job that started the run
COMMAND_KEY = "job_command"  # and of the command line it ran (train.py's arguments)
UNNAMED_TORCHRUN_ID = "none"  # torchrun's --rdzv-id default: not one job's name


@dataclass(frozen=True)
class Job:
    """The job this process belongs to, and how many times it has been started again."""

    key: str  # "slurm:<job id>[_<array task id>]" | "torchrun:<run id>"
    restart: int  # 0 at the first start
    named: bool  # the key names this job only (false: torchrun's default run id "none")
    command: tuple[str, ...] = ()  # the program's arguments (train.py's overrides)

    @property
    def restarted(self) -> bool:
        return self.restart > 0

    def may_continue(self) -> bool:
        """Whether a run folder that records this job's key is this job's: always for a named
        job, only in a restart for torchrun's unnamed one."""
        return self.named or self.restarted

    def describe(self) -> str:
        start = f"restart {self.restart}" if self.restarted else "first start"
        return f"job {self.key} ({start})"


def _count(environ: Mapping[str, str], name: str) -> int:
    try:
        return max(0, int(environ.get(name, "0") or 0))
    except ValueError:
        return 0


def current_job(
    environ: Mapping[str, str] | None = None, argv: list[str] | None = None
) -> Job | None:
    """The job of this process from its environment (os.environ by default) and its command
    line (sys.argv[1:] by default); None outside Slurm and torchrun's elastic agent (a plain
    `python train.py`)."""
    env = os.environ if environ is None else environ
    command = tuple(sys.argv[1:] if argv is None else argv)
    restart = max(_count(env, "SLURM_RESTART_COUNT"), _count(env, "TORCHELASTIC_RESTART_COUNT"))
    slurm_job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
    if slurm_job:
        task = env.get("SLURM_ARRAY_TASK_ID")
        key = f"slurm:{slurm_job}" + (f"_{task}" if task and env.get("SLURM_ARRAY_JOB_ID") else "")
        return Job(key=key, restart=restart, named=True, command=command)
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id:
        named = run_id != UNNAMED_TORCHRUN_ID
        return Job(key=f"torchrun:{run_id}", restart=restart, named=named, command=command)
    return None


def _records(info: object, job: Job) -> bool:
    """Whether a run.json's content records `job`: its key and its command line."""
    if not isinstance(info, dict):
        return False
    return info.get(JOB_KEY) == job.key and tuple(info.get(COMMAND_KEY) or ()) == job.command


def find_job_run(root: str | os.PathLike, job: Job) -> Path | None:
    """The newest run folder under `root` (outputs/<date>/<time>: run.json two levels down)
    that records `job` (its key and command line), if this job may continue one; newest by the
    time its run.json was last written, the start that came last."""
    if not job.may_continue():
        return None
    found = []
    for info_file in Path(root).glob(f"*/*/{RUN_INFO_FILE}"):
        try:
            if _records(json.loads(info_file.read_text()), job):
                found.append((info_file.stat().st_mtime, info_file.parent))
        except (OSError, ValueError):  # unreadable, or not JSON
            continue
    return max(found)[1] if found else None


def job_run_dir(root: str, fresh: str) -> str:
    """OmegaConf resolver `${ft_job_run_dir:outputs,<date>/<time>}` (configs/train.yaml's
    hydra.run.dir): the run folder under `root` that this process's job recorded, when it is
    a restart of that job; `root/fresh` otherwise (a first start, or no job)."""
    job = current_job()
    earlier = find_job_run(root, job) if job is not None else None
    return str(earlier) if earlier is not None else str(Path(root) / fresh)


def continues_job_run(run_dir: str | os.PathLike, job: Job | None) -> bool:
    """Whether this start continues `run_dir` as its job's run: the folder records this job
    and command line, and the job may continue a run (a named job, or a restart of an unnamed
    one)."""
    return job is not None and job.may_continue() and _records(read_run_info(run_dir), job)
