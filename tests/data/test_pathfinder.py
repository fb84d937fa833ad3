"""The Pathfinder generator: shapes, balance, determinism, and the geometry of what it drew
(checked on its own contour records with distances computed here independently)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from flashtrain.data.pathfinder.generator import (
    SETTINGS,
    distractor_counts,
    generate_pathfinder,
    generate_pathfinder_into,
)


def point_to_segment(p, seg):
    """Distance from point p (2,) to segment seg (4,), by projecting onto the segment."""
    a, b = np.asarray(seg[:2], float), np.asarray(seg[2:], float)
    ab, ap = b - a, np.asarray(p, float) - a
    t = 0.0 if ab @ ab == 0 else min(1.0, max(0.0, (ap @ ab) / (ab @ ab)))
    return float(np.linalg.norm(ap - t * ab))


def segment_gap(s, u):
    """Distance between two segments, by dense sampling of one against the other (close enough
    for clearance checks with a small tolerance)."""
    points = np.linspace(s[:2], s[2:], 41)
    return min(point_to_segment(p, u) for p in points)


@pytest.fixture(scope="module")
def sample():
    return generate_pathfinder(
        12, resolution=64, contour_length=9, seed=3, num_workers=1, return_records=True
    )


def test_shapes_dtypes_and_exact_balance(sample):
    images, labels, records = sample
    assert images.shape == (12, 64, 64) and images.dtype == np.uint8
    assert labels.shape == (12,) and labels.dtype == np.int64
    assert set(labels.tolist()) <= {0, 1} and labels.sum() == 6
    assert all((labels[i] + labels[i + 1]) == 1 for i in range(0, 12, 2))  # one of each per pair
    assert [r.label for r in records] == labels.tolist()


def test_deterministic_by_seed_prefix_stable_and_worker_independent():
    a, la = generate_pathfinder(6, 32, 6, seed=1, num_workers=1)
    b, lb = generate_pathfinder(10, 32, 6, seed=1, num_workers=1)
    assert np.array_equal(a, b[:6]) and np.array_equal(la, lb[:6])
    c, _ = generate_pathfinder(6, 32, 6, seed=2, num_workers=1)
    assert not np.array_equal(a, c)
    # Two worker processes with small chunks give the same images as one process.
    images = np.empty((8, 32, 32), np.uint8)
    labels = np.empty(8, np.int64)
    generate_pathfinder_into(images, labels, 32, 6, seed=1, num_workers=2, chunk_size=3)
    d, ld = generate_pathfinder(8, 32, 6, seed=1, num_workers=1)
    assert np.array_equal(images, d) and np.array_equal(labels, ld)


def marker_contours(record):
    """For each marker, the contours whose first or last tip it sits on."""
    found = []
    for centre in record.markers:
        found.append(
            {
                i
                for i, snake in enumerate(record.snakes)
                if np.allclose(snake[0, :2], centre) or np.allclose(snake[-1, 2:], centre)
            }
        )
    return found


def test_positives_have_both_markers_on_one_contour_negatives_not(sample):
    _, labels, records = sample
    for label, record in zip(labels, records):
        first, second = marker_contours(record)
        assert first and second
        assert bool(first & second) == bool(label)
        assert all(record.is_target[i] for i in first | second)  # markers sit on targets only


def test_contours_have_the_requested_lengths(sample):
    _, _, records = sample
    count, length = distractor_counts(9, SETTINGS[64])
    for record in records:
        assert [len(s) for s, t in zip(record.snakes, record.is_target) if t] == [9, 9]
        distractors = [len(s) for s, t in zip(record.snakes, record.is_target) if not t]
        assert set(distractors) <= {length} and 0 < len(distractors) <= count


def test_paddles_never_overlap_and_markers_stay_clear(sample):
    _, _, records = sample
    s = SETTINGS[64]
    for record in records[:4]:
        clearance = s.paddle_thickness + 2 * record.margin - 1e-6
        paddles = [(i, k, p) for i, snake in enumerate(record.snakes) for k, p in enumerate(snake)]
        for (i, k, p), (j, m, q) in ((a, b) for a in paddles for b in paddles if a[:2] < b[:2]):
            if i == j and abs(k - m) == 1:
                # Consecutive paddles of a contour: separated by a gap of about 2 * margin.
                assert 1.2 * record.margin < segment_gap(p, q) <= 2 * record.margin + 1e-6
            elif (
                np.abs((p[:2] + p[2:]) / 2 - (q[:2] + q[2:]) / 2).max()
                < clearance + s.paddle_length
            ):
                assert segment_gap(p, q) >= clearance - 0.05
        for centre, own in zip(record.markers, record.marker_snakes):
            for i, _, p in paddles:
                if i != own:
                    assert point_to_segment(centre, p) >= s.marker_radius + s.paddle_thickness / 2


def test_rendering_draws_markers_and_paddles_and_nothing_else(sample):
    images, _, records = sample
    s = SETTINGS[64]
    for image, record in zip(images[:3], records[:3]):
        for y, x in record.markers:
            assert image[int(y), int(x)] == 255
        paddles = np.concatenate(record.snakes)
        for p in paddles:
            mid = (p[:2] + p[2:]) / 2
            assert image[int(mid[0]), int(mid[1])] > 0.25 * 0.9 * 255
        # A pixel whose centre is out of reach of every paddle and marker stays black.
        for yy, xx in zip(*np.nonzero(image)):
            centre = (yy + 0.5, xx + 0.5)
            near_paddle = (
                min(point_to_segment(centre, p) for p in paddles) < s.paddle_thickness / 2 + 0.5
            )
            near_marker = (
                min(np.linalg.norm(np.subtract(centre, m)) for m in record.markers)
                < s.marker_radius + 0.5
            )
            assert near_paddle or near_marker


def test_every_resolution_and_difficulty_generates(record_property):
    for resolution in (32, 64, 128, 256):
        for length in (6, 14):
            images, labels = generate_pathfinder(2, resolution, length, seed=0, num_workers=1)
            assert images.shape == (2, resolution, resolution) and images.max() == 255
    start = time.perf_counter()
    generate_pathfinder(8, 128, 14, seed=9, num_workers=1)
    rate = 8 / (time.perf_counter() - start)
    record_property("pathfinder128_images_per_s_one_process", rate)  # recorded, not asserted
    print(f"pathfinder 128x128: {rate:.1f} images/s in one process")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="32, 64, 128, 256"):
        generate_pathfinder(2, resolution=100)
    with pytest.raises(ValueError, match="contour_length"):
        generate_pathfinder(2, resolution=32, contour_length=1)


def _run_plain_script(tmp_path, call: str) -> subprocess.CompletedProcess:
    """A script that calls the generator at its top level, without `if __name__ == "__main__":`."""
    script = tmp_path / "plain_script.py"
    script.write_text(
        "from flashtrain.data.pathfinder import generate_pathfinder\n"
        f"images, labels = {call}\n"
        "print(images.shape, int(labels.sum()))\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_a_plain_script_generates_in_its_own_process(tmp_path):
    # 130 images = 3 chunks: enough for worker processes, had the call started any
    run = _run_plain_script(tmp_path, "generate_pathfinder(130, 32, 6, seed=1)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["(130,", "32,", "32)", "65"]  # shape, label-1 count (balanced)


def test_workers_without_a_main_guard_are_explained(tmp_path):
    run = _run_plain_script(tmp_path, "generate_pathfinder(130, 32, 6, seed=1, num_workers=2)")
    assert run.returncode != 0
    assert 'if __name__ == "__main__":' in run.stderr and "num_workers=None or 1" in run.stderr


@pytest.mark.parametrize("workers", [0, -2, 1.5, True])
def test_bad_worker_counts_are_refused(workers):
    with pytest.raises(ValueError, match="num_workers"):
        generate_pathfinder(2, 32, 6, num_workers=workers)
