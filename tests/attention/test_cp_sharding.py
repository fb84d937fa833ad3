"""take_cp_shard / cp_shard_positions / cp_unshard: which tokens each rank of a context-parallel
group of R ring shards x U Ulysses pieces holds, and the lengths that cannot be split. No
processes: these are functions of (rank, R, U, layout) alone."""

from __future__ import annotations

import pytest
import torch

from flashtrain.attention.ring_sharding import (
    check_cp_sequence_length,
    cp_shard_positions,
    cp_unshard,
    shard_positions,
    take_cp_shard,
    take_shard,
)

pytestmark = pytest.mark.single_route  # no attention call: one run, not one per CPU route


def test_hybrid_zigzag_positions_by_hand():
    # 16 tokens, R = 2 ring shards of zigzag chunks of 4: shard 0 = chunks 0, 3; shard 1 = 1, 2
    expected = [[0, 1, 2, 3], [12, 13, 14, 15], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [cp_shard_positions(16, p, 2, 2).tolist() for p in range(4)] == expected
    # U = 4: each ring shard in four pieces, a zigzag chunk split in two
    pieces = [cp_shard_positions(16, p, 2, 4).tolist() for p in range(8)]
    assert pieces[:4] == [[0, 1], [2, 3], [12, 13], [14, 15]]
    assert pieces[4:] == [[4, 5], [6, 7], [8, 9], [10, 11]]
    contiguous = [cp_shard_positions(12, p, 2, 3, layout="contiguous").tolist() for p in range(6)]
    assert contiguous == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ring_mode_is_the_ring_shard(layout, world_size):
    """(R = P, U = 1) is shard_positions / take_shard exactly."""
    seq_len = 2 * world_size * 5
    x = torch.randn(2, seq_len, 3)
    for rank in range(world_size):
        positions = cp_shard_positions(seq_len, rank, world_size, 1, layout=layout)
        assert torch.equal(positions, shard_positions(seq_len, rank, world_size, layout=layout))
        mine = take_cp_shard(x, 1, rank, world_size, 1, layout)
        assert torch.equal(mine, take_shard(x, 1, rank, world_size, layout))


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_ulysses_mode_is_a_contiguous_piece_whatever_the_layout(layout):
    """(R = 1, U = P): piece p of the whole sequence; odd lengths are fine."""
    x = torch.randn(21, 2)
    for rank in range(3):
        assert torch.equal(take_cp_shard(x, 0, rank, 1, 3, layout), x[7 * rank : 7 * rank + 7])
        assert cp_shard_positions(21, rank, 1, 3, layout=layout).tolist() == list(
            range(7 * rank, 7 * rank + 7)
        )


@pytest.mark.parametrize(
    "ring_size, ulysses_size, seq_len",
    [(1, 1, 5), (1, 4, 12), (2, 2, 8), (2, 3, 36), (3, 2, 12), (4, 1, 24)],
)
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_every_token_once_and_the_inverse(ring_size, ulysses_size, seq_len, layout):
    ranks = range(ring_size * ulysses_size)
    every = torch.cat(
        [cp_shard_positions(seq_len, p, ring_size, ulysses_size, layout=layout) for p in ranks]
    )
    assert sorted(every.tolist()) == list(range(seq_len))
    x = torch.randn(2, 3, seq_len)  # the sequence on the last dim, named negatively
    shards = [take_cp_shard(x, -1, p, ring_size, ulysses_size, layout) for p in ranks]
    assert torch.equal(cp_unshard(shards, -1, ring_size, ulysses_size, layout), x)
    for p, shard in zip(ranks, shards):
        where = cp_shard_positions(seq_len, p, ring_size, ulysses_size, layout=layout)
        assert torch.equal(shard, x[..., where])


def test_a_shard_is_a_new_tensor():
    x = torch.zeros(8)
    take_cp_shard(x, 0, 0, 1, 2, "zigzag").fill_(1.0)
    assert not x.any()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_cp_sequence_length(10, 1, 4, "zigzag", "seq_len"), "multiple of U = 4"),
        (
            lambda: check_cp_sequence_length(12, 2, 2, "zigzag", "seq_len"),
            r"seq_len is 12.*R=2.*U=2.*multiple of R \* U \* 2 = 8",
        ),
        (lambda: check_cp_sequence_length(6, 2, 2, "contiguous", "n"), r"R \* U = 4"),
        (lambda: check_cp_sequence_length(8, 1, 2, "ring", "n"), "allowed: zigzag, contiguous"),
        (lambda: check_cp_sequence_length(8, 0, 2, "zigzag", "n"), "ring_size must be an int"),
        (lambda: check_cp_sequence_length(8, 2, 1.0, "zigzag", "n"), "ulysses_size must be"),
        (lambda: cp_shard_positions(16, 4, 2, 2), r"rank=4 must be in \[0, R \* U = 4\)"),
        (lambda: cp_shard_positions(16, -1, 2, 2), r"rank=-1 must be in"),
        (lambda: take_cp_shard(torch.zeros(8), 1, 0, 1, 2, "zigzag"), "dim=1 is out of range"),
        (lambda: take_cp_shard(torch.zeros(2, 6), 1, 0, 2, 1, "zigzag"), "length of dim 1 is 6"),
        (lambda: cp_unshard([torch.zeros(2)] * 3, 0, 2, 2, "zigzag"), "got 3 shards.*need 4"),
    ],
)
def test_errors_say_what_is_allowed(call, message):
    with pytest.raises(ValueError, match=message):
        call()
