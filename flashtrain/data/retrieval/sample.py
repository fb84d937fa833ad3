"""One retrieval sample: a prompt of an exact token count with its needles at chosen depths.

A sample of length L is its prompt and its reference answer together: L tokens, the context
the model has seen when it predicts the answer's last token, so a model that takes L positions
(its learned table, its training length) answers within them. The prompt is, in tokens,

    prefix (the tokenizer's <bos>, if any) + head (instructions) + haystack + question

and the haystack is filler with the needles inserted: needle i at depth d_i sits after
round(d_i * F) of the F filler tokens. Depth 0 puts it right after the instructions, depth 1
right before the question. Only the filler is cut to fit; a length too short for the rest is
refused naming the least that fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TaskParts:
    """What a task family writes for one sample, before tokenization and fitting. answer: the
    reference completion (" 71432"); answers: what a generated text must contain, every one
    (several for multi-value, multi-query, variable tracking, word counts)."""

    head: str
    needles: tuple[str, ...]
    depths: tuple[float, ...]  # one per needle, in [0, 1]
    question: str
    answer: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class RetrievalSample:
    """task, length (prompt + answer tokens), depth (of the needle asked about; None for the
    tasks without one), prompt and answer_ids (token ids: len(prompt) + len(answer_ids) ==
    length), answers (normalized strings a generated answer must hold), needle_spans ([start,
    end) token offsets of each needle in the prompt)."""

    task: str
    length: int
    depth: float | None
    prompt: list[int]
    answer_ids: list[int]
    answers: tuple[str, ...]
    needle_spans: tuple[tuple[int, int], ...]


def fixed_tokens(parts: TaskParts, encoder) -> int:
    """Tokens of everything but the filler: prefix, head, needles, question, answer."""
    pieces = (parts.head, *parts.needles, parts.question, parts.answer)
    return len(encoder.prefix) + sum(len(encoder.encode(p)) for p in pieces)


def assemble(
    task: str,
    parts: TaskParts,
    depth: float | None,
    length: int,
    encoder,
    filler,
    rng: np.random.Generator,
) -> RetrievalSample:
    """The sample of exactly `length` tokens: filler cut to the room the other pieces leave."""
    room = length - fixed_tokens(parts, encoder)
    if room < 0:
        raise ValueError(
            f"task {task} needs at least {length - room} tokens with this tokenizer "
            f"(instructions, needles, question and answer), more than the length {length}: "
            f"ask for {length - room} or more"
        )
    hay = filler.tokens(room, rng)
    cuts = [round(d * room) for d in parts.depths]
    order = sorted(range(len(cuts)), key=lambda i: (cuts[i], i))
    prompt = [*encoder.prefix, *encoder.encode(parts.head)]
    spans: list[tuple[int, int] | None] = [None] * len(cuts)
    taken = 0
    for i in order:
        prompt += hay[taken : cuts[i]]
        taken = cuts[i]
        needle = encoder.encode(parts.needles[i])
        spans[i] = (len(prompt), len(prompt) + len(needle))
        prompt += needle
    prompt += hay[taken:] + encoder.encode(parts.question)
    answer_ids = encoder.encode(parts.answer)
    assert len(prompt) + len(answer_ids) == length, (len(prompt), len(answer_ids), length)
    return RetrievalSample(
        task=task,
        length=length,
        depth=depth,
        prompt=prompt,
        answer_ids=answer_ids,
        answers=tuple(encoder.normalized(a) for a in parts.answers),
        needle_spans=tuple(spans),  # type: ignore[arg-type]
    )
