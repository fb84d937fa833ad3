"""<run_dir>/run.json: where and from what code a run ran (the report's one source for that).

    {"commit": "<sha>[-dirty]" | "unknown", "commits": [every start's commit, in order],
     "device": "NVIDIA H100 80GB HBM3" | "2 x NVIDIA H100 ..." | "<CPU model> (2 threads)",
     "world_size", "torch", "triton", "cuda" (None on CPU builds), "python", "started_at",
     "start_step" (0, or the step a resume started from),
     "job" (the cluster job that started it: "slurm:<id>" | "torchrun:<run id>" | None),
     "job_restart" (that job's restart count at this start), "job_command" (its command line:
     what a restart of the job must repeat to continue the run; flashtrain/train/job_run.py),
     "ckpt_dir" (the run's checkpoint folder, relative to the run folder when inside it: the
     run that owns the folder; flashtrain/train/run_folder.py)}

Written by rank 0 at every start (a resume keeps the earlier commits), to a temporary name
then renamed, so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path

import torch

from flashtrain.utils import git_commit

RUN_INFO_FILE = "run.json"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform's guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def device_name(device: torch.device, world_size: int) -> str:
    """The GPU's name (times the world size), or the CPU model and its intra-op threads."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        threads = torch.get_num_threads()
        name = f"{cpu_model()} ({threads} thread{'s' if threads != 1 else ''})"
    return f"{world_size} x {name}" if world_size > 1 else name


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def read_run_info(run_dir: str | os.PathLike) -> dict:
    """The run.json of a run folder ({} when there is none or it is unreadable)."""
    path = Path(run_dir) / RUN_INFO_FILE
    try:
        info = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def write_run_info(
    run_dir: str | os.PathLike,
    device: torch.device,
    world_size: int,
    start_step: int,
    *,
    job: str | None = None,
    job_restart: int = 0,
    job_command: list[str] | None = None,
    ckpt_dir: str | None = None,
) -> dict:
    """Record this start in <run_dir>/run.json; returns what was written. job: the key of the
    cluster job this start belongs to (a restart of it finds this folder by it); ckpt_dir: the
    run's checkpoint folder, as run_folder.ckpt_dir_record gives it."""
    commit = git_commit() or "unknown"
    earlier = read_run_info(run_dir).get("commits", [])
    info = {
        "commit": commit,
        "commits": [*earlier, commit] if earlier[-1:] != [commit] else earlier,
        "device": device_name(device, world_size),
        "world_size": world_size,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "start_step": start_step,
        "job": job,
        "job_restart": job_restart,
        "job_command": job_command,
        "ckpt_dir": ckpt_dir,
    }
    path = Path(run_dir) / RUN_INFO_FILE
    temporary = path.with_name(f".{RUN_INFO_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(info, indent=1) + "\n")
    os.replace(temporary, path)
    return info
