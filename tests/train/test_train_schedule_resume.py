"""Resuming with settings that shape the learning-rate schedule (trainer.max_steps, optim.lr,
warmup, decay): refused, naming the key that changed and the flag that allows it; allowed, the
new schedule holds from the resumed step as if the run had followed it from the start."""

from __future__ import annotations

import pytest
from config_testing import compose
from train_testing import TINY, read_metrics

from flashtrain.train import ConfigError, run
from flashtrain.train.metric_names import TRAIN_LR


def _tiny(*extra):
    return compose(TINY + ["optim.warmup_steps=2", "trainer.eval_interval=0", *extra])


def _lrs(run_dir) -> dict[int, float]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return {r["step"]: r[TRAIN_LR] for r in rows if TRAIN_LR in r}


def test_a_changed_schedule_is_refused_naming_the_key_and_the_flag(tmp_path):
    run(_tiny("trainer.max_steps=4"), tmp_path / "r")
    with pytest.raises(ConfigError) as err:
        run(_tiny("trainer.max_steps=8", "trainer.resume=auto"), tmp_path / "r")
    text = str(err.value)
    assert "trainer.max_steps (optim.decay_steps is null, so the decay ends there): 4 -> 8" in text
    assert "optim.decay_steps=4" in text and "trainer.allow_schedule_change=true" in text
    with pytest.raises(ConfigError, match=r"optim.lr: [0-9.e-]+ -> 0.002.*allow_schedule_change"):
        run(_tiny("trainer.max_steps=4", "optim.lr=2e-3", "trainer.resume=auto"), tmp_path / "r")
    # pinning the schedule's end is not a change: the run continues on the saved schedule
    run(_tiny("trainer.max_steps=6", "optim.decay_steps=4", "trainer.resume=auto"), tmp_path / "p")


def test_an_allowed_change_follows_the_new_schedule_from_the_resumed_step(tmp_path):
    run(_tiny("trainer.max_steps=8"), tmp_path / "full")
    run(_tiny("trainer.max_steps=4"), tmp_path / "r")
    resumed = _tiny(
        "trainer.max_steps=8", "trainer.resume=auto", "trainer.allow_schedule_change=true"
    )
    run(resumed, tmp_path / "r")
    full, old_then_new = _lrs(tmp_path / "full"), _lrs(tmp_path / "r")
    assert old_then_new[4] != full[4]  # steps 1-4 followed the 4-step schedule ...
    for step in range(5, 9):  # ... and from step 5 on the 8-step one, exactly
        assert old_then_new[step] == full[step], (step, old_then_new, full)
