"""The evaluation grid: tasks x lengths x depths, so many samples per cell, scored by an
Answerer. Used by scripts/evaluate.py --tasks (all of a cell's samples in one process) and by
the trainer (each rank its share of every cell, the sums reduced across ranks).

    spec = GridSpec(["passkey"], parse_lengths("1k,4k"), parse_depths("0:1:11"), samples=4)
    cells = run_grid(spec, SampleMaker(encoder), LikelihoodAnswerer(model))
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flashtrain.data.retrieval.registry import has_depth

_LENGTH = re.compile(r"^(\d+)([kKmM]?)$")


def parse_lengths(text: str | Sequence) -> list[int]:
    """ "1k,4k,16k" (k = 1024 tokens, m = 1024k) or integers -> sorted distinct token counts."""
    items = text.split(",") if isinstance(text, str) else list(text)
    lengths = []
    for item in (i for i in items if str(i).strip()):
        match = _LENGTH.match(str(item).strip())
        if match is None or int(match.group(1)) < 1:
            raise ValueError(
                f"length {str(item).strip()!r} is not a token count: give integers >= 1 or "
                "k / m multiples (1k = 1024, 1m = 1048576), e.g. 1k,4k,16k"
            )
        scale = {"": 1, "k": 1024, "m": 1024**2}[match.group(2).lower()]
        lengths.append(int(match.group(1)) * scale)
    if not lengths:
        raise ValueError("no length given: e.g. 1k,4k,16k")
    return sorted(set(lengths))


def parse_depths(text: str | Sequence) -> list[float]:
    """ "START:STOP:COUNT" (COUNT evenly spaced depths, both ends included: 0:1:11 is 0, 0.1, ...
    1) or a list "0,0.5,1" -> sorted depths in [0, 1] (0: the context's start, 1: its end)."""
    if isinstance(text, str) and ":" in text:
        parts = text.split(":")
        try:
            start, stop, count = float(parts[0]), float(parts[1]), int(parts[2])
            assert len(parts) == 3 and count >= 1
        except (ValueError, AssertionError, IndexError):
            raise ValueError(
                f"depths {text!r}: give START:STOP:COUNT (e.g. 0:1:11) or a list (0,0.5,1)"
            ) from None
        depths = [start + (stop - start) * i / max(count - 1, 1) for i in range(count)]
    else:
        items = text.split(",") if isinstance(text, str) else list(text)
        try:
            depths = [float(d) for d in items if str(d).strip()]
        except ValueError:
            raise ValueError(
                f"depths {text!r}: give START:STOP:COUNT (e.g. 0:1:11) or a list (0,0.5,1)"
            ) from None
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad or not depths:
        raise ValueError(f"depths must lie in [0, 1] (0: the start, 1: the end), got {depths}")
    return sorted({round(d, 6) for d in depths})


@dataclass(frozen=True)
class GridSpec:
    tasks: list[str]
    lengths: list[int]
    depths: list[float]
    samples: int  # per (task, length, depth) cell

    def cells(self) -> list[tuple[str, int, float | None]]:
        return [
            (task, length, depth)
            for task in self.tasks
            for length in self.lengths
            for depth in (self.depths if has_depth(task) else [None])
        ]


def grid_tokens(spec: GridSpec) -> int:
    """Tokens the grid feeds the model (each sample is its length): the cost to budget."""
    return sum(length * spec.samples for _, length, _ in spec.cells())


@dataclass
class CellResult:
    """A cell's totals: samples scored, correct (the sum of the samples' scores), logprob
    and answer_tokens (sums, likelihood scoring), seconds (this process's)."""

    task: str
    length: int
    depth: float | None
    samples: int = 0
    correct: float = 0.0
    logprob: float = 0.0
    answer_tokens: int = 0
    seconds: float = 0.0

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.samples if self.samples else None

    @property
    def logprob_per_token(self) -> float | None:
        return self.logprob / self.answer_tokens if self.answer_tokens else None


def run_grid(
    spec: GridSpec,
    maker,
    answerer,
    *,
    rank: int = 0,
    world_size: int = 1,
    reduce: Callable[[list[float]], list[float]] | None = None,
    on_samples: Callable[[int], None] | None = None,
) -> list[CellResult]:
    """Every cell of the grid: this rank scores samples rank, rank + world_size, ...; reduce
    (sums across ranks, the trainer's all-reduce) makes the totals the whole cell's.
    on_samples(n) after each cell's share (progress)."""
    cells = []
    for task, length, depth in spec.cells():
        start = time.perf_counter()
        share = maker.samples(task, length, depth, range(rank, spec.samples, world_size))
        cell = CellResult(task, length, depth)
        for score in answerer.answer(share) if share else []:
            cell.samples += 1
            cell.correct += score.correct
            if score.logprob is not None:
                cell.logprob += score.logprob
                cell.answer_tokens += score.answer_tokens
        cell.seconds = time.perf_counter() - start
        if on_samples is not None:
            on_samples(len(share))
        cells.append(cell)
    if reduce is not None:
        sums = reduce(
            [v for c in cells for v in (c.samples, c.correct, c.logprob, c.answer_tokens)]
        )
        for i, cell in enumerate(cells):
            samples, correct, logprob, tokens = sums[4 * i : 4 * i + 4]
            cell.samples, cell.correct = int(round(samples)), correct
            cell.logprob, cell.answer_tokens = logprob, int(round(tokens))
    return cells
