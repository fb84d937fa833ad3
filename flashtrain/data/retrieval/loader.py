"""Retrieval-shaped training data: every window is one sample of a retrieval task
(flashtrain/data/retrieval: a passkey in noise, a needle in real text, ...) of exactly seq_len + 1
bytes, its needle at a uniformly drawn depth, generated from the seed (nothing cached). What a
model must learn to lower its loss is to find the needle and copy it: the task the
evaluations then measure, at the trained length and beyond.

A window's sample is of a length drawn uniformly from half the window to all of it, the rest
<pad> after it (never attended: causal; never scored): a model trained on one length only
learns where that length puts the question, not where the needle is.
loss_on=answers scores only the answer's tokens: the rest (the filler, the instructions, the
needle's own first occurrence) is text to read, not to learn; all scores every next token.
"""

from __future__ import annotations

import numpy as np
import torch

from flashtrain.data.config import RetrievalConfig
from flashtrain.data.generated import TRAIN_STREAM, VAL_STREAM, GeneratedLM
from flashtrain.data.module import IGNORE_INDEX, DataRun
from flashtrain.data.retrieval.registry import SampleMaker
from flashtrain.data.retrieval.text import SegmentEncoder
from flashtrain.data.tokenization import ByteTokenizer


class RetrievalLM(GeneratedLM):
    Config = RetrievalConfig

    def __init__(self, cfg: RetrievalConfig, run: DataRun):
        super().__init__(run, "retrieval")
        self.tokenizer = ByteTokenizer(cfg.tokenizer)
        self.vocab_size, self.tasks, self.loss_on = cfg.vocab_size, list(cfg.tasks), cfg.loss_on
        encoder = SegmentEncoder(self.tokenizer)
        # one maker per stream: training and validation samples never coincide
        self.makers = [
            SampleMaker(encoder, seed=self.seed * 2 + s) for s in (TRAIN_STREAM, VAL_STREAM)
        ]
        for task in self.tasks:  # a seq_len too short for a task: refused at start
            self.makers[TRAIN_STREAM].samples(task, self.seq_len + 1, 0.0, [0])
        self.least = {task: self._least(task) for task in self.tasks}

    def _least(self, task: str) -> int:
        """The shortest sample drawn: half the window, or the task's own least if longer."""
        window, length = self.seq_len + 1, (self.seq_len + 1) // 2
        while length < window:
            try:
                self.makers[TRAIN_STREAM].samples(task, length, 0.0, [0])
                return length
            except ValueError:  # too short for the task's instructions, needle and question
                length += max(1, (window - length) // 8)
        return window

    def row(self, stream: int, index: int) -> tuple[list[int], int]:
        """Window `index` of a stream's sample: (its ids, where its answer starts)."""
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(stream, index)))
        task = self.tasks[int(rng.integers(len(self.tasks)))]
        depth = float(rng.uniform(0.0, 1.0))
        length = int(rng.integers(self.least[task], self.seq_len + 2))
        (sample,) = self.makers[stream].samples(task, length, depth, [index])
        return [*sample.prompt, *sample.answer_ids], len(sample.prompt)

    def batch(self, stream: int, indices) -> dict[str, torch.Tensor]:
        rows = [self.row(stream, int(i)) for i in indices]
        # (B, T + 1): each sample, then <pad>
        ids = torch.full((len(rows), self.seq_len + 1), self.tokenizer.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), self.seq_len), IGNORE_INDEX, dtype=torch.long)
        for b, (row, answer_start) in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            first = answer_start - 1 if self.loss_on == "answers" else 0  # label t is token t + 1
            labels[b, first : len(row) - 1] = ids[b, first + 1 : len(row)]
        return {"input_ids": ids[:, :-1].contiguous(), "labels": labels}

    def identity_fields(self) -> dict:
        return {"data.tasks": self.tasks, "data.loss_on": self.loss_on}
