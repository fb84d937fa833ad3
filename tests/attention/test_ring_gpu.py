"""Ring attention on CUDA (`pytest -m gpu`): bf16 and fp16 on the compiled kernels, one rank
in process, and NCCL rings over every GPU of the machine when it has two or more (NCCL does
not put two ranks on one GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ring_testing import Case, check_case, ring_groups
from spawn_testing import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = [
    Case(layout, causal, dtype, heads, local_len, batch=2, head_dim=head_dim)
    for layout in ("zigzag", "contiguous")
    for causal in (True, False)
    for dtype in (torch.bfloat16, torch.float16)
    for heads, local_len, head_dim in (((8, 2), 1000, 64), ((4, 4), 302, 128))
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.layout}-{c.causal}-{c.dtype}-{c.heads}")
def test_one_rank_on_cuda(case):
    assert not dist.is_initialized()
    check_case(case, None, 0, 1, device="cuda")


def nccl_worker(rank: int, world_size: int) -> None:
    for size, group in ring_groups(world_size):
        for case in CASES:
            check_case(case, group, dist.get_rank(group), size, device="cuda")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two or more GPUs")
def test_nccl_ring_over_every_gpu(tmp_path):
    run_ranks(nccl_worker, min(torch.cuda.device_count(), 8), tmp_path, backend="nccl")
