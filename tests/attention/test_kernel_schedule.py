"""Launch choices: causal-like bands launch (batch * heads, tiles) walked from the last query tile
(the heaviest first); every other band keeps (tiles, batch * heads). The kernels' results under
both orders are what the other kernel tests check (their causal cases run the reversed grid)."""

import pytest

from flashtrain.kernels.common import UNBOUNDED, heavy_first, tile_grid

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route


def test_heavy_first_only_for_causal_like_bands():
    assert heavy_first(UNBOUNDED, 0)  # causal
    assert heavy_first(UNBOUNDED, 7)  # unbounded left, bounded right: still heavier later
    assert not heavy_first(UNBOUNDED, UNBOUNDED)  # full attention: tiles weigh the same
    assert not heavy_first(16, 0)  # a sliding window: tiles weigh the same past the start


def test_grid_axes():
    assert tile_grid(5, 12, heavy=True) == (12, 5)
    assert tile_grid(5, 12, heavy=False) == (5, 12)


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
