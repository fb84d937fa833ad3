"""The context-parallel tests' groups and the check of one ring attention case against the full
sequence's float64 reference and flash_attn_func. The processes: tests/spawn_testing.py."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)

from flashtrain.attention import flash_attn_func, ring_attn_func
from flashtrain.attention.ring_sharding import take_shard


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
