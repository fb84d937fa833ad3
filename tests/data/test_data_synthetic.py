"""The built-in associative-recall task: answers are recoverable from enough context only."""

import itertools
import math

import numpy as np
import pytest
import torch

from flashtrain.data import build_data
from flashtrain.data.synthetic import recall_optimal_loss

KEYS, VALUES = 32, 32


def make(seq_len=256, batch=64, rank=0, world_size=1, eval_batches=4, **cfg):
    config = {"loader": "synthetic", "num_keys": KEYS, "num_values": VALUES, "vocab_size": 64}
    return build_data(
        config | cfg,
        seq_len=seq_len,
        micro_batch_size=batch,
        seed=5,
        rank=rank,
        world_size=world_size,
        eval_batches=eval_batches,
    )


def recall_oracle(input_ids: np.ndarray, window: int):
    """Predict each value from the most recent earlier pair with the same key, looking back at
    most `window` tokens. Returns (predictions, known) at every input position holding a key."""
    predictions, known = {}, {}
    for t in range(0, len(input_ids) - 1, 2):  # keys sit at even positions
        key = input_ids[t]
        earlier = [s for s in range(max(0, t - window), t, 2) if input_ids[s] == key]
        known[t] = bool(earlier)
        predictions[t] = input_ids[earlier[-1] + 1] if earlier else None
    return predictions, known


def test_batches_layout_and_value_only_labels():
    batch = next(make().train_batches())
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    assert ids.shape == labels.shape == (64, 256) and batch["input_ids"].dtype == torch.int64
    assert (ids[:, 0::2] < KEYS).all() and (ids[:, 1::2] >= KEYS).all()
    assert (labels[:, 1::2] == -100).all()  # next token is a key: noise, not scored
    assert (labels[:, 0::2] == ids[:, 1::2]).all()  # next token is the key's value


def test_full_context_recovers_every_value_whose_key_appeared_before():
    ids = next(make().train_batches())["input_ids"].numpy()
    hits, recoverable, total = 0, 0, 0
    for row in ids:
        predictions, known = recall_oracle(row, window=len(row))
        for t, is_known in known.items():
            total += 1
            if is_known:
                recoverable += 1
                hits += predictions[t] == row[t + 1]
    assert hits == recoverable  # the table is consistent within a sequence
    # The recoverable share matches the closed form behind recall_optimal_loss.
    expected = 1 - recall_optimal_loss(255, KEYS, VALUES) / math.log(VALUES)
    assert abs(recoverable / total - expected) < 0.03


def test_a_short_window_cannot_recover_the_values():
    ids = next(make().train_batches())["input_ids"].numpy()
    short = np.mean([np.mean(list(recall_oracle(r, window=4)[1].values())) for r in ids])
    full = np.mean([np.mean(list(recall_oracle(r, window=len(r))[1].values())) for r in ids])
    assert short < 0.1 < 0.7 < full
    # Values are not predictable without their earlier pair: first occurrences are uniform.
    firsts = []
    for row in ids:
        seen = set()
        for t in range(0, len(row) - 1, 2):
            if row[t] not in seen:
                seen.add(row[t])
                firsts.append(row[t + 1])
    counts = np.bincount(np.asarray(firsts) - KEYS, minlength=VALUES)
    assert counts.max() < 3 * len(firsts) / VALUES


def test_more_context_gives_lower_optimal_loss():
    losses = [recall_optimal_loss(n, 128, 128) for n in (64, 256, 1024, 4096, 16384)]
    assert all(a > b for a, b in zip(losses, losses[1:]))
    assert abs(losses[0] - math.log(128) * np.mean((1 - 1 / 128) ** np.arange(32))) < 1e-12


def test_loss_bounds_name_the_no_context_floor_and_the_optimum():
    bounds = list(make().loss_bounds().values())
    assert bounds[0] == pytest.approx(math.log(VALUES))
    assert bounds[1] == pytest.approx(make().optimal_loss()) and bounds[1] < bounds[0]


@pytest.mark.parametrize(
    ("fraction", "words"),
    [
        (0.0, "does not use its context"),
        (0.05, "does not use its context"),
        (0.5, "uses its context"),
        (1.0, "uses its context"),
    ],
)
def test_the_verdict_places_the_loss_between_floor_and_optimum(fraction, words):
    data = make()
    floor, best = math.log(VALUES), data.optimal_loss()
    verdict = data.loss_verdict(floor - fraction * (floor - best))
    assert words in verdict and f"reached {fraction:.0%} of the way" in verdict
    assert (
        f"floor is {floor:.3f}" in verdict
        and f"best possible at seq_len 256 is {best:.3f}" in verdict
    )


@pytest.mark.parametrize("seq_len", [3, 256])
def test_the_verdict_never_gives_a_share_below_0_or_above_100(seq_len):
    """At seq_len 3 the gap between floor and optimum is log(V) / (2 K) = 0.054 nats, and an
    early loss just above the floor read "reached -442% of the way"."""
    data = make(seq_len=seq_len)
    floor, best = math.log(VALUES), data.optimal_loss()
    above = data.loss_verdict(floor + 0.2)
    assert "%" not in above and f"{floor + 0.2:.3f} is above the no-context floor" in above
    assert "does not use its context" in above
    below = data.loss_verdict(best - 0.01)  # noise past the optimum
    assert "reached 100% of the way" in below and "uses its context" in below


def test_ranks_split_the_global_stream_and_resume_is_exact():
    whole = next(make(batch=4).train_batches())["input_ids"]
    parts = [
        next(make(batch=2, rank=r, world_size=2).train_batches())["input_ids"] for r in range(2)
    ]
    assert torch.equal(torch.cat(parts), whole)
    module = make(batch=4)
    stream = module.train_batches()
    list(itertools.islice(stream, 3))
    state = module.state_dict()
    expected = next(stream)
    resumed = make(batch=4)
    resumed.load_state_dict(state)
    assert torch.equal(next(resumed.train_batches())["input_ids"], expected["input_ids"])
    val = [b["input_ids"] for b in module.val_batches()]
    assert len(val) == 4 and sum(len(v) for v in val) == 16  # eval_batches x micro-batch
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(val, module.val_batches()))


def test_validation_size_is_the_trainers_eval_batches():
    """eval_batches batches per rank, the ranks' shares disjoint; generated data needs a number."""
    shares = [make(batch=2, rank=r, world_size=2, eval_batches=3).val_batches() for r in range(2)]
    rows = [tuple(row.tolist()) for share in shares for b in share for row in b["input_ids"]]
    assert [len(share) for share in shares] == [3, 3] and len(set(rows)) == 12
    with pytest.raises(ValueError, match="set trainer.eval_batches"):
        make(eval_batches=None)
