"""The recall measurement: its prompts and answers are right, and the default run's model
recalls more often than chance (slow: the default run trains for about two minutes)."""

import numpy as np
import pytest
from inference_testing import train

from flashtrain.inference.checkpoint import load_for_inference
from flashtrain.inference.recall import main, recall_accuracy, recall_prompts


def test_prompts_end_in_a_seen_key_and_answers_are_its_value():
    prompts, answers = recall_prompts(50, 64, num_keys=8, num_values=8, seed=3)
    assert len({len(p) for p in prompts}) > 1  # different lengths in one batch
    for prompt, answer in zip(prompts, answers):
        tokens = np.array(prompt)
        assert len(prompt) % 2 == 1 and 32 <= len(prompt) <= 64
        earlier = np.flatnonzero(tokens[0:-1:2] == tokens[-1])
        assert earlier.size and all(tokens[2 * i + 1] == answer for i in earlier)
        assert 8 <= answer < 16


def test_recall_command_on_a_trained_checkpoint(recall_run, capsys):
    assert main([str(recall_run), "--prompts", "16"]) == 0
    assert '"chance": 0.125' in capsys.readouterr().out


@pytest.mark.slow
def test_the_default_run_recalls_more_often_than_chance(tmp_path):
    """`python train.py` as a user types it (only the run folder and logger set), then 512
    prompts; measured: 29% right against 12.5% chance (docs/inference.md)."""
    run = train(tmp_path / "default", tiny=False, timeout=900)
    loaded = load_for_inference(run)
    result = recall_accuracy(loaded.model, 8, 8, 128, count=512)
    assert result["accuracy"] > 2 * result["chance"], result
