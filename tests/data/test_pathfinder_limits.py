"""The longest contour each resolution takes (generator.MAX_CONTOUR_LENGTHS): one paddle more is
refused before any image, folder or lock is made, naming the allowed range; at the limit the
images are laid out, and (slow) the rate that the limit was chosen by is measured again."""

from __future__ import annotations

import numpy as np
import pytest

from flashtrain.data.config import PathfinderConfig
from flashtrain.data.pathfinder.cache import load_or_generate
from flashtrain.data.pathfinder.generator import (
    _TARGET_ROUNDS,
    MAX_CONTOUR_LENGTHS,
    RESOLUTIONS,
    _Scene,
    generate_pathfinder,
    settings_for,
    target_round,
)


@pytest.mark.parametrize("resolution", RESOLUTIONS)
def test_one_paddle_past_the_limit_is_refused_before_anything_is_made(resolution, tmp_path):
    longest = MAX_CONTOUR_LENGTHS[resolution]
    PathfinderConfig(resolution=resolution, contour_length=longest)  # accepted
    allowed = f"allowed are 2 to {longest} paddles there"
    refusal = f"data.contour_length={longest + 1} does not fit .*{allowed}"
    with pytest.raises(ValueError, match=refusal):
        PathfinderConfig(resolution=resolution, contour_length=longest + 1)
    with pytest.raises(ValueError, match=allowed):
        generate_pathfinder(2, resolution=resolution, contour_length=longest + 1)
    with pytest.raises(ValueError, match=allowed):
        load_or_generate(tmp_path / "cache", resolution, longest + 1, 20, 0, num_workers=1)
    assert not (tmp_path / "cache").exists()


def test_the_longest_contour_at_32_is_laid_out():
    images, labels = generate_pathfinder(2, resolution=32, contour_length=MAX_CONTOUR_LENGTHS[32])
    assert images.shape == (2, 32, 32) and sorted(labels.tolist()) == [0, 1]


def round_success(resolution: int, contour_length: int, rounds: int = 1000) -> float:
    """The share of layout rounds (target_round) that fit both targets, each round in a fresh
    scene from its own stream (the measurement behind MAX_CONTOUR_LENGTHS)."""
    s = settings_for(resolution)
    fitted = 0
    for r in range(rounds):
        key = (resolution, contour_length, r, 7)  # streams no image uses (theirs end in 0)
        rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=key))
        scene = _Scene(s, float(s.margins[rng.integers(len(s.margins))]))
        fitted += target_round(scene, rng, contour_length) is not None
    return fitted / rounds


RELIABLE = 0.05  # a round's rate at which all 500 rounds of an image fail 0.95**500 = 7e-12


@pytest.mark.slow  # ~2 min on 2 busy cores: 7000 layout rounds, up to 40 ms each at 128x128
def test_the_limits_are_the_longest_contours_laid_out_reliably():
    assert (1 - RELIABLE) ** _TARGET_ROUNDS < 1e-11
    for resolution, longest in MAX_CONTOUR_LENGTHS.items():
        rate = round_success(resolution, longest)
        assert rate >= RELIABLE, (resolution, longest, rate)
    # One paddle more falls below it (256 is the 128 scene at twice the scale: its limit is
    # 128's, one paddle short of where its own measurement would put it)
    for resolution in (32, 64, 128):
        rate = round_success(resolution, MAX_CONTOUR_LENGTHS[resolution] + 1)
        assert rate < RELIABLE, (resolution, rate)
