"""The haystacks: token streams a prompt's filler is cut from.

NoiseFiller: the passkey paper's repeated sentences (Mohtashami & Jaggi 2023), which carry no
information, so the needle is the only thing to find. TextFiller: real text, read once and
tokenized once per tokenizer: this Python's standard library (pysrc, the project's own
corpus: every machine has it, no download) or text files the user names; each sample cuts its
own stretch at a seeded offset, so samples differ.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


class NoiseFiller:
    name = "noise"

    def __init__(self, encoder):
        self._unit = encoder.encode(" " + NOISE)
        # where a sentence starts: the token after one whose text ends a sentence
        self._starts = [0] + [
            i for i in range(1, len(self._unit)) if encoder.decode(self._unit[:i]).endswith(".")
        ]

    def tokens(self, count: int, rng: np.random.Generator) -> list[int]:
        """count ids of the sentences repeated, from a seeded one of them: where the filler meets
        the question differs between samples, so that nothing but the needle tells a model
        where the answer is."""
        start = self._starts[int(rng.integers(len(self._starts)))]
        repeats = -(-(start + count) // len(self._unit))
        return (self._unit * repeats)[start : start + count]


class TextFiller:
    """files: text files (globs allowed), or None for pysrc (the standard library's .py files,
    in a fixed order). Read until the stream holds `need` tokens (more are read on demand)."""

    def __init__(self, encoder, files: list[str] | None = None):
        self._encoder = encoder
        self.name = "pysrc" if files is None else "files"
        self._paths = iter(_source_paths(files))
        self._stream: list[int] = []

    def _grow(self, need: int) -> None:
        while len(self._stream) < need:
            path = next(self._paths, None)
            if path is None:
                if not self._stream:
                    raise ValueError(f"the filler text ({self.name}) has no text to cut from")
                self._stream = self._stream * 2  # short files: the text again (as RULER does)
                continue
            text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
            if text:
                self._stream += self._encoder.encode("\n" + text + "\n")

    def tokens(self, count: int, rng: np.random.Generator) -> list[int]:
        """count consecutive ids of the stream from a seeded offset."""
        self._grow(2 * count + 1)  # so that offsets vary at every length
        start = int(rng.integers(0, len(self._stream) - count + 1))
        return self._stream[start : start + count]


def _source_paths(files: list[str] | None) -> list[str]:
    if files is None:
        from flashtrain.data.pysrc import source_files, stdlib_root

        root = stdlib_root()
        return [str(root / f.path) for f in source_files(root)]
    paths = sorted({p for pattern in files for p in glob.glob(str(pattern), recursive=True)})
    paths = [p for p in paths if Path(p).is_file()]
    if not paths:
        raise ValueError(
            f"the filler files {list(files)} match no file: name text files (globs allowed)"
        )
    return paths


def make_filler(kind: str, encoder, files: list[str] | None = None):
    """kind noise | text (files, or pysrc when None)."""
    return NoiseFiller(encoder) if kind == "noise" else TextFiller(encoder, files)
