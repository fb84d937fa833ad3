"""The recall measurement: its prompts and answers are right, and the default run's model
recalls more often than chance (slow: the default run trains for about two minutes)."""

import json
from collections import Counter

import numpy as np
import pytest
from inference_testing import train

from flashtrain.checkpoint import load_model
from flashtrain.inference.recall import (
    main,
    modal_score,
    most_frequent_values,
    recall_accuracy,
    recall_prompts,
)


def test_prompts_end_in_a_seen_key_and_answers_are_its_value():
    for not_modal in (False, True):
        prompts, answers = recall_prompts(50, 64, 8, 8, seed=3, not_modal=not_modal)
        assert len({len(p) for p in prompts}) > 1  # different lengths in one batch
        for prompt, answer in zip(prompts, answers):
            tokens = np.array(prompt)
            assert len(prompt) % 2 == 1 and 32 <= len(prompt) <= 64
            earlier = np.flatnonzero(tokens[0:-1:2] == tokens[-1])
            assert earlier.size and all(tokens[2 * i + 1] == answer for i in earlier)
            assert 8 <= answer < 16
            counts = Counter(prompt[1::2])  # the answer is not a most frequent value
            assert not not_modal or counts[answer] < max(counts.values())


def test_modal_baseline_scores_a_most_frequent_value_and_splits_ties():
    # values 9 9 12 12 10: 9 and 12 tie; the answers 9, 12, 10 score 1/2, 1/2, 0
    prompt = [0, 9, 1, 9, 2, 12, 3, 12, 4, 10, 0]
    assert most_frequent_values(prompt) == {9, 12}
    assert [modal_score(prompt, a) for a in (9, 12, 10)] == [0.5, 0.5, 0.0]
    # on the task's own prompts the modal strategy is far above chance (about 30%)
    prompts, answers = recall_prompts(400, 128, 8, 8, seed=0)
    assert 0.25 < np.mean([modal_score(p, a) for p, a in zip(prompts, answers)]) < 0.36


def test_recall_command_on_a_trained_checkpoint(recall_run, capsys):
    assert main([str(recall_run), "--prompts", "16"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["chance"] == 0.125 and 0 < result["modal_baseline"] < 1
    assert result["prompts"] == result["not_modal_prompts"] == 16


@pytest.mark.slow
def test_the_default_run_against_chance_and_the_modal_baseline(tmp_path):
    """`python train.py` as a user types it (only the run folder and logger set), then 512
    prompts of each set. Measured (docs/inference.md): 29.1% right against 12.5% chance, but
    31.5% for answering the prompt's most frequent value on the same prompts, and 4.1% on prompts
    whose answer is not a most frequent value: the model predicts values from their frequency in
    the context, not by pairing keys with values. Asserted: above chance on all prompts, and the
    negative result on the others. If a change makes the default run recall, the second
    assertion fails: then update docs/inference.md and the README, which say it does not."""
    run = train(tmp_path / "default", tiny=False, timeout=1800)
    model, _ = load_model(run)
    result = recall_accuracy(model, 8, 8, 128, count=512)
    assert result["accuracy"] > 2 * result["chance"], result
    assert result["not_modal_accuracy"] < result["chance"], result
