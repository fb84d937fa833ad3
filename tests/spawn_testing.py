"""Spawned process groups for the distributed tests (gloo on CPU, NCCL on GPUs).

run_ranks starts world_size processes, joins them in a gloo group through a file store, and
runs worker(rank, world_size, *args) in each; a failure in any rank fails the test with that
rank's traceback and stops the others. The processes fork from a forkserver that has imported
torch, the kernels and the models once (a fresh import per rank costs seconds on a small CPU);
they inherit TRITON_INTERPRET from tests/conftest.py, and install the interpreter's shortcuts
(tests/interpreter_speed.py) as it does.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = datetime.timedelta(seconds=180)
PRELOAD = [
    "torch",
    "flashtrain.attention",
    "flashtrain.kernels.flash_fwd",
    "flashtrain.kernels.flash_bwd",
    "flashtrain.models",
]


def _entry(rank, worker, world_size, store_path, backend, args):
    torch.set_num_threads(1)  # the machine's cores are shared by every rank
    if os.environ.get("TRITON_INTERPRET") == "1":  # the forkserver never ran tests/conftest.py
        import interpreter_speed

        interpreter_speed.install()
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
        timeout=TIMEOUT,
    )  # fmt: skip
    try:
        worker(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(worker, world_size: int, tmp_path: Path, *args, backend: str = "gloo") -> None:
    """worker must be a module-level function (the children import it by name).
    backend="nccl": rank r runs on cuda:r."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # no effect once the server is running
    store = str(tmp_path / "store")
    mp.start_processes(
        _entry,
        args=(worker, world_size, store, backend, args),
        nprocs=world_size,
        start_method="forkserver",
    )
