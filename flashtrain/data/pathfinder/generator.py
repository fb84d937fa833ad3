"""Pathfinder images (Linsley et al. 2018, as the Long Range Arena used them), generated here.

An image holds two *target* contours and several shorter *distractor* contours. A contour ("snake")
is a chain of short paddles (thick line segments) separated by gaps, so it reads as a dashed curve;
each paddle turns from the previous one by an angle drawn with weight cos^2(continuity * turn), so
contours are smooth, and no paddle comes closer than a clearance to any paddle of another contour.
Two disc markers are drawn: label 1 ("same") puts them on both ends of one target contour, label 0
("different") on one end of each target contour. The two targets start near each other (seed
distance), so the distance between the markers does not give the label away.

Each image is drawn from its own random stream (seed, resolution, contour length, index), so the
output depends neither on the number of worker processes nor on `num` (a prefix is stable), nor on
which chunks of images are made in which run (cache.py resumes an interrupted
generation from its finished chunks). Images are made in the calling process unless worker
processes are asked for (num_workers > 1, as datasets.map's num_proc or a DataLoader's
num_workers: the calling script then needs `if __name__ == "__main__":`, since each worker
imports it, and a call from its unguarded top level is refused before any worker starts:
flashtrain.data.main_guard); inside one image every growth step is vectorised over all candidate turns and all
paddles already placed.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import numpy as np

from flashtrain.data.main_guard import unguarded_call_site
from flashtrain.data.pathfinder.geometry import (
    OccupancyRaster,
    draw_discs,
    draw_segments,
    segment_distance,
)

GENERATOR_VERSION = 1  # part of cache names: bump whenever the same seed would draw other images
RESOLUTIONS = (32, 64, 128, 256)
CONTOUR_LENGTHS = (6, 9, 14)  # LRA difficulties: baseline, intermediate, hard


@dataclass(frozen=True)
class PathfinderSettings:
    """Geometry of one resolution (lengths in pixels).

    margin: one value per image is drawn from `margins`; consecutive paddles of a contour are
    2 * margin apart and paddles of different contours at least thickness + 2 * margin apart
    (centre line to centre line), as in the original generator's dilated masks.
    """

    resolution: int
    paddle_length: float
    paddle_thickness: float
    margins: tuple[float, ...]
    marker_radius: float
    seed_distance: float  # distance between the first tips of the two target contours
    padding: float  # empty border
    continuity: float  # turn weight cos^2(continuity * turn): 1.8 allows turns up to 50 degrees
    contrast: float  # paddle intensity (markers are drawn at 1.0)
    distractor_paddles: int  # paddles spent on distractors; snakes = this / distractor length
    turn_candidates: int = 25  # discrete turn angles tried at each step


# Path-X (128) follows the LRA path-x generator: paddle 5, thickness 1.5, margin 2 or 3, marker 3,
# seed distance 20, continuity 1.8, contrast 0.9, distractors of a third of the contour length
# (70 distractor paddles, the value given in long-range-arena issue #38). 256 (Path-256) is the
# same scene at twice the scale; 32 and 64 shrink it so a 14-paddle contour still fits (at 32 with
# a lower continuity, so contours can curl inside the small frame).
SETTINGS = {
    32: PathfinderSettings(32, 2.0, 1.0, (0.75,), 1.5, 5.0, 0.5, 1.5, 0.9, 20),
    64: PathfinderSettings(64, 3.0, 1.0, (1.0, 1.5), 2.0, 10.0, 1.0, 1.8, 0.9, 40),
    128: PathfinderSettings(128, 5.0, 1.5, (2.0, 3.0), 3.0, 20.0, 1.0, 1.8, 0.9, 70),
    256: PathfinderSettings(256, 10.0, 3.0, (4.0, 6.0), 6.0, 40.0, 2.0, 1.8, 0.9, 70),
}

_TARGET_ROUNDS = 500  # a scene this hard to lay out means the settings are wrong
_SECOND_TARGET_ROUNDS = 8  # tries at the second target before starting the pair afresh
_TARGET_PROPOSALS = 16  # target contours grown side by side; the first to reach full length wins
_DISTRACTOR_ROUNDS = 1
_DISTRACTOR_PROPOSALS = 16  # tries at each distractor, grown side by side (the original: 5 in turn)


def settings_for(resolution: int) -> PathfinderSettings:
    if resolution not in SETTINGS:
        raise ValueError(f"pathfinder resolution must be one of {RESOLUTIONS}, got {resolution}")
    return SETTINGS[resolution]


# The longest target contour each resolution lays out reliably. An image gets _TARGET_ROUNDS
# rounds (target_round) to fit both targets; at these lengths a round succeeds 6% of the time
# or more (1000 rounds of independent streams each: 32 -> 21 paddles 6.4%, 22 3.2%; 64 -> 27
# 6.0%, 28 4.0%; 128 -> 31 7.7%, 32 4.4%; 256, the 128 scene at twice the scale, alike), so all
# 500 fail for fewer than one image in 10^13. Longer contours fail more often the longer they
# are (at 32x32 a round fits 24 paddles 1.1% of the time, so 0.4% of the images fail, and none
# of 1000 rounds fits 26 or more); they are refused at start (data.contour_length), not after
# hours of generation. tests/data/test_pathfinder_limits.py measures the rates again.
MAX_CONTOUR_LENGTHS = {32: 21, 64: 27, 128: 31, 256: 31}


def check_contour_length(resolution: int, contour_length: int, key: str = "contour_length") -> None:
    """Refuse (ValueError, naming `key` and the allowed range) a contour the generator cannot
    lay out reliably at this resolution (MAX_CONTOUR_LENGTHS), or one shorter than 2 paddles."""
    settings_for(resolution)
    if contour_length < 2:
        raise ValueError(f"{key} must be >= 2 paddles, got {contour_length}")
    longest = MAX_CONTOUR_LENGTHS[resolution]
    if contour_length > longest:
        lra = ", ".join(map(str, CONTOUR_LENGTHS))
        raise ValueError(
            f"{key}={contour_length} does not fit a {resolution}x{resolution} image: allowed "
            f"are 2 to {longest} paddles there (longer contours fail to lay out within the "
            f"generator's {_TARGET_ROUNDS} tries per image; LRA uses {lra})"
        )


def distractor_counts(contour_length: int, settings: PathfinderSettings) -> tuple[int, int]:
    """(number of distractor snakes, paddles per distractor): a third of the target length."""
    length = max(1, round(contour_length / 3))
    return max(1, round(settings.distractor_paddles / length)), length


@dataclass
class PathfinderRecord:
    """What the generator drew for one image (for tests and inspection)."""

    label: int
    margin: float
    snakes: list[np.ndarray] = field(default_factory=list)  # each (paddles, 4): y0, x0, y1, x1
    is_target: list[bool] = field(default_factory=list)
    markers: np.ndarray | None = None  # (2, 2) centres (y, x)
    marker_snakes: tuple[int, int] = (-1, -1)  # index into snakes of the contour under each marker
    marker_ends: tuple[str, str] = ("", "")  # "origin" (first paddle) or "terminal" (last paddle)


class _Scene:
    """One image being laid out: the occupancy raster of everything placed, and snake growth."""

    def __init__(self, settings: PathfinderSettings, margin: float):
        s = settings
        self.settings = s
        self.margin = margin
        self.length = s.paddle_length
        self.lo = s.padding + s.paddle_thickness / 2
        self.hi = s.resolution - self.lo
        self.paddle_clearance = s.paddle_thickness + 2 * margin
        self.marker_clearance = s.marker_radius + s.paddle_thickness / 2 + margin
        # Interior points of (-max_turn, max_turn), where the weight cos^2(c * turn) is positive.
        max_turn = (math.pi / 2) / s.continuity
        k = s.turn_candidates
        self.turns = max_turn * (2 * np.arange(k) + 1 - k) / k
        self.turn_weights = np.cos(s.continuity * self.turns) ** 2
        self.raster = OccupancyRaster(s.resolution)
        self.samples = int(math.ceil(self.length * self.raster.scale)) + 1

    def free(self, segments: np.ndarray) -> np.ndarray:
        """(...,) bool: paddles (..., 4) inside the frame and outside every keep-out zone."""
        flat = segments.reshape(-1, 4)
        ok = ((flat >= self.lo) & (flat <= self.hi)).all(axis=1)
        rows = np.flatnonzero(ok)
        if len(rows):
            ok[rows] = ~self.raster.blocks(flat[rows], self.samples)
        return ok.reshape(segments.shape[:-1])

    def clear_of_own(self, candidates: np.ndarray, own: np.ndarray) -> np.ndarray:
        """(A, K) bool: candidates (A, K, 4) keep the clearance from own paddles (A, J, 4)."""
        ok = np.ones(candidates.shape[:2], dtype=bool)
        mid_c = (candidates[..., :2] + candidates[..., 2:]) / 2  # (A, K, 2)
        mid_o = (own[..., :2] + own[..., 2:]) / 2  # (A, J, 2)
        gap = mid_c[:, :, None, :] - mid_o[:, None, :, :]  # (A, K, J, 2)
        # Paddles whose midpoints are farther apart than clearance + length cannot be too close.
        near = (gap * gap).sum(axis=-1) < (self.paddle_clearance + self.length) ** 2
        a, k, j = np.nonzero(near)
        if len(a):
            too_close = segment_distance(candidates[a, k], own[a, j]) < self.paddle_clearance
            ok[a[too_close], k[too_close]] = False
        return ok

    def first_paddles(self, tips: np.ndarray, angles: np.ndarray) -> np.ndarray:
        """(P, 4) paddles starting at tips (P, 2) in directions angles (P,)."""
        ends = tips + self.length * np.stack([np.sin(angles), np.cos(angles)], axis=-1)
        return np.concatenate([tips, ends], axis=-1)

    def next_paddles(self, last: np.ndarray, heading: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate continuations (P, K, 4) of paddles last (P, 4) pointing along heading (P,),
        one per turn angle, and their headings (P, K).

        The pivot sits `margin` past the end of the last paddle; the next paddle starts `margin`
        past the pivot in its new direction, so straight contours have gaps of 2 * margin.
        """
        pivot_y = last[:, 2] + self.margin * np.sin(heading)
        pivot_x = last[:, 3] + self.margin * np.cos(heading)
        angles = heading[:, None] + self.turns[None, :]  # (P, K)
        sin, cos = np.sin(angles), np.cos(angles)
        near, far = self.margin, self.margin + self.length
        py, px = pivot_y[:, None], pivot_x[:, None]
        paddles = np.stack(
            [py + near * sin, px + near * cos, py + far * sin, px + far * cos], axis=-1
        )
        return paddles, angles

    def grow(
        self, rng: np.random.Generator, firsts: np.ndarray, headings: np.ndarray, paddles: int
    ) -> np.ndarray | None:
        """Grow contours from first paddles (P, 4) pointing along headings (P,; updated in place)
        side by side; the first to reach `paddles` paddles is returned (paddles, 4), or None if all
        get stuck. Proposals are independent, so the winner is distributed as one contour
        conditioned on fitting into the scene (rejection sampling, like the original's retries).
        """
        count = len(firsts)
        chains = np.empty((count, paddles, 4))
        chains[:, 0] = firsts
        alive = self.free(firsts)
        for step in range(1, paddles):
            rows = np.flatnonzero(alive)
            if len(rows) == 0:
                return None
            candidates, angles = self.next_paddles(chains[rows, step - 1], headings[rows])
            ok = self.free(candidates)
            if step >= 2:
                # A contour keeps clear of itself too, except of the paddle it continues.
                ok &= self.clear_of_own(candidates, chains[rows, : step - 1])
            weights = self.turn_weights * ok  # (A, K)
            cumulative = np.cumsum(weights, axis=1)
            total = cumulative[:, -1]
            draw = rng.random(len(rows)) * total
            choice = np.minimum((cumulative <= draw[:, None]).sum(axis=1), weights.shape[1] - 1)
            chains[rows, step] = candidates[np.arange(len(rows)), choice]
            headings[rows] = angles[np.arange(len(rows)), choice]
            alive[rows[total <= 0]] = False
        winners = np.flatnonzero(alive)
        return chains[winners[0]] if len(winners) else None

    def commit(self, chain: np.ndarray) -> np.ndarray:
        self.raster.stamp(chain, self.paddle_clearance)
        return chain


