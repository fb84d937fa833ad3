"""A resume checks what it is handed: the model settings the checkpoint was written for (every
field that changes what the model computes, not only the tensor shapes), its format version,
its step, and its checksums (a checkpoint without them loads only when allowed); and what it
does with other optimizer settings: per-group values applied, another grouping refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from config_testing import compose
from train_testing import TINY

from flashtrain.checkpoint.read import CheckpointError, verify_checkpoint
from flashtrain.train import ConfigError, run
from flashtrain.train.trainer import Trainer

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


def test_other_optimizer_values_are_applied_at_resume(copy, tmp_path, caplog):
    """optim.weight_decay, betas and eps changed at resume take effect (the loaded optimizer
    state_dict's groups used to overwrite them, silently): the next update is AdamW's with the
    new values, built independently here from the checkpoint's weights and moments."""
    new = ["optim.weight_decay=0.0", "optim.betas=[0.5,0.6]", "optim.eps=1e-3"]
    cfg = compose(TINY + STEPS + [f"trainer.resume={copy}", *new])
    trainer = Trainer(cfg, tmp_path / "resumed")
    try:
        assert trainer.checkpoints.resume()
        params = dict(trainer.raw_model.named_parameters())
        lr = trainer.optimizer.param_groups[0]["lr"]  # the saved schedule's, at step 3
        saved = torch.load(copy / "model_optim.pt", weights_only=True)
        reference = {name: saved["model"][name].clone().requires_grad_() for name in params}
        adamw = torch.optim.AdamW(
            list(reference.values()), lr=lr, betas=(0.5, 0.6), eps=1e-3, weight_decay=0.0
        )
        for name, p in reference.items():
            adamw.state[p] = {k: v.clone() for k, v in saved["optim"]["state"][name].items()}
        gen = torch.Generator().manual_seed(0)
        for name, p in params.items():
            p.grad = torch.randn(p.shape, generator=gen)
            reference[name].grad = p.grad.clone()
        trainer.optimizer.step()
        adamw.step()
        for name, p in params.items():
            assert torch.equal(p.detach(), reference[name].detach()), name
        for line in (
            "optim.weight_decay: 0.1 -> 0.0 (applied at resume)",
            "optim.betas: [0.9, 0.95] -> [0.5, 0.6] (applied at resume)",
            "optim.eps: 1e-08 -> 0.001 (applied at resume)",
        ):
            assert line in caplog.text
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "overrides, changes",
    [
        (  # both: one group left (it crashed in the scheduler's step: zip() ValueError)
            ["optim.decay_norm_and_bias=true", "optim.decay_embeddings=true"],
            "optim.decay_norm_and_bias: false -> true; optim.decay_embeddings: false -> true",
        ),
        (["optim.decay_embeddings=true"], "optim.decay_embeddings: false -> true"),  # was silent
    ],
    ids=["one-group", "embeddings"],
)
def test_another_parameter_grouping_is_refused_before_loading(
    copy, tmp_path, monkeypatch, overrides, changes
):
    import flashtrain.checkpoint.read as checkpoint

    def must_not_load(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the grouping check")

    monkeypatch.setattr(checkpoint, "set_model_state_dict", must_not_load)
    with pytest.raises(ConfigError) as err:
        resume(tmp_path, copy, *overrides)
    text = str(err.value)
    assert f"with other optimizer groups: {changes}." in text
    assert "optim.decay_embeddings=false, or start a new run from its weights" in text
    assert f"model.init_from={copy}" in text
