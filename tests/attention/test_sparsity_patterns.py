"""Block-sparsity patterns: shapes, structure, density and determinism."""

import math

import pytest
import torch

from flashtrain.attention import sparsity

pytestmark = pytest.mark.single_route  # layouts only: no attention call


@pytest.mark.parametrize("name", sorted(sparsity.PATTERNS))
@pytest.mark.parametrize("seqlen, block_size", [(1000, 128), (4096, 64)])
def test_shape_diagonal_and_density(name, seqlen, block_size):
    layout = sparsity.PATTERNS[name](seqlen, block_size=block_size, heads=2)
    n = math.ceil(seqlen / block_size)
    assert layout.block_mask.shape[1:] == (n, n) and layout.block_mask.shape[0] in (1, 2)
    assert layout.block_mask.dtype == torch.bool and layout.block_size == block_size
    # Every query block sees its own diagonal block (no query is left without keys).
    assert layout.block_mask[:, torch.arange(n), torch.arange(n)].all()
    assert layout.density == pytest.approx(layout.block_mask.float().mean().item())
    assert 0 < layout.density < 1


@pytest.mark.parametrize("name", ["butterfly", "local", "global_local", "strided"])
def test_deterministic_patterns_are_symmetric(name):
    mask = sparsity.PATTERNS[name](2048, block_size=64).block_mask[0]
    assert torch.equal(mask, mask.T)


def test_local_band():
    mask = sparsity.local(1024, block_size=128, window_blocks=2).block_mask[0]
    i, j = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    assert torch.equal(mask, (i - j).abs() <= 2)


def test_butterfly_structure_and_log_density():
    n = 64
    mask = sparsity.butterfly(n * 128, block_size=128).block_mask[0]
    for i in range(n):
        expected = {i} | {i ^ (1 << b) for b in range(6)}
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == expected
    assert sparsity.butterfly(n * 128).density == pytest.approx((1 + math.log2(n)) / n)
    # Two blocks connect in at most log2(n) hops: (mask^log2n) has no zero.
    reach = mask.float()
    for _ in range(int(math.log2(n)) - 1):
        reach = (reach @ mask.float()).clamp(max=1)
    assert reach.all()
    with_global = sparsity.butterfly(n * 128, num_global=2).block_mask[0]
    assert with_global[:2].all() and with_global[:, :2].all()


def test_global_local_rows_and_columns():
    mask = sparsity.global_local(2048, block_size=128, num_global=2, window_blocks=1).block_mask[0]
    assert mask[:2].all() and mask[:, :2].all()
    assert not mask[10, 5] and mask[10, 9] and mask[10, 11]


def test_bigbird_random_blocks_seeded():
    a = sparsity.bigbird(4096, block_size=128, heads=3, num_random=3, seed=7)
    b = sparsity.bigbird(4096, block_size=128, heads=3, num_random=3, seed=7)
    c = sparsity.bigbird(4096, block_size=128, heads=3, num_random=3, seed=8)
    assert torch.equal(a.block_mask, b.block_mask) and not torch.equal(a.block_mask, c.block_mask)
    base = sparsity.global_local(4096, block_size=128, num_global=1, window_blocks=1).block_mask
    extra = (a.block_mask & ~base).sum(-1)  # random blocks per (head, query block)
    assert (extra[:, 1:] == 3).all() and (extra[:, 0] == 0).all()  # block 0 is a global row
    assert not torch.equal(a.block_mask[0], a.block_mask[1])  # per-head randomness


def test_strided():
    mask = sparsity.strided(16 * 64, block_size=64, stride=4).block_mask[0]
    assert mask[9, 1] and mask[9, 7] and not mask[9, 3] and mask[9, 9]


def test_from_dense_mask_covers_the_mask():
    gen = torch.Generator().manual_seed(0)
    element = torch.rand(2, 300, 200, generator=gen) < 0.001
    layout = sparsity.from_dense_mask(element, block_size=64)
    assert layout.block_mask.shape == (2, 5, 4)
    expanded = layout.block_mask.repeat_interleave(64, 1).repeat_interleave(64, 2)[:, :300, :200]
    assert not (element & ~expanded).any()  # every True element lies in a kept block
    for h, i, j in torch.nonzero(layout.block_mask).tolist():
        assert element[h, i * 64 : (i + 1) * 64, j * 64 : (j + 1) * 64].any()  # kept only if needed


def test_pattern_arguments_are_checked():
    with pytest.raises(ValueError, match="window_blocks must be >= 0"):
        sparsity.local(1024, window_blocks=-1)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        sparsity.strided(1024, stride=0)
    with pytest.raises(ValueError, match="block_size=96 is not supported"):
        sparsity.local(1024, block_size=96)