def _random_angles(rng, count):
    return rng.uniform(-math.pi, math.pi, size=count)


def target_round(scene: _Scene, rng, contour_length: int) -> list[np.ndarray] | None:
    """One try at the two target contours of full length, first tips seed_distance apart, in a
    cleared scene: [first, second] (committed to the scene), or None when this round's
    proposals all got stuck."""
    s = scene.settings
    size, sd, count = s.resolution, s.seed_distance, _TARGET_PROPOSALS
    scene.raster.cells[:] = False
    # The first tip keeps 2 * seed_distance from the border, as in the original generator.
    tips = rng.uniform(2 * sd, size - 2 * sd, size=(count, 2))
    angles = _random_angles(rng, count)
    first = scene.grow(rng, scene.first_paddles(tips, angles), angles, contour_length)
    if first is None:
        return None
    scene.commit(first)
    for _ in range(_SECOND_TARGET_ROUNDS):
        away = _random_angles(rng, count)
        tips = first[0, :2] + sd * np.stack([np.sin(away), np.cos(away)], axis=-1)
        angles = _random_angles(rng, count)
        second = scene.grow(rng, scene.first_paddles(tips, angles), angles, contour_length)
        if second is not None:
            return [first, scene.commit(second)]
    return None


def _place_targets(scene: _Scene, rng, contour_length: int) -> list[np.ndarray]:
    """Two target contours of full length whose first tips are seed_distance apart."""
    for _ in range(_TARGET_ROUNDS):
        targets = target_round(scene, rng, contour_length)
        if targets is not None:
            return targets
    size = scene.settings.resolution
    raise RuntimeError(
        f"could not lay out two {contour_length}-paddle contours at {size}x{size} in "
        f"{_TARGET_ROUNDS} rounds; the settings leave too little room"
    )


