"""ulysses_attn_func equals attention on the full batch: pure Ulysses on U = 4 and U = 2 ranks,
and hybrid (Ulysses groups of U = 2 inside a ring of R = 2) on 4; causal or not, GQA with K/V
heads split or repeated, batch 1 and 2, with and without a document table (cu_seqlens). Output,
LSE and every gradient within the kernel tests' tolerance rule, against a float64 reference (with
the documents as an element mask) and against flash_attn_func / flash_attn_varlen_func on the
whole batch, sharded with take_cp_shard.

One spawn of 4 gloo ranks runs every case; the groups: the world (U = 4), Ulysses pairs {0, 1}
and {2, 3}, ring pairs {0, 2} and {1, 3} (rank p = r * U + u). Mostly the PyTorch CPU path in
fp32; two tiny cases run the kernels under the interpreter in fp16. Errors need no processes.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)
from spawn_testing import run_ranks

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.ring_sharding import take_cp_shard
from flashtrain.attention.ulysses import ulysses_attn_func, ulysses_kv_repeats

pytestmark = pytest.mark.single_route  # each case names its own CPU route


@dataclass(frozen=True)
class CpCase:
    mode: str  # "ulysses4" (U = 4), "ulysses2" (U = 2), "hybrid" (R = 2 x U = 2), "alone"
    heads: tuple[int, int]  # (Hq, Hkv)
    causal: bool
    local_len: int  # tokens per rank
    batch: int = 1
    documents: bool = False
    layout: str = "zigzag"
    dtype: torch.dtype = torch.float32
    path: str = "torch"  # FLASHTRAIN_CPU_ATTENTION
    head_dim: int = 16


# K/V heads split (Hkv % U == 0) and repeated (U % Hkv == 0) on every group size; odd lengths
# wherever the layout allows them (not hybrid zigzag: S must be a multiple of R * U * 2).
CASES = [
    CpCase("ulysses4", (4, 4), True, 7),
    CpCase("ulysses4", (8, 4), False, 5, batch=2, documents=True, head_dim=12),
    CpCase("ulysses4", (8, 2), True, 6, batch=2, documents=True),  # K/V repeated 2x
    CpCase("ulysses4", (4, 1), False, 9, layout="contiguous"),  # repeated 4x
    CpCase("ulysses4", (4, 2), True, 5, documents=True),
    CpCase("ulysses4", (4, 2), True, 4, dtype=torch.float16, path="triton"),
    CpCase("ulysses2", (4, 2), True, 7, batch=2),
    CpCase("ulysses2", (4, 1), True, 9, documents=True),
    CpCase("ulysses2", (2, 2), False, 6, batch=2, documents=True),
    CpCase("hybrid", (4, 2), True, 6),
    CpCase("hybrid", (4, 4), False, 5, batch=2, layout="contiguous"),
    CpCase("hybrid", (4, 1), True, 7, batch=2, layout="contiguous"),
    CpCase("hybrid", (4, 1), False, 4, batch=2),
    CpCase("hybrid", (2, 1), True, 2, dtype=torch.float16, path="triton"),
    # last: these need ring_attn_func(cu_seqlens=) (the ring's document masking)
    CpCase("hybrid", (4, 2), True, 6, documents=True),
    CpCase("hybrid", (8, 2), False, 5, batch=2, documents=True, layout="contiguous"),
]


def random_documents(batch: int, seq_len: int, generator: torch.Generator) -> tuple[int, ...]:
    """A document table over (batch * seq_len) tokens: every row a boundary; row 0 cut at random
    (documents across pieces and shards, a length-1 one, repeated cuts = empty documents), the
    other rows likewise except the last of a batch of 2, one whole-row document."""
    table = {0}
    for row in range(batch):
        start = row * seq_len
        table.add(start + seq_len)
        if row == 1:
            continue
        cuts = torch.randint(1, seq_len, (max(1, seq_len // 6),), generator=generator)
        table.update(start + int(c) for c in cuts)
        single = int(torch.randint(1, seq_len - 1, (1,), generator=generator))
        table.update((start + single, start + single + 1))
    bounds = sorted(table)
    return tuple(bounds[:2] + bounds[1:])  # the first cut twice: an empty document


def document_mask(table: tuple[int, ...], batch: int, seq_len: int) -> torch.Tensor:
    """Bool (B, 1, S, S): True where both tokens belong to the same document."""
    document = torch.searchsorted(torch.tensor(table), torch.arange(batch * seq_len), right=True)
    document = document.view(batch, seq_len)
    return (document[:, :, None] == document[:, None, :])[:, None]


def full_attention(q, k, v, causal: bool, table):
    """(out, lse (B, H, S)) of one process on the whole batch: flash_attn_func, or the varlen
    call on the flattened tokens with the document table."""
    if table is None:
        return flash_attn_func(q, k, v, causal=causal, return_lse=True)
    batch, seq_len, heads, dim = q.shape
    cu = torch.tensor(table, dtype=torch.int32)
    longest = max(b - a for a, b in zip(table, table[1:]))
    flat = [t.reshape(batch * seq_len, t.shape[2], dim) for t in (q, k, v)]
    out, lse = flash_attn_varlen_func(
        *flat, cu, cu, longest, longest, causal=causal, return_lse=True
    )
    return out.view(q.shape), lse.view(heads, batch, seq_len).transpose(0, 1)


def check_cp_case(case: CpCase, group, ring_group) -> None:
    """Run ulysses_attn_func on this rank's tokens and check it against the whole batch."""
    u, size, r, ring_size = 0, 1, 0, 1  # "alone": torch.distributed not initialized
    if case.mode != "alone":
        u, size = dist.get_rank(group), dist.get_world_size(group)  # group None: the world
    if ring_group is not None:
        r, ring_size = dist.get_rank(ring_group), dist.get_world_size(ring_group)
    rank = r * size + u
    seq_len = case.local_len * size * ring_size
    seed = zlib.crc32(repr(case).encode())  # the same on every rank
    torch.manual_seed(seed)
    q, k, v = random_qkv(case.batch, seq_len, seq_len, *case.heads, case.head_dim, case.dtype)
    dout = torch.randn_like(q)
    table = None
    if case.documents:
        table = random_documents(case.batch, seq_len, torch.Generator().manual_seed(seed))
    mask = document_mask(table, case.batch, seq_len) if table else None
    truth, low = reference_results(q, k, v, dout, causal=case.causal, element_mask=mask)

    def local(x, dim=1):
        return take_cp_shard(x, dim, rank, ring_size, size, case.layout)

    def sharded(a, b, c):
        return ulysses_attn_func(
            a, b, c, group=group, ring_group=ring_group, causal=case.causal, layout=case.layout,
            cu_seqlens=table, return_lse=True,
        )  # fmt: skip

    got = forward_backward(sharded, local(q), local(k), local(v), local(dout))
    whole = forward_backward(
        lambda a, b, c: full_attention(a, b, c, case.causal, table), q, k, v, dout
    )

    def shard(results):  # out, lse (B, H, S), dq, dk, dv
        return [local(x, dim=2 if i == 1 else 1) for i, x in enumerate(results)]

    try:
        assert_matches_reference(got, shard(truth), shard(low), case.dtype)
        assert_matches_reference(got, shard(truth), shard(whole), case.dtype)
    except AssertionError as error:
        raise AssertionError(f"rank={rank} {case} documents={table}: {error}") from None


