"""shard_sequence / unshard_sequence / shard_positions: where each token goes, round trips and
their gradients on spawned gloo groups, and the errors for what cannot be split."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ring_testing import ring_groups
from spawn_testing import run_ranks

from flashtrain.attention import ring_attn_func, shard_sequence, unshard_sequence
from flashtrain.attention.ring_sharding import shard_positions


def test_zigzag_positions_pair_early_and_late_chunks():
    # 16 tokens, 4 ranks: 8 chunks of 2; rank r holds chunks r and 7 - r
    assert shard_positions(16, 0, 4).tolist() == [0, 1, 14, 15]
    assert shard_positions(16, 1, 4).tolist() == [2, 3, 12, 13]
    assert shard_positions(16, 3, 4).tolist() == [6, 7, 8, 9]
    assert shard_positions(12, 2, 3, layout="contiguous").tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_positions_cover_the_sequence_once(layout, world_size):
    seq_len = 2 * world_size * 3
    every = torch.cat(
        [shard_positions(seq_len, r, world_size, layout=layout) for r in range(world_size)]
    )
    assert sorted(every.tolist()) == list(range(seq_len))


def test_one_process_shard_is_the_whole_sequence():
    x = torch.randn(2, 6, 3, requires_grad=True)
    y = shard_sequence(x)
    assert torch.equal(y, x) and torch.equal(unshard_sequence(y), x)
    unshard_sequence(y).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: shard_positions(10, 0, 3), r"seq_len is 10.*multiple of 2\*P = 6"),
        (lambda: shard_positions(10, 0, 3, layout="contiguous"), "multiple of P = 3"),
        (lambda: shard_positions(12, 3, 3), r"rank=3 must be in \[0, world_size=3\)"),
        (lambda: shard_positions(12, 0, 3, layout="ring"), "allowed: zigzag, contiguous"),
        (lambda: shard_sequence(torch.zeros(1, 5, 2)), r"dim 1 is 5.*multiple of 2\*P = 2"),
        (lambda: shard_sequence(torch.zeros(1, 4), dim=2), "dim=2 is out of range"),
        (lambda: shard_sequence([1, 2]), "expected a torch.Tensor"),
        (lambda: unshard_sequence(torch.zeros(1, 3, 2)), "must be a multiple of 2"),
        (lambda: unshard_sequence(torch.zeros(4), layout="x", dim=0), "allowed: zigzag"),
    ],
)
def test_layout_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _qkv(seqlen_q=8, seqlen_k=8, heads=2, head_dim=16):
    q = torch.randn(1, seqlen_q, heads, head_dim)
    return q, torch.randn(1, seqlen_k, heads, head_dim), torch.randn(1, seqlen_k, heads, head_dim)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ring_attn_func(*_qkv(seqlen_k=6)), "seqlen_q must equal seqlen_k"),
        (lambda: ring_attn_func(*_qkv(7, 7)), "7 tokens; layout='zigzag'.*multiple of 2"),
        (lambda: ring_attn_func(*_qkv(), layout="stripe"), "allowed: zigzag, contiguous"),
        (lambda: ring_attn_func(*_qkv(head_dim=264)), "between 1 and 256"),
        (lambda: ring_attn_func(*_qkv(), softmax_scale=0.0), "softmax_scale must be a positive"),
        (lambda: ring_attn_func(*_qkv(), group=object()), "torch.distributed is not initialized"),
    ],
)
def test_ring_attention_errors(call, message):
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=message):
        call()


def _check_group(group, size: int) -> None:
    rank = dist.get_rank(group)
    for layout in ("zigzag", "contiguous"):
        for dim, shape, dtype in (
            (1, (2, 4 * size, 3), torch.float64),
            (0, (6 * size,), torch.int64),
        ):
            torch.manual_seed(size)  # the same full tensor on every rank
            x = (torch.randn(shape) * 100).to(dtype)
            x_local = shard_sequence(x, group, layout=layout, dim=dim)
            where = shard_positions(shape[dim], rank, size, layout=layout)
            assert torch.equal(x_local, x.index_select(dim, where))
            assert torch.equal(unshard_sequence(x_local, group, layout=layout, dim=dim), x)

        # Gradients are those of the sum of every rank's loss.
        seq_len = 4 * size
        weights = [torch.randn(2, seq_len // size, 3, generator=_gen(r)) for r in range(size)]
        x = torch.randn(2, seq_len, 3, generator=_gen(99), requires_grad=True)
        (shard_sequence(x, group, layout=layout) * weights[rank]).sum().backward()
        expected = torch.zeros(2, seq_len, 3)  # each rank's weights at its own positions
        for r, w in enumerate(weights):
            expected[:, shard_positions(seq_len, r, size, layout=layout)] = w
        torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)

        full_weights = [torch.randn(2, seq_len, 3, generator=_gen(10 + r)) for r in range(size)]
        x_local = torch.randn(2, seq_len // size, 3, generator=_gen(rank), requires_grad=True)
        (unshard_sequence(x_local, group, layout=layout) * full_weights[rank]).sum().backward()
        mine = shard_positions(seq_len, rank, size, layout=layout)
        torch.testing.assert_close(x_local.grad, sum(full_weights)[:, mine])

    if size > 1:  # lengths the group cannot split
        with pytest.raises(ValueError, match=rf"multiple of 2\*P = {2 * size}"):
            shard_sequence(torch.zeros(1, 2 * size + 2), group)
        with pytest.raises(ValueError, match=rf"multiple of P = {size}"):
            shard_sequence(torch.zeros(1, size + 1), group, layout="contiguous")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def layout_worker(rank: int, world_size: int) -> None:
    for size, group in ring_groups(world_size):
        _check_group(group, size)
    outsider = dist.new_group([1, 2])
    if rank not in (1, 2):
        with pytest.raises(ValueError, match="not a member"):
            shard_sequence(torch.zeros(1, 8), outsider)


def test_shard_unshard_round_trips_and_gradients(tmp_path):
    run_ranks(layout_worker, 4, tmp_path)