def _place_distractor(scene: _Scene, rng, paddles: int) -> np.ndarray | None:
    count = _DISTRACTOR_PROPOSALS
    for _ in range(_DISTRACTOR_ROUNDS):
        tips = rng.uniform(scene.lo, scene.settings.resolution - scene.lo, size=(count, 2))
        angles = _random_angles(rng, count)
        chain = scene.grow(rng, scene.first_paddles(tips, angles), angles, paddles)
        if chain is not None:
            return scene.commit(chain)
    return None  # a distractor is whole or absent, never shortened


def make_image(
    index: int, resolution: int, contour_length: int, seed: int, label: int
) -> tuple[np.ndarray, PathfinderRecord]:
    """One image (R, R) uint8 and its record, drawn from the stream (seed, R, length, index)."""
    s = settings_for(resolution)
    stream = np.random.SeedSequence(seed, spawn_key=(resolution, contour_length, index, 0))
    rng = np.random.default_rng(stream)
    margin = float(s.margins[rng.integers(len(s.margins))])
    scene = _Scene(s, margin)
    snakes = _place_targets(scene, rng, contour_length)

    # Markers: the origin tip of target a, and the terminal tip of a (same) or of b (different).
    a = int(rng.integers(2))
    b = a if label == 1 else 1 - a
    markers = np.stack([snakes[a][0, :2], snakes[b][-1, 2:]])
    scene.raster.stamp(np.concatenate([markers, markers], axis=1), scene.marker_clearance)

    num_distractors, distractor_length = distractor_counts(contour_length, s)
    for _ in range(num_distractors):
        chain = _place_distractor(scene, rng, distractor_length)
        if chain is not None:
            snakes.append(chain)

    record = PathfinderRecord(
        label=label,
        margin=margin,
        snakes=snakes,
        is_target=[i < 2 for i in range(len(snakes))],
        markers=markers,
        marker_snakes=(a, b),
        marker_ends=("origin", "terminal"),
    )
    return render(record, s), record


