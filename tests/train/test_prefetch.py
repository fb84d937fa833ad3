"""The prefetch thread: the same batches in the same order as drawing them in the loop, the
stream position of the batches handed out (not of those prepared ahead), errors with their own
type, and a thread that close() ends."""

from __future__ import annotations

import copy

import pytest
import torch
from config_testing import compose
from train_testing import TINY

from flashtrain.data import build_data
from flashtrain.train.prefetch import StepPrefetcher


def _data():
    cfg = compose(TINY).data
    return build_data(cfg, seq_len=64, micro_batch_size=4, seed=3, eval_batches=2)


@pytest.mark.parametrize("depth", [0, 3])
def test_batches_and_positions_are_those_of_the_loop(depth):
    expected_data = _data()
    stream = iter(expected_data.train_batches())
    prefetcher = StepPrefetcher(_data(), grad_accum=2, depth=depth, pin_memory=False)
    try:
        for _ in range(4):
            step = prefetcher.next()
            expected = [next(stream) for _ in range(2)]
            for got, want in zip(step.batches, expected):
                assert all(torch.equal(got[k], want[k]) for k in want)
            assert step.targets == [int((b["labels"] != -100).sum()) for b in expected]
            assert step.data_state == copy.deepcopy(expected_data.state_dict())
    finally:
        prefetcher.close()
    assert prefetcher._thread is None


class _Broken:
    """A data module whose stream fails on its third batch."""

    def __init__(self, error):
        self.error, self.data = error, _data()

    def train_batches(self):
        for i, batch in enumerate(self.data.train_batches()):
            if i == 2:
                raise self.error
            yield batch

    def state_dict(self):
        return self.data.state_dict()


def test_an_error_in_the_thread_reaches_the_loop_with_its_type():
    prefetcher = StepPrefetcher(
        _Broken(FileNotFoundError("cache gone")), grad_accum=2, depth=2, pin_memory=False
    )
    try:
        prefetcher.next()
        with pytest.raises(FileNotFoundError, match="cache gone"):
            prefetcher.next()
    finally:
        prefetcher.close()


def test_close_ends_a_thread_blocked_on_a_full_queue():
    prefetcher = StepPrefetcher(_data(), grad_accum=1, depth=1, pin_memory=False)
    thread = prefetcher._thread
    prefetcher.next()
    prefetcher.close()
    assert not thread.is_alive()
