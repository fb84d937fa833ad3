"""A resume checks what it is handed: the model settings the checkpoint was written for (every
field that changes what the model computes, not only the tensor shapes), its format version,
its step, and its checksums (a checkpoint without them loads only when allowed)."""

from __future__ import annotations

import json
import shutil

import pytest
from config_testing import compose
from train_testing import TINY

from flashtrain.checkpoint.read import CheckpointError, verify_checkpoint
from flashtrain.train import run

STEPS = ["trainer.max_steps=3", "trainer.eval_interval=0", "trainer.eval_at_end=false"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A run's checkpoint at step 2 (of 3 steps) and the run's losses."""
    root = tmp_path_factory.mktemp("written")
    out = run(compose(TINY + STEPS + ["trainer.ckpt_interval=2"]), root / "run")
    return root / "run" / "checkpoints" / "step_000002", out["losses"]


@pytest.fixture
def copy(written, tmp_path):
    """A copy of the step-2 checkpoint to edit; resume(*overrides) resumes from it."""
    source, _ = written
    folder = tmp_path / "ckpts" / source.name
    shutil.copytree(source, folder)
    return folder


def resume(tmp_path, checkpoint, *overrides):
    cfg = compose(TINY + STEPS + [f"trainer.resume={checkpoint}", *overrides])
    return run(cfg, tmp_path / "resumed")


def edit_meta(checkpoint, **changes):
    meta = json.loads((checkpoint / "meta.json").read_text())
    for key, value in changes.items():
        if value is None:
            del meta[key]
        else:
            meta[key] = value
    (checkpoint / "meta.json").write_text(json.dumps(meta))


@pytest.mark.slow  # ~41 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_the_unchanged_checkpoint_resumes_exactly(written, copy, tmp_path):
    _, losses = written
    assert resume(tmp_path, copy)["losses"] == losses[2:]


def test_other_head_count_over_the_same_shapes_is_refused_naming_the_field(copy, tmp_path):
    # n_head 2 -> 4 at d_model 64: every tensor keeps its shape, but each weight means another head
    with pytest.raises(CheckpointError, match=r"model\.n_head=4 \(checkpoint: 2\)"):
        resume(tmp_path, copy, "model.n_head=4")


@pytest.mark.parametrize("field", ["dropout", "attn_dropout"])
def test_a_dropout_change_is_refused(copy, tmp_path, field):
    # dropout changes the function trained (docs/training.md, resume rules)
    with pytest.raises(CheckpointError, match=rf"model\.{field}=0\.1 \(checkpoint: 0\.0\)"):
        resume(tmp_path, copy, f"model.{field}=0.1")


def test_how_the_model_is_computed_may_change(written, copy, tmp_path):
    _, losses = written
    out = resume(tmp_path, copy, "model.recompute=all")  # memory for time, the same function
    assert [s for s, _ in out["losses"]] == [s for s, _ in losses[2:]] == [3]
    assert [v for _, v in out["losses"]] == pytest.approx([v for _, v in losses[2:]], rel=1e-5)


def test_a_checkpoint_from_a_newer_format_is_refused(copy, tmp_path):
    edit_meta(copy, version=99)
    with pytest.raises(CheckpointError, match="format version 99, newer than this flashtrain"):
        resume(tmp_path, copy)


def test_an_edited_step_is_found(copy, tmp_path):
    edit_meta(copy, step=5)
    with pytest.raises(CheckpointError, match="says step 5, its name step 2"):
        resume(tmp_path, copy)
    renamed = copy.with_name("step_000005")
    copy.rename(renamed)  # name and meta agree now, the trainer state does not
    with pytest.raises(CheckpointError, match="says step 5, its trainer.pt step 2"):
        resume(tmp_path, renamed)


def test_the_step_is_checked_before_the_model_is_loaded(copy, tmp_path, monkeypatch):
    """docs/training.md: a resume refuses a step its files disagree on before anything is
    loaded (trainer.pt's step was compared only after the weights were in the model)."""
    import flashtrain.checkpoint.read as checkpoint

    edit_meta(copy, step=5)
    renamed = copy.with_name("step_000005")
    copy.rename(renamed)

    def must_not_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the step check")

    monkeypatch.setattr(checkpoint, "set_model_state_dict", must_not_load)
    with pytest.raises(CheckpointError, match="says step 5, its trainer.pt step 2"):
        resume(tmp_path, renamed)


def test_a_checkpoint_without_checksums_loads_only_when_allowed(written, copy, tmp_path):
    _, losses = written
    edit_meta(copy, files=None)
    with pytest.raises(CheckpointError, match="trainer.allow_unverified_checkpoint=true"):
        resume(tmp_path, copy)
    out = resume(tmp_path, copy, "trainer.allow_unverified_checkpoint=true")
    assert out["losses"] == losses[2:]
    with pytest.raises(CheckpointError, match="no checksums"):
        verify_checkpoint(copy)
