"""Retrieval answers by generation: greedy decoding with the KV cache (generate.py), the text
after each prompt checked for the reference strings (flashtrain.tasks.scoring.match_score)."""

from __future__ import annotations

from flashtrain.data.retrieval.sample import RetrievalSample
from flashtrain.inference.generate import Sampling, generate
from flashtrain.inference.run_tokenizer import decode_continuation
from flashtrain.models.decoder import position_limit
from flashtrain.tasks.scoring import SampleScore, match_score

EXTRA_NEW_TOKENS = 4  # decoded past the reference's length: room for another tokenization


class GeneratingAnswerer:
    """A decoder answering in text: batch_size prompts per generate() call; encoder: the
    task's SegmentEncoder (it decodes)."""

    def __init__(self, model, encoder, batch_size: int = 4):
        self.model, self.encoder, self.batch_size = model, encoder, batch_size

    def answer(self, samples: list[RetrievalSample]) -> list[SampleScore]:
        out: list[SampleScore] = []
        for start in range(0, len(samples), self.batch_size):
            out += self._batch(samples[start : start + self.batch_size])
        return out

    def _batch(self, samples: list[RetrievalSample]) -> list[SampleScore]:
        new = max(len(s.answer_ids) for s in samples) + EXTRA_NEW_TOKENS
        limit = position_limit(self.model)
        if limit is not None:  # the answer itself always fits: prompt + answer = the length
            new = max(1, min(new, limit - max(len(s.prompt) for s in samples) + 1))
        outputs = generate(self.model, [s.prompt for s in samples], new, Sampling(temperature=0.0))
        scores = []
        for s, ids in zip(samples, outputs):
            ids = ids[: len(s.answer_ids) + EXTRA_NEW_TOKENS]
            text = decode_continuation(self.encoder, s.prompt, ids)
            scores.append(SampleScore(match_score(text, s.answers), output=text))
        return scores
