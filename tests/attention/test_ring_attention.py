"""ring_attn_func on spawned gloo groups of P = 1, 2, 3, 4 ranks equals attention on the full
sequence: output, LSE and every gradient within the dense kernel tests' tolerance rule (against
a float64 reference, at most 2x the error of the same math in PyTorch in the same precision).

One spawn of 4 processes runs every case on the groups of ring_testing.ring_groups: the world
(P = 4), then [1, 2, 3] (P = 3) while rank 0 runs alone (P = 1), then [0, 2] and [1, 3] (P = 2).
The kernels run under TRITON_INTERPRET=1 (fp32, fp16) and on the PyTorch CPU path (fp32).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from attention_testing import random_qkv
from ring_testing import Case, check_case, ring_groups
from spawn_testing import run_ranks

from flashtrain.attention.reference import attention_reference
from flashtrain.attention.ring import _merge

# The default grid: every P sees both layouts, causal and not, on the PyTorch path, and the
# interpreted kernels on both causal schedules in fp16 and fp32 (non-causal steps are the same
# full-block call as a causal off-diagonal step). Lengths avoid multiples of 128.
FAST = [
    Case("zigzag", True, torch.float32, (2, 1), 10, batch=2),
    Case("contiguous", True, torch.float16, (4, 2), 7),
    *(
        Case(layout, causal, torch.float32, (4, 2), 38, path="torch", batch=2)
        for layout in ("zigzag", "contiguous")
        for causal in (True, False)
    ),
]

# Every combination, for a change to the ring's schedule (pytest -m slow).
FULL = [
    Case(layout, causal, dtype, heads, local_len, batch=2)
    for layout, local_len in (("zigzag", 10), ("contiguous", 9))
    for causal in (True, False)
    for dtype in (torch.float32, torch.float16)
    for heads in ((2, 2), (4, 2), (3, 1))
] + [
    Case(layout, causal, torch.float32, heads, 66, path="torch", batch=2)
    for layout in ("zigzag", "contiguous")
    for causal in (True, False)
    for heads in ((2, 2), (4, 1))
]


def attention_worker(rank: int, world_size: int, cases: list[Case]) -> None:
    for size, group in ring_groups(world_size):
        for case in cases:
            os.environ["FLASHTRAIN_CPU_ATTENTION"] = case.path  # a child process: ours to set
            check_case(case, group, dist.get_rank(group), size)


@pytest.mark.slow  # ~98 s on 2 busy cores: left out of the normal suite (10 minutes)
@pytest.mark.single_route  # each case names its own CPU route
def test_ring_attention_matches_full_sequence(tmp_path):
    run_ranks(attention_worker, 4, tmp_path, FAST)


@pytest.mark.slow
def test_ring_attention_full_grid(tmp_path):
    run_ranks(attention_worker, 4, tmp_path, FULL)


@pytest.mark.parametrize(
    "case",
    [
        Case("zigzag", True, torch.float32, (4, 2), 12),
        Case("contiguous", False, torch.float32, (4, 2), 12, path="torch"),
    ],
)
def test_one_process_without_torch_distributed(case, monkeypatch):
    """P = 1 with torch.distributed not initialized: the world is this process."""
    assert not dist.is_initialized()
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", case.path)
    check_case(case, None, 0, 1)


def test_merge_is_exact_and_keeps_rows_that_see_nothing():
    """Attention over keys A and B from attention over A and over B; rows that see no key in
    one part take the other's result, rows that see none in either stay 0 with lse -inf."""
    torch.manual_seed(0)
    q, k, v = random_qkv(2, 5, 9, 2, 2, 8, torch.float64)
    seen = torch.rand(2, 2, 5, 9) < 0.5
    seen[:, :, 0, :4] = False  # row 0 sees nothing in A
    seen[:, :, 1, 4:] = False  # row 1 sees nothing in B
    seen[:, :, 2] = False  # row 2 sees nothing at all
    whole = attention_reference(q, k, v, element_mask=seen)
    out = torch.zeros(2, 5, 2, 8, dtype=torch.float32)
    lse = torch.full((2, 2, 5), float("-inf"))
    for keys in (slice(0, 4), slice(4, 9)):
        part = attention_reference(q, k[:, keys], v[:, keys], element_mask=seen[..., keys])
        _merge(out, lse, part[0].float(), part[1].float())
    torch.testing.assert_close(out.double(), whole[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse.double(), whole[1], rtol=1e-6, atol=1e-6)
    assert torch.isneginf(lse[:, :, 2]).all() and (out[:, 2] == 0).all()
