"""Scoring retrieval samples: a model answers, each sample gets a SampleScore.

Both ways are greedy. LikelihoodAnswerer (here; the trainer's) scores the reference answer's
tokens in one teacher-forced pass (flashtrain.models.likelihood): correct when greedy decoding
would produce exactly them, with their log-probability; no generation, so fast.
GeneratingAnswerer (flashtrain.inference.task_answers) decodes the answer with the KV cache
and counts the reference strings found in the text (match_score: RULER's string match, each
of several answers its share).

An Answerer is anything with answer(samples) -> [SampleScore]; the tests plant answerers
that are always right, always wrong, or right in the first half of the context only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from flashtrain.data.retrieval.sample import RetrievalSample
from flashtrain.models.likelihood import continuation_scores

SCORES = ("generate", "likelihood")


@dataclass(frozen=True)
class SampleScore:
    """correct in [0, 1] (the share of the answers found); logprob: the reference answer's
    log-probability in nats (likelihood scoring), answer_tokens its token count; output: the
    generated text (generate scoring)."""

    correct: float
    logprob: float | None = None
    answer_tokens: int = 0
    output: str | None = None


class Answerer(Protocol):
    def answer(self, samples: list[RetrievalSample]) -> list[SampleScore]: ...


def match_score(text: str, answers: tuple[str, ...]) -> float:
    """The share of answers that occur in text, case aside: RULER's string_match_all (a model
    that goes on past the key, " 860248602", has still written it; the decoding stops a few
    tokens past the reference's length, so a key met by chance in a longer number is rare)."""
    found = sum(a.lower() in text.lower() for a in answers)
    return found / len(answers)


class LikelihoodAnswerer:
    """A decoder's greedy answer judged in one pass: batch_size samples per forward pass."""

    def __init__(self, model, batch_size: int = 4):
        self.model, self.batch_size = model, batch_size

    def answer(self, samples: list[RetrievalSample]) -> list[SampleScore]:
        scores = continuation_scores(
            self.model,
            [s.prompt for s in samples],
            [s.answer_ids for s in samples],
            batch_size=self.batch_size,
        )
        return [
            SampleScore(float(c.greedy), c.logprob, len(s.answer_ids))
            for s, c in zip(samples, scores)
        ]
