"""Task names, groups, and the seeded samples of one grid cell.

    names = resolve_tasks("needle,passkey,ruler")       # groups expand, order kept
    maker = SampleMaker(SegmentEncoder(tokenizer), seed=0)
    samples = maker.samples("passkey", length=4096, depth=0.5, indices=range(8))

Sample i of a (task, length, depth) cell comes from its own generator, seeded by the seed and
those four, so any share of a cell (a rank's) is the same samples as in the whole cell.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np

from flashtrain.data.retrieval.families import FAMILIES
from flashtrain.data.retrieval.filler import make_filler
from flashtrain.data.retrieval.sample import RetrievalSample, assemble, fixed_tokens

TASKS = tuple(FAMILIES)
TASK_GROUPS = {
    "ruler": (
        "niah_single",
        "niah_multikey",
        "niah_multivalue",
        "niah_multiquery",
        "variable_tracking",
        "common_words",
        "frequent_words",
    ),
    "all": TASKS,
}


def resolve_tasks(names: str | Iterable[str]) -> list[str]:
    """Task names from "a,b" or a list of names and groups (ruler, all): each once, in order."""
    if isinstance(names, str):
        names = names.split(",")
    out: list[str] = []
    for raw in names:
        name = str(raw).strip()
        if not name:
            continue
        if name not in FAMILIES and name not in TASK_GROUPS:
            raise ValueError(
                f"unknown retrieval task {name!r}: the tasks are {', '.join(TASKS)}; the groups "
                f"{', '.join(f'{g} ({len(m)} tasks)' for g, m in TASK_GROUPS.items())}"
            )
        out += [n for n in TASK_GROUPS.get(name, (name,)) if n not in out]
    if not out:
        raise ValueError(f"no retrieval task named: give some of {', '.join(TASKS)}, or ruler")
    return out


def has_depth(task: str) -> bool:
    return FAMILIES[task].has_depth


def sample_seed(seed: int, task: str, length: int, depth: float | None, index: int):
    depth_key = 0 if depth is None else 1 + round(depth * 1_000_000)
    return np.random.SeedSequence(
        seed, spawn_key=(zlib.crc32(task.encode()), length, depth_key, index)
    )


class SampleMaker:
    """Samples for a tokenizer (SegmentEncoder): the filler streams are read and tokenized once.
    filler_files: text files for the real-text haystacks (None: pysrc)."""

    def __init__(self, encoder, seed: int = 0, filler_files: list[str] | None = None):
        self.encoder, self.seed, self.filler_files = encoder, seed, filler_files
        self._fillers: dict[str, object] = {}

    def filler(self, kind: str):
        if kind not in self._fillers:
            self._fillers[kind] = make_filler(kind, self.encoder, self.filler_files)
        return self._fillers[kind]

    def samples(
        self, task: str, length: int, depth: float | None, indices: Iterable[int]
    ) -> list[RetrievalSample]:
        family = FAMILIES[task]
        if not family.has_depth:
            depth = None
        elif depth is None or not 0.0 <= depth <= 1.0:
            raise ValueError(f"task {task}: a depth in [0, 1] is needed, got {depth}")
        fixed = lambda parts: fixed_tokens(parts, self.encoder)
        out = []
        for i in indices:
            rng = np.random.default_rng(sample_seed(self.seed, task, length, depth, i))
            parts = family.build(rng, 0.0 if depth is None else depth, length, fixed)
            out.append(
                assemble(task, parts, depth, length, self.encoder, self.filler(family.filler), rng)
            )
        return out
