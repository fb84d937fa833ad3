"""LM windows from a token cache: contiguous, next-token labels, rank shards, exact resume."""

import itertools

import numpy as np
import pytest
import torch
from data_testing import lm_config

from flashtrain.data import build_data
from flashtrain.data.lm_batches import lm_batch
from flashtrain.data.sampling import EpochSampler

SEQ, BATCH = 31, 4


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return lm_config(tmp_path_factory.mktemp("lm"))


def make(cfg, rank=0, world_size=1, seed=0, eval_batches=None):
    return build_data(
        cfg,
        seq_len=SEQ,
        micro_batch_size=BATCH,
        seed=seed,
        rank=rank,
        world_size=world_size,
        eval_batches=eval_batches,
    )


def take(module, count):
    return list(itertools.islice(module.train_batches(), count))


def test_batches_are_contiguous_windows_with_next_token_labels(cfg):
    module = make(cfg)
    tokens = np.asarray(module.train_tokens, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, SEQ + 1)
    for batch in take(module, 3):
        assert batch["input_ids"].shape == batch["labels"].shape == (BATCH, SEQ)
        assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
        rows = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()
        assert (batch["input_ids"][:, 1:] == batch["labels"][:, :-1]).all()
        for row in rows:  # every row is some window of the training tokens
            assert (windows == row).all(axis=1).any()
    assert (module.task, module.vocab_size, module.num_classes, module.eos_id) == (
        "lm",
        258,
        None,
        256,
    )


def test_one_epoch_covers_disjoint_windows(cfg):
    module = make(cfg)
    per_epoch = module.sampler.per_rank(0)
    epochs, items = module.sampler.take(per_epoch)
    assert (epochs == 0).all() and sorted(items) == list(range(per_epoch))
    assert module.sampler.state_dict()["epoch"] == 1  # the next take starts epoch 1


def test_ranks_read_disjoint_windows_in_lockstep(cfg):
    world = 3
    modules = [make(cfg, rank=r, world_size=world) for r in range(world)]
    per_rank = modules[0].sampler.per_rank(0)
    assert all(m.sampler.per_rank(0) == per_rank for m in modules)
    shares = [set(m.sampler.epoch_items(0).tolist()) for m in modules]
    assert all(a.isdisjoint(b) for a, b in itertools.combinations(shares, 2))
    rows = [tuple(r) for m in modules for b in take(m, 2) for r in b["input_ids"].tolist()]
    assert len(set(rows)) == len(rows)


def test_resume_continues_exactly_across_an_epoch_boundary(cfg):
    module = make(cfg)
    per_epoch_batches = module.sampler.per_rank(0) // BATCH + 1
    take(module, per_epoch_batches)  # ends inside epoch 1
    state = module.state_dict()
    expected = take(module, 3)
    resumed = make(cfg)
    resumed.load_state_dict(state)
    for a, b in zip(expected, take(resumed, 3)):
        assert torch.equal(a["input_ids"], b["input_ids"])
    assert state["sampler"]["epoch"] >= 1


def test_resume_with_another_world_size_is_refused(cfg):
    state = make(cfg).state_dict()
    with pytest.raises(ValueError, match="world_size"):
        make(cfg, rank=0, world_size=2).load_state_dict(state)


def test_epochs_reshuffle_and_shift_windows(cfg):
    module = make(cfg)
    assert not np.array_equal(
        module.sampler.epoch_items(0), module.sampler.epoch_items(1)[: module.sampler.per_rank(0)]
    )
    shifts = {module.shift(e) for e in range(8)}
    assert len(shifts) > 1 and all(0 <= s <= SEQ for s in shifts)


def test_validation_is_identical_each_call_and_split_across_ranks(cfg):
    module = make(cfg)
    first = [b["input_ids"] for b in module.val_batches()]
    second = [b["input_ids"] for b in module.val_batches()]
    assert len(first) == len(module.val_batches()) > 0
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    val = np.asarray(module.splits["validation"].tokens, dtype=np.int64)
    assert first[0][0].tolist() == val[:SEQ].tolist()  # windows start at the split's start
    shares = [
        {
            tuple(r)
            for b in make(cfg, rank=r, world_size=2).val_batches()
            for r in b["input_ids"].tolist()
        }
        for r in range(2)
    ]
    assert shares[0].isdisjoint(shares[1]) and len(shares[0]) == len(shares[1])
    capped = [b["input_ids"] for b in make(cfg, eval_batches=1).val_batches()]
    assert len(first) > 1 and len(capped) == 1 and torch.equal(capped[0], first[0])


def test_sampler_without_enough_items_for_every_rank_is_refused():
    with pytest.raises(ValueError, match="fewer than world_size"):
        EpochSampler(3, seed=0, rank=0, world_size=4)


@pytest.mark.parametrize("batch_rows", [1, 3])
def test_lm_batch_inputs_and_labels_own_their_memory(batch_rows):
    """A one-row slice is already contiguous: labels must still not be a view of the inputs, or
    masking a label in place would change the next input token."""
    rows = np.arange(batch_rows * 9, dtype=np.int32).reshape(batch_rows, 9)
    batch = lm_batch(rows)
    assert torch.equal(batch["input_ids"], torch.from_numpy(rows[:, :-1].astype(np.int64)))
    assert torch.equal(batch["labels"], torch.from_numpy(rows[:, 1:].astype(np.int64)))
    batch["labels"][:, 0] = -100
    assert torch.equal(batch["input_ids"], torch.from_numpy(rows[:, :-1].astype(np.int64)))
