"""The end of a run loses no training: the checkpoint is written before anything that can still
fail (logging, evaluation), and validation data too small for one batch is refused at start, not
after the last step."""

from __future__ import annotations

import logging

import pytest
from config_testing import compose
from train_testing import TINY

import flashtrain.train.trainer as trainer_module
from flashtrain.checkpoint.read import find_checkpoints, verify_checkpoint
from flashtrain.train import main, run
from flashtrain.train.entry import EXIT_USER_ERROR


class EvaluationFailed(RuntimeError):
    pass


def _failing_evaluation(self, preempt=None):
    raise EvaluationFailed(f"evaluation at step {self.step} failed")


@pytest.mark.parametrize(
    "when", [["trainer.eval_interval=0"], ["trainer.eval_interval=2", "trainer.ckpt_interval=2"]]
)
def test_a_failing_evaluation_leaves_the_checkpoint_of_its_step(tmp_path, monkeypatch, when):
    """At the end of the run, and at a step where both are due: saved first."""
    monkeypatch.setattr(trainer_module.Trainer, "evaluate", _failing_evaluation)
    cfg = compose(TINY + ["trainer.max_steps=2", f"trainer.ckpt_dir={tmp_path / 'ck'}", *when])
    with pytest.raises(EvaluationFailed, match="at step 2"):
        run(cfg, tmp_path / "run")
    (saved,) = find_checkpoints(tmp_path / "ck")
    assert saved.step == 2
    verify_checkpoint(saved.path)


def _short_validation_split(tmp_path, *overrides: str):
    """Text data whose validation file is 10 bytes + <eos>: no 65-token window (TINY's seq_len)."""
    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("".join(f"line {i} of the training text.\n" for i in range(200)))
    val.write_text("too short\n")
    data = [f"data.data_files={train}", f"data.val_files={val}"]
    return compose(
        [*TINY, "data=text_files", *data, f"data.cache_dir={tmp_path / 'c'}", *overrides]
    )


def test_a_validation_split_shorter_than_one_window_is_refused_at_start(
    tmp_path, monkeypatch, caplog
):
    trained = []
    monkeypatch.setattr(trainer_module.Trainer, "fit", lambda self: trained.append(1) or {})
    with pytest.raises(SystemExit) as exit_info:
        main(_short_validation_split(tmp_path, "trainer.max_steps=2"))
    assert exit_info.value.code == EXIT_USER_ERROR and not trained
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "the validation split has 11 tokens: too few for 1 rank(s) x one window" in error
    assert "trainer.eval_interval=0 trainer.eval_at_end=false" in error


def test_without_evaluation_a_short_validation_split_trains(tmp_path):
    never = ["trainer.eval_interval=0", "trainer.eval_at_end=false"]
    summary = run(_short_validation_split(tmp_path, "trainer.max_steps=1", *never), tmp_path / "r")
    assert summary["step"] == 1 and summary["checkpoint"] and not summary["evals"]
