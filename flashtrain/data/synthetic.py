"""The built-in long-range LM task (the default data): associative recall over a long sequence.

A sequence is key/value pairs k1 v1 k2 v2 ... with keys in [0, num_keys) and values in
[num_keys, num_keys + num_values). Each sequence draws its own random key -> value table, and its
keys uniformly with replacement, so a value can be predicted only by finding the same key earlier
in the context; nothing carries over between sequences. Keys themselves are unpredictable noise,
so by default only value positions are scored (loss_on: values).

With the whole sequence as context, the value of pair j is known when its key occurred among the
j earlier pairs, probability 1 - (1 - 1/num_keys)^j; otherwise the best guess costs
log(num_values). The best achievable loss therefore falls strictly as seq_len grows
(`recall_optimal_loss`): more context, lower loss, with no download.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from flashtrain.data.config import SyntheticConfig
from flashtrain.data.generated import GeneratedLM
from flashtrain.data.module import IGNORE_INDEX, DataRun


def recall_sequence(
    rng: np.random.Generator, length: int, num_keys: int, num_values: int
) -> np.ndarray:
    """(length,) int64 tokens: k v k v ... with a fresh key -> value table."""
    pairs = (length + 1) // 2
    table = num_keys + rng.integers(num_values, size=num_keys)
    keys = rng.integers(num_keys, size=pairs)
    tokens = np.empty(2 * pairs, dtype=np.int64)
    tokens[0::2], tokens[1::2] = keys, table[keys]
    return tokens[:length]


def recall_optimal_loss(seq_len: int, num_keys: int, num_values: int) -> float:
    """Expected loss (nats) per scored value of the best predictor that sees the whole window of
    seq_len inputs: log(num_values) times the chance that the value's key is new in the window."""
    pairs = (seq_len + 1) // 2  # values at label positions 0, 2, 4, ... < seq_len
    unseen = (1.0 - 1.0 / num_keys) ** np.arange(pairs)
    return float(math.log(num_values) * unseen.mean())


class AssociativeRecall(GeneratedLM):
    Config = SyntheticConfig  # its schema (configs/data/*.yaml with loader: synthetic)

    def __init__(self, cfg: SyntheticConfig, run: DataRun):
        super().__init__(run, "synthetic")
        self.num_keys, self.num_values = cfg.num_keys, cfg.num_values
        self.vocab_size, self.loss_on = cfg.vocab_size, cfg.loss_on

    def batch(self, stream: int, indices) -> dict[str, torch.Tensor]:
        """Sequences number `indices` of a stream: each from its own seeded generator, so the
        global sample order does not depend on how many ranks share it."""
        rows = np.stack(
            [
                recall_sequence(
                    np.random.default_rng(
                        np.random.SeedSequence(self.seed, spawn_key=(stream, int(i)))
                    ),
                    self.seq_len + 1,
                    self.num_keys,
                    self.num_values,
                )
                for i in indices
            ]
        )  # (B, T + 1)
        input_ids, labels = rows[:, :-1], rows[:, 1:].copy()
        if self.loss_on == "values":
            labels[labels < self.num_keys] = IGNORE_INDEX  # the next key is pure noise
        return {"input_ids": torch.from_numpy(input_ids.copy()), "labels": torch.from_numpy(labels)}

    def optimal_loss(self) -> float:
        return recall_optimal_loss(self.seq_len, self.num_keys, self.num_values)

    def loss_bounds(self) -> dict[str, float]:
        """Without recall a model can at best learn which tokens are values: log(num_values).
        Below that it is using the context; the optimum falls as seq_len grows."""
        return {
            "without using the context": math.log(self.num_values),
            f"best possible at seq_len {self.seq_len}": self.optimal_loss(),
        }

    def loss_verdict(self, eval_loss: float) -> str:
        """Where the eval loss lies between the no-context floor and the optimum, in words.
        The model counts as using its context once it closes a tenth of that gap."""
        floor, best = math.log(self.num_values), self.optimal_loss()
        if floor - best < 1e-12:  # seq_len <= 2: one pair, no earlier key to recall from
            return (
                f"eval/loss {eval_loss:.3f}: at seq_len {self.seq_len} no value has an earlier "
                f"pair to recall, so the best possible is the no-context floor {floor:.3f}; "
                f"use seq_len >= 3 to measure recall"
            )
        closed = (floor - eval_loss) / (floor - best)
        bounds = (
            f"the no-context floor is {floor:.3f}, the best possible at seq_len {self.seq_len} "
            f"is {best:.3f}"
        )
        if closed < 0:  # a share of the gap below 0 says nothing (the gap may be tiny: seq_len 3)
            return (
                f"eval/loss {eval_loss:.3f} is above the no-context floor ({bounds}): the model "
                f"does not use its context yet (train longer or larger)"
            )
        # past the optimum is evaluation noise: at most all of the way
        where = f"eval/loss {eval_loss:.3f}: {bounds}; reached {min(closed, 1.0):.0%} of the way"
        if closed >= 0.1:
            return (
                f"{where}: the model uses its context (at least how often each value occurs in "
                "it; whether it recalls each key's value: python -m flashtrain.inference.recall)"
            )
        return f"{where}: the model does not use its context yet (train longer or larger)"

    def identity_fields(self) -> dict:
        return {"data.num_keys": self.num_keys, "data.num_values": self.num_values}
