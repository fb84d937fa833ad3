"""Spawned process groups for the context-parallel tests (gloo on CPU, NCCL on GPUs), and the
check of one ring attention case against the full sequence's float64 reference and flash_attn_func.

run_ranks starts world_size processes, joins them in a gloo group through a file store, and
runs worker(rank, world_size, *args) in each; a failure in any rank fails the test with that
rank's traceback and stops the others. The processes fork from a forkserver that has imported
torch and the kernels once (a fresh import per rank costs seconds on a small CPU); they inherit
TRITON_INTERPRET from tests/conftest.py.
"""

from __future__ import annotations

import datetime
import multiprocessing
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)

from flashtrain.attention import flash_attn_func, ring_attn_func
from flashtrain.attention.ring_sharding import take_shard

TIMEOUT = datetime.timedelta(seconds=180)
PRELOAD = [
    "torch",
    "flashtrain.attention",
    "flashtrain.kernels.flash_fwd",
    "flashtrain.kernels.flash_bwd",
]


def _entry(rank, worker, world_size, store_path, backend, args):
    torch.set_num_threads(1)  # the machine's cores are shared by every rank
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


def ring_groups(world_size: int) -> list[tuple[int, object]]:
    """This rank's (P, process group) per phase. For 4 ranks: the world (P = 4, group=None);
    then [1, 2, 3] (P = 3) while [0] runs alone (P = 1); then [0, 2] and [1, 3] (P = 2).
    Group ranks differ from global ranks in all but the world. Every rank creates every group,
    in the same order, as new_group requires. Other world sizes: the world only."""
    if world_size != 4:
        return [(world_size, None)]
    rank = dist.get_rank()
    phases = [[[1, 2, 3], [0]], [[0, 2], [1, 3]]]
    mine: list[tuple[int, object]] = [(world_size, None)]
    for phase in phases:
        for members in phase:
            group = dist.new_group(members)
            if rank in members:
                mine.append((len(members), group))
    return mine


@dataclass(frozen=True)
class Case:
    layout: str
    causal: bool
    dtype: torch.dtype
    heads: tuple[int, int]  # (Hq, Hkv)
    local_len: int  # tokens per rank (even for zigzag)
    path: str = "triton"  # FLASHTRAIN_CPU_ATTENTION: the interpreted kernels or the torch path
    batch: int = 1
    head_dim: int = 16


def check_case(case: Case, group, rank: int, size: int, device: str = "cpu") -> None:
    """Run ring attention on this rank's shard (on CPU, case.path's implementation, which the
    caller selects) and check it against the full sequence's reference."""
    seq_len = case.local_len * size
    torch.manual_seed(zlib.crc32(repr((case, size)).encode()))  # the same on every rank
    shape = (case.batch, seq_len, seq_len, *case.heads, case.head_dim)
    q, k, v = random_qkv(*shape, case.dtype, device=device)
    dout = torch.randn_like(q)
    truth, low = reference_results(q, k, v, dout, causal=case.causal)

    def local(x, dim=1):
        return take_shard(x, dim, rank, size, case.layout)

    def ring(a, b, c):
        return ring_attn_func(
            a, b, c, group=group, causal=case.causal, layout=case.layout, return_lse=True
        )

    def full(a, b, c):
        return flash_attn_func(a, b, c, causal=case.causal, return_lse=True)

    got = forward_backward(ring, local(q), local(k), local(v), local(dout))
    unsplit = forward_backward(full, q, k, v, dout)  # flash_attn_func on the whole sequence
    shard = lambda results: [local(x, dim=2 if i == 1 else 1) for i, x in enumerate(results)]
    try:
        assert_matches_reference(got, shard(truth), shard(low), case.dtype)
        # as close to the float64 truth as flash_attn_func on the full sequence (2x its error)
        assert_matches_reference(got, shard(truth), shard(unsplit), case.dtype)
    except AssertionError as error:
        raise AssertionError(f"P={size} rank={rank} {case}: {error}") from None
