"""BERT's masked-LM corruption: choose 15% of the real tokens; of those, 80% become [MASK], 10% a
random token and 10% stay as they are; the model predicts the original token at each of them."""

from __future__ import annotations

import numpy as np

from flashtrain.data.module import IGNORE_INDEX


def mask_tokens(
    input_ids: np.ndarray,
    maskable: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_id: int,
    random_ids: np.ndarray,
    mask_prob: float = 0.15,
    max_predictions: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Corrupt input_ids (B, T) at exactly max(1, round(mask_prob * n)) maskable positions per row
    (n = maskable tokens in the row; capped at max_predictions), as BERT's data generator does.

    maskable (B, T) bool: False for padding and special tokens, which are never chosen.
    random_ids: the ids a "random token" is drawn from (the vocabulary minus special tokens).
    Returns (corrupted ids (B, T), labels (B, T): the original id where chosen, else -100).
    """
    batch, length = input_ids.shape
    real = maskable.sum(axis=1)
    count = np.minimum(np.maximum(1, np.rint(real * mask_prob)).astype(np.int64), real)
    if max_predictions is not None:
        count = np.minimum(count, max_predictions)
    # A uniformly random subset of `count` maskable positions: the smallest random scores.
    scores = np.where(maskable, rng.random((batch, length)), np.inf)
    order = np.argsort(scores, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(length)[None, :].repeat(batch, axis=0), axis=1)
    chosen = (rank < count[:, None]) & maskable

    labels = np.where(chosen, input_ids, IGNORE_INDEX)
    action = rng.random((batch, length))
    corrupted = input_ids.copy()
    corrupted[chosen & (action < 0.8)] = mask_id
    randomize = chosen & (action >= 0.8) & (action < 0.9)
    corrupted[randomize] = random_ids[rng.integers(len(random_ids), size=int(randomize.sum()))]
    return corrupted, labels