def cp_groups(rank: int) -> dict[str, tuple[object, object]]:
    """(Ulysses group, ring group) of this rank per mode; every rank creates every group, in
    the same order, as new_group requires."""
    pairs = [dist.new_group(members) for members in ([0, 1], [2, 3], [0, 2], [1, 3])]
    ulysses_pair, ring_pair = pairs[rank // 2], pairs[2 + rank % 2]
    return {
        "ulysses4": (None, None),
        "ulysses2": (ulysses_pair, None),
        "hybrid": (ulysses_pair, ring_pair),
    }


def cp_worker(rank: int, world_size: int, cases: list[CpCase]) -> None:
    groups = cp_groups(rank)
    q = torch.zeros(1, 4, 12, 8)
    with pytest.raises(ValueError, match="heads_kv=6 .*U=4 ranks"):  # U read from the group
        ulysses_attn_func(q, q[:, :, :6], q[:, :, :6])
    odd = q[:, :3]  # hybrid zigzag: S = 3 * 2 * 2 is no multiple of R * U * 2
    with pytest.raises(ValueError, match=r"global sequence length is 12.*R \* U \* 2 = 8"):
        ulysses_attn_func(odd, odd, odd, group=groups["hybrid"][0], ring_group=groups["hybrid"][1])
    for case in cases:
        os.environ["FLASHTRAIN_CPU_ATTENTION"] = case.path  # a child process: ours to set
        check_cp_case(case, *groups[case.mode])


def test_ulysses_and_hybrid_match_the_full_batch(tmp_path):
    run_ranks(cp_worker, 4, tmp_path, CASES)


@pytest.mark.parametrize(
    "case",
    [
        CpCase("alone", (2, 1), True, 6, documents=True, dtype=torch.float16, path="triton"),
        CpCase("alone", (4, 1), False, 11, batch=2, documents=True),
    ],
)
def test_one_process_without_torch_distributed(case, monkeypatch):
    """U = R = 1 without torch.distributed: the op is the whole-batch (varlen) call."""
    assert not dist.is_initialized()
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", case.path)
    check_cp_case(case, None, None)


@pytest.mark.parametrize(
    "heads_q, heads_kv, size, repeats",
    [
        (4, 4, 4, 1),
        (8, 4, 4, 1),
        (4, 2, 2, 1),
        (8, 2, 4, 2),
        (4, 2, 4, 2),
        (4, 1, 4, 4),
        (3, 1, 1, 1),
    ],
)
def test_kv_heads_split_or_repeated(heads_q, heads_kv, size, repeats):
    assert ulysses_kv_repeats(heads_q, heads_kv, size) == repeats


@pytest.mark.parametrize(
    "heads_q, heads_kv, size, message",
    [
        (6, 3, 4, r"heads_q=6 must be a multiple of the Ulysses group size U=4"),
        (
            12,
            6,
            4,
            r"heads_kv=6 \(heads_q=12\) cannot be shared by U=4.*multiple of U, or a divisor",
        ),
        (6, 3, 2, r"heads_kv=3 \(heads_q=6\) cannot be shared by U=2"),
    ],
)
def test_kv_heads_that_cannot_be_shared(heads_q, heads_kv, size, message):
    with pytest.raises(ValueError, match=message):
        ulysses_kv_repeats(heads_q, heads_kv, size)


def _qkv(seqlen_q=8, seqlen_k=8, batch=1, dtype=torch.float32):
    q = torch.randn(batch, seqlen_q, 2, 8, dtype=dtype)
    k, v = (torch.randn(batch, seqlen_k, 2, 8, dtype=dtype) for _ in range(2))
    return q, k, v


def _documents(cu_seqlens, batch=1):
    return lambda: ulysses_attn_func(*_qkv(batch=batch), cu_seqlens=cu_seqlens)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ulysses_attn_func(*_qkv(seqlen_k=6)), "seqlen_q must equal seqlen_k"),
        (lambda: ulysses_attn_func(*_qkv(dtype=torch.float64)), "allowed: float16, bfloat16"),
        (lambda: ulysses_attn_func(*_qkv(), softmax_scale=-1.0), "softmax_scale must be"),
        (lambda: ulysses_attn_func(*_qkv(), layout="stripe"), "allowed: zigzag, contiguous"),
        (lambda: ulysses_attn_func(*_qkv(), ring_group=object()), "not initialized"),
        (lambda: ulysses_attn_func(*_qkv(), group=object()), "not initialized"),
        (_documents(torch.tensor([0, 8], device="meta")), "on meta.*tuple of ints or a CPU"),
        (_documents(torch.tensor([0.0, 8.0])), "1-D integer tensor, got torch.float32"),
        (_documents(torch.tensor([[0, 8]])), r"1-D integer tensor, got torch.int64 \(1, 2\)"),
        (_documents([0, 4.0, 8]), "must hold ints"),
        (_documents("0,8"), "got str"),
        (_documents((0, 4, 7)), r"end at B \* S_global = 1 \* 8 = 8"),
        (_documents((1, 4, 8)), "start at 0"),
        (_documents((0,)), "start at 0"),
        (_documents((0, 5, 3, 8)), "non-decreasing"),
        (_documents((0, 4, 12, 16), batch=2), r"no boundary at 8.*multiple of S_global = 8"),
    ],
)
def test_errors_say_what_is_allowed(call, message):
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=message):
        call()


def test_a_cpu_tensor_table_equals_the_tuple(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    q, k, v = _qkv(batch=2)
    table = (0, 3, 8, 8, 9, 16)
    by_tensor = ulysses_attn_func(q, k, v, causal=True, cu_seqlens=torch.tensor(table))
    by_tuple = ulysses_attn_func(q, k, v, causal=True, cu_seqlens=table)
    assert torch.equal(by_tensor, by_tuple)
