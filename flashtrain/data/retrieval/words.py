"""Seeded random content for the needles: numbers, pronounceable pseudo-words, variable names.
Generated rather than drawn from a word list (nothing to download, no list to ship), and
pseudo-words carry no meaning a model could guess them from."""

from __future__ import annotations

import numpy as np

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def number(rng: np.random.Generator, digits: int) -> str:
    """A number of exactly `digits` digits (no leading zero)."""
    return str(int(rng.integers(10 ** (digits - 1), 10**digits)))


def pseudo_word(rng: np.random.Generator, syllables: int = 3) -> str:
    return "".join(
        _CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
        for _ in range(syllables)
    )


def distinct(make, count: int, rng: np.random.Generator) -> list[str]:
    """count different values of make(rng), in the order drawn."""
    seen: dict[str, None] = {}
    for _ in range(100 * count + 100):
        seen.setdefault(make(rng))
        if len(seen) == count:
            return list(seen)
    raise ValueError(f"could not draw {count} distinct values")


def variable_name(rng: np.random.Generator) -> str:
    return "".join(_LETTERS[i] for i in rng.integers(len(_LETTERS), size=5))
