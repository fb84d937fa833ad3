"""Spawned gloo process groups on CPU for the context-parallel tests.

run_ranks starts world_size processes, joins them in a gloo group through a file store, and
runs worker(rank, world_size, *args) in each; a failure in any rank fails the test with that
rank's traceback and stops the others. The processes fork from a forkserver that has imported
torch and the kernels once (a fresh import per rank costs seconds on a small CPU); they inherit
TRITON_INTERPRET from tests/conftest.py.
"""

from __future__ import annotations

import datetime
import multiprocessing
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
]


def _entry(rank, worker, world_size, store_path, args):
    torch.set_num_threads(1)  # the machine's cores are shared by every rank
    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
        timeout=TIMEOUT,
    )  # fmt: skip
    try:
        worker(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(worker, world_size: int, tmp_path: Path, *args) -> None:
    """worker must be a module-level function (the children import it by name)."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # no effect once the server is running
    store = str(tmp_path / "gloo_store")
    mp.start_processes(
        _entry, args=(worker, world_size, store, args), nprocs=world_size, start_method="forkserver"
    )


def ring_groups(world_size: int = 4) -> list[tuple[int, object]]:
    """This rank's (P, process group) per phase, for 4 ranks: the world (P = 4, group=None);
    then [1, 2, 3] (P = 3) while [0] runs alone (P = 1); then [0, 2] and [1, 3] (P = 2).
    Group ranks differ from global ranks in all but the world. Every rank creates every group,
    in the same order, as new_group requires."""
    if world_size != 4:
        raise ValueError(f"ring_groups is laid out for 4 ranks, got {world_size}")
    rank = dist.get_rank()
    phases = [[[1, 2, 3], [0]], [[0, 2], [1, 3]]]
    mine: list[tuple[int, object]] = [(world_size, None)]
    for phase in phases:
        for members in phase:
            group = dist.new_group(members)
            if rank in members:
                mine.append((len(members), group))
    return mine