def render(record: PathfinderRecord, settings: PathfinderSettings) -> np.ndarray:
    """Draw a record as a (R, R) uint8 image: paddles at `contrast`, markers at full intensity."""
    size = settings.resolution
    canvas = np.zeros((size, size), dtype=np.float64)
    paddles = np.concatenate(record.snakes)
    draw_segments(canvas, paddles, settings.paddle_thickness, settings.contrast)
    draw_discs(canvas, record.markers, settings.marker_radius)
    return np.rint(canvas * 255).astype(np.uint8)


def _pair_flip(seed: int, resolution: int, contour_length: int, pair: int) -> int:
    key = (resolution, contour_length, pair, 1)
    return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1)[0] & 1)


def balanced_labels(start: int, stop: int, resolution: int, contour_length: int, seed: int):
    """Labels for images start..stop-1: each aligned pair (2j, 2j+1) holds one 0 and one 1,
    in a seeded order."""
    index = np.arange(start, stop)
    flips = [_pair_flip(seed, resolution, contour_length, int(pair)) for pair in index // 2]
    return ((index + np.asarray(flips, dtype=np.int64)) % 2).astype(np.int64)


class GenerationStopped(Exception):
    """A worker's chunk abandoned because the parent is stopping (its result is not wanted)."""


_stop_requested = None  # in a worker process: the parent's stop event (see run_chunks)


def _init_worker(stop) -> None:
    global _stop_requested
    _stop_requested = stop
    # Ctrl-C reaches the whole process group: the parent handles it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:  # a parent killed outright (kill -9) cannot stop us: follow it
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent) -> None:
    parent.join()
    os._exit(1)


