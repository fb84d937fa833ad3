"""Launch choices: causal-like bands launch (batch * heads, tiles) walked from the last query tile
(the heaviest first); every other band launches (tiles, heads, batch), the block order of
(tiles, batch * heads) with no axis past CUDA's 65,535 until a call has that many sequences. The
kernels' results under both grids are what the other kernel tests check (their causal cases run
the reversed grid)."""

import pytest

from flashtrain.kernels.common import UNBOUNDED, heavy_first, tile_grid

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route


def test_heavy_first_only_for_causal_like_bands():
    assert heavy_first(UNBOUNDED, 0)  # causal
    assert heavy_first(UNBOUNDED, 7)  # unbounded left, bounded right: still heavier later
    assert not heavy_first(UNBOUNDED, UNBOUNDED)  # full attention: tiles weigh the same
    assert not heavy_first(16, 0)  # a sliding window: tiles weigh the same past the start


def test_grid_axes():
    assert tile_grid(5, 3, 4, heavy=True) == (12, 5, 1)
    assert tile_grid(5, 3, 4, heavy=False) == (5, 4, 3)


def test_many_sequences_fit_the_grid():
    """A packed batch of 2,048 documents x 32 heads put 65,536 programs on the y axis before."""
    tiles, sequences, heads = 2, 2048, 32
    assert tile_grid(tiles, sequences, heads, heavy=False) == (2, 32, 2048)
    assert max(tile_grid(tiles, sequences, heads, heavy=True)[1:]) <= 65_535


@pytest.mark.parametrize(
    "tiles, batch, heads, heavy, axis",
    [(1, 70_000, 4, False, "z"), (70_000, 1, 4, True, "y"), (1, 2**20, 2**12, True, "x")],
)
def test_grids_past_cuda_limits_are_refused_with_the_axis(tiles, batch, heads, heavy, axis):
    with pytest.raises(ValueError, match=f"axis {axis} = .* past CUDA's limit"):
        tile_grid(tiles, batch, heads, heavy)


def test_fp32_products_follow_allow_tf32():
    import torch

    from flashtrain.kernels.common import dot_precision

    before = torch.backends.cuda.matmul.allow_tf32  # a property of torch's cuBLAS module
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert dot_precision(torch.float32) == "ieee"
        assert dot_precision(torch.bfloat16) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert dot_precision(torch.float32) == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
