"""ring_attn_func with a document table (cu_seqlens) on spawned gloo groups of P = 1, 2, 3, 4
ranks equals attention within documents on the full sequence: output, LSE and every gradient,
against a float64 reference with the document mask (at most 2x the error of the same math in
PyTorch in the same precision) and against flash_attn_varlen_func on the full sequence.

One spawn of 4 processes runs every case on the groups of ring_testing.ring_groups. Each case
draws a fresh document table (the same on every rank): random cuts, so documents cross chunk
and rank boundaries, plus a document of one token and an empty one; with two rows, the second
row is one document. The planner and the table checks are tested on the host, without a spawn.
"""

from __future__ import annotations

import os
import random
import zlib

import pytest
import torch
import torch.distributed as dist
from attention_testing import assert_matches_reference, forward_backward, reference_results
from ring_testing import Case, ring_groups
from spawn_testing import run_ranks

from flashtrain.attention import flash_attn_varlen_func, ring_attn_func
from flashtrain.attention.ring_documents import VarlenCall, plan_steps
from flashtrain.attention.ring_sharding import take_shard

# Every layout x causal on the PyTorch path, each with GQA (4, 2) and MHA (2, 2), one with 1 row
# and one with 2 (which way round alternates), and the interpreted kernels on both causal
# schedules in fp16 and fp32. Chunk lengths are odd: 7, 9 (torch), 3, 5 (interpreter).
CASES = [
    Case(layout, causal, torch.float32, heads, local_len, path="torch", batch=batch)
    for layout, local_len in (("zigzag", 14), ("contiguous", 9))
    for causal in (True, False)
    for heads, batch in zip(((4, 2), (2, 2)), (2, 1) if causal else (1, 2))
] + [
    Case("zigzag", True, torch.float16, (2, 1), 6),
    Case("contiguous", False, torch.float32, (1, 1), 5, batch=2),
]


def random_documents(batch: int, seq_len: int, seed: int) -> tuple[int, ...]:
    """A document table over batch rows of seq_len tokens: in each row but a second one, a few
    random cuts, a one-token document and an empty one; a second row is one whole document."""
    draw = random.Random(seed)
    table = [0]
    for row in range(batch):
        start = row * seq_len
        if row == 1:
            table.append(start + seq_len)
            continue
        single = draw.randrange(1, seq_len - 1)
        cuts = {single, single + 1, *draw.sample(range(1, seq_len), 3)}
        empty = draw.choice(sorted(cuts))
        table += sorted([start + cut for cut in cuts] + [start + empty, start + seq_len])
    return tuple(table)


def document_mask(table: tuple[int, ...], batch: int, seq_len: int) -> torch.Tensor:
    """Bool (B, 1, S, S): True where query and key lie in the same document."""
    lengths = torch.tensor(table[1:]) - torch.tensor(table[:-1])
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths).view(batch, seq_len)
    return (doc[:, :, None] == doc[:, None, :])[:, None]


def check_document_case(case: Case, group, rank: int, size: int) -> None:
    """Ring attention with documents on this rank's shard against the full sequence's float64
    reference and flash_attn_varlen_func on the full sequence."""
    seq_len = case.local_len * size
    seed = zlib.crc32(repr((case, size)).encode())  # the same on every rank of the group
    torch.manual_seed(seed)
    table = random_documents(case.batch, seq_len, seed)
    batch, (heads_q, heads_kv), dim = case.batch, case.heads, case.head_dim
    q = torch.randn(batch, seq_len, heads_q, dim, dtype=case.dtype)
    k, v = (torch.randn(batch, seq_len, heads_kv, dim, dtype=case.dtype) for _ in range(2))
    dout = torch.randn_like(q)
    mask = document_mask(table, batch, seq_len)
    truth, low = reference_results(q, k, v, dout, causal=case.causal, element_mask=mask)

    def local(x, dim=1):
        return take_shard(x, dim, rank, size, case.layout)

    # a CPU tensor for two rows, the tuple otherwise: both forms of the table
    given = torch.tensor(table) if batch == 2 else table

    def ring(a, b, c):
        return ring_attn_func(
            a, b, c, group=group, causal=case.causal, layout=case.layout, return_lse=True,
            cu_seqlens=given,
        )  # fmt: skip

    cu = torch.tensor(table, dtype=torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())

    def full(a, b, c):
        packed = (x.reshape(batch * seq_len, *x.shape[2:]) for x in (a, b, c))
        out, lse = flash_attn_varlen_func(
            *packed, cu, cu, longest, longest, causal=case.causal, return_lse=True
        )
        return out.view(a.shape), lse.view(heads_q, batch, seq_len).transpose(0, 1)

    got = forward_backward(ring, local(q), local(k), local(v), local(dout))
    unsplit = forward_backward(full, q, k, v, dout)
    shard = lambda results: [local(x, dim=2 if i == 1 else 1) for i, x in enumerate(results)]
    try:
        assert_matches_reference(got, shard(truth), shard(low), case.dtype)
        assert_matches_reference(got, shard(truth), shard(unsplit), case.dtype)
    except AssertionError as error:
        raise AssertionError(f"P={size} rank={rank} {case} {table}: {error}") from None