def _generate_range(task):
    start, stop, resolution, contour_length, seed, keep_records = task
    labels = balanced_labels(start, stop, resolution, contour_length, seed)
    images = np.empty((stop - start, resolution, resolution), dtype=np.uint8)
    records = []
    for offset, label in enumerate(labels):
        if _stop_requested is not None and _stop_requested.is_set():
            raise GenerationStopped
        images[offset], record = make_image(
            start + offset, resolution, contour_length, seed, int(label)
        )
        if keep_records:
            records.append(record)
    return start, images, labels, records


def all_cores() -> int:
    """The cores this process may run on: the worker count a config's `num_workers: null` means."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def chunk_tasks(
    ranges, resolution: int, contour_length: int, seed: int, keep_records: bool = False
) -> list[tuple]:
    """Work items for run_chunks: one per (start, stop) range of image indices."""
    check_contour_length(resolution, contour_length)
    return [(lo, hi, resolution, contour_length, seed, keep_records) for lo, hi in ranges]


def check_workers(num_workers: int | None) -> int:
    """num_workers as a process count: None -> 1 (this process, no workers)."""
    if num_workers is None:
        return 1
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(
            f"num_workers must be None or 1 (this process) or an int > 1 (worker processes), "
            f"got {num_workers!r}"
        )
    return num_workers


NEEDS_MAIN_GUARD = (
    "the Pathfinder worker processes died ({error}). Each worker imports the calling script: "
    'if the call sits at a script\'s top level, put it under `if __name__ == "__main__":`, or '
    "generate in this process (num_workers=None or 1)"
)
UNGUARDED_CALL = (
    "num_workers={workers} starts worker processes, and each imports the calling script {script}, "
    "whose line {line} makes this call at its top level: every worker would run it again (and "
    'wait forever for this one). Put that call under `if __name__ == "__main__":`, or generate '
    "in this process (num_workers=None or 1, the default)"
)


def check_workers_may_start(num_workers: int | None) -> int:
    """check_workers, and num_workers > 1 refused (RuntimeError, UNGUARDED_CALL) when the call
    comes from a script's unguarded top level: before any process, semaphore or file exists,
    whatever the amount of work."""
    workers = check_workers(num_workers)
    site = unguarded_call_site() if workers > 1 else None
    if site is not None:
        raise RuntimeError(UNGUARDED_CALL.format(workers=workers, script=site[0], line=site[1]))
    return workers


def run_chunks(tasks: list[tuple], num_workers: int | None, store) -> None:
    """Generate every task, calling store((start, images, labels, records)) in this process as
    each one finishes (in completion order; results are placed by index, so the order does not
    matter). num_workers None or 1: here, one task after another; N > 1: N worker processes.

    No worker outlives the call. On any exception or interrupt (KeyboardInterrupt, a SystemExit
    raised by a signal handler, an error in `store`, a worker that died: BrokenProcessPool) the
    workers are told to stop, abandon their chunk before its next image, and are joined, so the
    call returns within about one image's time and no semaphore leaks; a worker still there
    after WORKER_EXIT_S is killed (stop_workers), so no interrupt can leave the call waiting.
    """
    workers = min(check_workers_may_start(num_workers), len(tasks))
    if workers <= 1:
        for task in tasks:
            store(_generate_range(task))
        return
    # forkserver: workers start clean (no inherited threads or torch state) yet cheaply.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    stop = context.Event()
    executor = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(stop,)
    )
    try:
        futures = [executor.submit(_generate_range, task) for task in tasks]
        for future in as_completed(futures):
            store(future.result())
    except BrokenProcessPool as error:
        stop_workers(executor, stop)
        raise RuntimeError(NEEDS_MAIN_GUARD.format(error=error)) from error
    except BaseException:
        stop_workers(executor, stop)
        raise
    executor.shutdown(wait=True)


# How long stopped workers get to abandon their chunk (one image: milliseconds to a second or
# two at Path-X sizes on a loaded machine) and exit before they are killed.
WORKER_EXIT_S = 20.0


def stop_workers(executor: ProcessPoolExecutor, stop, wait_s: float = WORKER_EXIT_S) -> None:
    """Stop a pool whose results are no longer wanted, in bounded time. An unbounded
    shutdown(wait=True) after an interrupt once hung under load: it waits for the pool's
    manager thread, which waits for every worker. Here the workers are told to stop, joined up
    to wait_s, and whatever is still alive is killed; the manager thread then sees them gone,
    and is joined: shutdown(wait=False) forgets it, and one still closing the pool's queues
    while the process exits raced with the exit on a loaded machine."""
    stop.set()
    # no public accessors for the workers and the manager thread
    workers = list((getattr(executor, "_processes", None) or {}).values())
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + wait_s
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join()
    if manager is not None:
        manager.join()  # its workers are gone: it closes the queues and ends now


def generate_pathfinder_into(
    images_out: np.ndarray,
    labels_out: np.ndarray,
    resolution: int = 128,
    contour_length: int = 14,
    seed: int = 0,
    *,
    num_workers: int | None = None,
    progress: bool = False,
    chunk_size: int = 64,
    records_out: list | None = None,
) -> None:
    """Fill images_out (N, R, R) uint8 and labels_out (N,) int64 (e.g. memmaps): in this
    process (num_workers None or 1), or in num_workers worker processes."""
    from tqdm.auto import tqdm

    num = len(images_out)
    keep = records_out is not None
    ranges = [(lo, min(lo + chunk_size, num)) for lo in range(0, num, chunk_size)]
    tasks = chunk_tasks(ranges, resolution, contour_length, seed, keep)
    bar = tqdm(
        total=num, desc=f"pathfinder {resolution}x{resolution}", unit="img", disable=not progress
    )
    records_by_start = {}

    def store(result):
        start, images, labels, records = result
        images_out[start : start + len(images)] = images
        labels_out[start : start + len(labels)] = labels
        records_by_start[start] = records
        bar.update(len(images))

    try:
        run_chunks(tasks, num_workers, store)
    finally:
        bar.close()
    if keep:
        for start in sorted(records_by_start):
            records_out.extend(records_by_start[start])


def generate_pathfinder(
    num: int,
    resolution: int = 128,
    contour_length: int = 14,
    seed: int = 0,
    *,
    num_workers: int | None = None,
    progress: bool = False,
    return_records: bool = False,
):
    """Generate `num` Pathfinder images.

    num_workers: None or 1 (the default) generates in this process, so the call works anywhere,
    a script's top level included; N > 1 uses N worker processes, each of which imports the
    calling script (put the call under `if __name__ == "__main__":`, as for a DataLoader).

    Returns (images, labels): uint8 (num, resolution, resolution) and int64 (num,) of 0/1, each
    pair of consecutive images holding one of each label (so an even num is exactly balanced). With
    return_records=True also a list of PathfinderRecord (the contours and markers drawn).
    """
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    images = np.empty((num, resolution, resolution), dtype=np.uint8)
    labels = np.empty((num,), dtype=np.int64)
    records: list | None = [] if return_records else None
    generate_pathfinder_into(
        images,
        labels,
        resolution,
        contour_length,
        seed,
        num_workers=num_workers,
        progress=progress,
        records_out=records,
    )
    if return_records:
        return images, labels, records
    return images, labels
