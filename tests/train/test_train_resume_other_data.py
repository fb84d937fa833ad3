"""trainer.resume onto other data (issue 32, item 4): refused with one line naming the field,
exit code 2; trainer.resume_other_data=true keeps the weights, optimizer and step and reads the
new data from its start (tests/data/test_data_resume_other_data.py: every loader's fields)."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from config_testing import compose
from train_testing import TINY

from flashtrain.train import main, run
from flashtrain.train.entry import EXIT_USER_ERROR

# The smallest run that writes a checkpoint after step 1 of 2 (synthetic data: num_keys 8).
SMALL = TINY + [
    "model.n_layer=1",
    "model.d_model=32",
    "seq_len=16",
    "micro_batch_size=2",
    "global_batch_size=2",
    "trainer.eval_batches=1",
    "trainer.max_steps=2",
    "trainer.eval_interval=0",
    "trainer.eval_at_end=false",
    "optim.decay_steps=2",  # the schedule of 2 steps, also for the run that stops after 1
]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("written")
    run(compose(SMALL + ["trainer.max_steps=1", "trainer.ckpt_interval=1"]), root / "run")
    return root / "run" / "checkpoints" / "step_000001"


@pytest.fixture
def checkpoint(written, tmp_path):
    return shutil.copytree(written, tmp_path / "ckpts" / written.name)


def test_other_data_is_refused_with_one_line_and_exit_2(checkpoint, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    cfg = compose(SMALL + [f"trainer.resume={checkpoint}", "data.num_keys=4"])
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_USER_ERROR
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0], caplog.text
    assert "data.num_keys: saved 8, now 4" in errors[0], errors[0]
    assert "trainer.resume_other_data=true" in errors[0], errors[0]


def test_the_override_keeps_the_model_and_restarts_the_stream(checkpoint, tmp_path, caplog):
    over = [f"trainer.resume={checkpoint}", "data.num_keys=4", "trainer.resume_other_data=true"]
    with caplog.at_level(logging.INFO, logger="flashtrain"):
        out = run(compose(SMALL + over + ["trainer.ckpt_interval=1"]), tmp_path / "resumed")
    assert [step for step, _ in out["losses"]] == [2]  # the step and counters continue
    notes = [
        r.getMessage() for r in caplog.records if "trainer.resume_other_data:" in r.getMessage()
    ]
    assert len(notes) == 1 and "data.num_keys: saved 8, now 4" in notes[0], caplog.text
    saved = torch.load(
        tmp_path / "resumed" / "checkpoints" / "step_000002" / "trainer.pt", weights_only=False
    )
    assert saved["data"][0]["step"] == 1  # one batch of the new data read, not the saved 1 + 1