def documents_worker(rank: int, world_size: int, cases: list[Case]) -> None:
    for size, group in ring_groups(world_size):
        for case in cases:
            if case.path == "triton" and not (
                size == 2 and 0 in dist.get_process_group_ranks(group)
            ):
                continue  # the interpreter is slow: its cases run on one group of P = 2, [0, 2]
            os.environ["FLASHTRAIN_CPU_ATTENTION"] = case.path  # a child process: ours to set
            check_document_case(case, group, dist.get_rank(group), size)


@pytest.mark.single_route  # each case names its own CPU route
def test_ring_documents_match_full_sequence(tmp_path):
    run_ranks(documents_worker, 4, tmp_path, CASES)


@pytest.mark.single_route
def test_plan_pairs_each_document_and_skips_steps_without_one():
    """Contiguous, causal, P = 2, rank 1 (chunk [4, 8)) with rank 0's K/V (chunk [0, 4)): only
    the document [2, 6) spans both, so queries 4, 5 meet keys 2, 3; the rest are padding."""
    plan = plan_steps((0, 2, 6, 8), 1, 2, "contiguous", True, 4, 1)
    (diagonal,), (before,) = plan.steps
    assert diagonal == VarlenCall(True, (0, 2, 4), (0, 2, 4), 2, 2)  # [4, 6) and [6, 8) alone
    assert before == VarlenCall(False, (0, 0, 2, 4), (0, 2, 4, 4), 2, 2)
    # no document crosses the ranks' boundary: nothing to do with rank 0's K/V
    assert plan_steps((0, 4, 8), 1, 2, "contiguous", True, 4, 1).steps[1] == ()
    ((_, diagonal_k),), ((before_q, _),) = plan.device_tables(torch.device("cpu"))
    assert diagonal_k.tolist() == [0, 2, 4] and before_q.tolist() == [0, 0, 2, 4]
    assert plan_steps((0, 2, 6, 8), 1, 2, "contiguous", True, 4, 1) is plan  # planned once


def _qkv(batch=2, local_len=8):
    return [torch.randn(batch, local_len, 2, 16) for _ in range(3)]


@pytest.mark.single_route
@pytest.mark.parametrize(
    "table, match",
    [
        ((0, 5, 11, 16), "no boundary at 8, the start of row 1"),  # a document joins the rows
        ((0, 8, 15), "end at B \\* S_global = 2 \\* 8 = 16"),
        ((1, 8, 16), "start at 0"),
        ((0, 9, 8, 16), "non-decreasing"),
        ((0, 8.0, 16), "hold ints"),
        (torch.tensor([0, 8, 16], device="meta"), "tensor on meta.*tuple of ints or a CPU"),
        (torch.tensor([0.0, 8.0, 16.0]), "1-D integer tensor"),
        ("0,8,16", "tuple \\(or list\\) of ints"),
    ],
)
def test_bad_document_tables_are_refused(table, match):
    """P = 1 without torch.distributed: the table covers B = 2 rows of S_global = 8 tokens (a
    meta tensor stands in for a GPU one: refused for its device alone)."""
    with pytest.raises(ValueError, match=match):
        ring_attn_func(*_qkv(), causal=True, cu_seqlens=table)
