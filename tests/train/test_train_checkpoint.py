"""Checkpoint files: round trip, atomic writes, keep-last-K, resume resolution, bad checkpoints;
the RNG state a checkpoint carries (run_state.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

from flashtrain.checkpoint import read as ckpt
from flashtrain.checkpoint.write import ABANDONED, save_checkpoint, set_aside_newer_checkpoints
from flashtrain.train.run_state import rng_state, set_rng_state


class Net(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.emb = nn.Embedding(16, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(2))
        self.head = nn.Linear(width, 16)

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.head(h).logsumexp(-1).mean()


def trained(seed=0, width=8, steps=2):
    torch.manual_seed(seed)
    model = Net(width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.randint(0, 16, (4, 5))).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def save(root, step, model, opt, keep_last=0, state=None):
    return save_checkpoint(
        root,
        step,
        model=model,
        optimizer=opt,
        trainer_state=state or {"step": step},
        meta={"model_config": {"width": model.blocks[0].in_features}},
        config_yaml="seed: 1\n",
        keep_last=keep_last,
    )


def digest(folder):
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_round_trip_restores_model_optimizer_and_state(tmp_path):
    model, opt = trained(seed=0)
    path = save(tmp_path, 7, model, opt, state={"step": 7, "data": [{"pos": 3}]})
    assert path == tmp_path / "step_000007"
    assert (tmp_path / "latest").read_text().strip() == "step_000007"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 7 and meta["format"] == "torch"
    assert (path / "config.yaml").read_text() == "seed: 1\n"

    other, other_opt = trained(seed=1, steps=0)
    state, meta = ckpt.load_checkpoint(path, model=other, optimizer=other_opt)
    assert state == {"step": 7, "data": [{"pos": 3}]} and meta["step"] == 7
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the optimizer continues identically
    x = torch.randint(0, 16, (4, 5))
    for m, o in ((model, opt), (other, other_opt)):
        m(x).backward()
        o.step()
    for a, b in zip(model.parameters(), other.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_keep_last_prunes_oldest(tmp_path):
    model, opt = trained()
    for step in (1, 2, 3, 4):
        save(tmp_path, step, model, opt, keep_last=2)
    assert [c.step for c in ckpt.find_checkpoints(tmp_path)] == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000003", "step_000004"]


def _abandoned(root):
    """{step folder name: its digest} of every checkpoint a branch set aside under root."""
    return {p.name: digest(p) for p in sorted((root / ABANDONED).glob("*/step_*"))}


@pytest.mark.parametrize("keep_last", [0, 1])
def test_a_save_of_an_older_step_keeps_the_new_line_and_sets_the_newer_one_aside(
    tmp_path, keep_last
):
    """Issue 56, 1: steps 2 and 4 saved, then step 3 (a run resumed from step 2): the prune
    kept the abandoned step 4 and deleted step 3, which `latest` still named; with keep_last=0
    every newest lookup took step 4."""
    model, opt = trained()
    save(tmp_path, 2, model, opt)
    save(tmp_path, 4, model, opt)
    abandoned_step_4 = digest(tmp_path / "step_000004")
    save(tmp_path, 3, model, opt, keep_last=keep_last)
    kept = [3] if keep_last else [2, 3]
    assert [c.step for c in ckpt.find_checkpoints(tmp_path)] == kept
    assert (tmp_path / "latest").read_text().strip() == "step_000003"
    assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "step_000003"
    assert ckpt.resolve_checkpoint(tmp_path) == tmp_path / "step_000003"
    assert _abandoned(tmp_path) == {"step_000004": abandoned_step_4}  # kept whole, aside
    for later in (5, 6):  # later saves and prunes never reach into abandoned/
        save(tmp_path, later, model, opt, keep_last=1)
    assert [c.step for c in ckpt.find_checkpoints(tmp_path)] == [6]
    assert _abandoned(tmp_path) == {"step_000004": abandoned_step_4}


def test_a_resume_sets_the_newer_ones_aside_at_the_branch_damaged_or_not(tmp_path, caplog):
    """At the resume from step 2 (before any save of the new line): steps 4 and 6 go aside,
    step 6 damaged and a step 4 left moved aside by an interrupted replacement among them, and
    every newest lookup takes step 2; the warning names each and where it went."""
    model, opt = trained()
    for step in (2, 4, 6):
        save(tmp_path, step, model, opt)
    (tmp_path / "step_000006" / ckpt.MODEL_OPTIM).write_bytes(b"damaged")
    os.rename(tmp_path / "step_000004", tmp_path / ".step_000004.old")  # a replace cut short
    caplog.set_level(logging.WARNING, logger="flashtrain.checkpoint")
    moved = set_aside_newer_checkpoints(tmp_path, 2)
    assert [p.name for p in moved] == ["step_000004", "step_000006"]
    assert [c.step for c in ckpt.find_checkpoints(tmp_path)] == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [ABANDONED, "latest", "step_000002"]
    assert (tmp_path / "latest").read_text().strip() == "step_000002"
    assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "step_000002"
    assert ckpt.resolve_checkpoint(tmp_path) == tmp_path / "step_000002"
    line = caplog.records[-1].getMessage()
    assert "step_000004, step_000006" in line and str(moved[0].parent) in line
    assert set_aside_newer_checkpoints(tmp_path, 2) == []  # the line already goes on from 2
    save(tmp_path, 1, model, opt)  # a save before everything there: step 2 goes aside as well
    assert [c.step for c in ckpt.find_checkpoints(tmp_path)] == [1]
    assert len(list((tmp_path / ABANDONED).iterdir())) == 2  # one folder per branch


def test_a_crash_while_writing_leaves_previous_checkpoints_intact(tmp_path, monkeypatch):
    model, opt = trained()
    save(tmp_path, 1, model, opt, keep_last=1)
    before = digest(tmp_path / "step_000001")
    real_save = torch.save

    def dying_save(obj, f, *a, **k):
        if str(getattr(getattr(f, "raw", f), "name", f)).endswith(ckpt.TRAINER_STATE):
            real_save(obj, f, *a, **k)
            raise KeyboardInterrupt("killed while writing")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, model, opt, keep_last=1)
    monkeypatch.setattr(torch, "save", real_save)
    assert [c.step for c in ckpt.find_checkpoints(tmp_path)] == [1]
    assert (tmp_path / "latest").read_text().strip() == "step_000001"
    assert digest(tmp_path / "step_000001") == before
    assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "step_000001"
    # the next save cleans the partial directory up
    save(tmp_path, 3, model, opt, keep_last=0)
    assert not list(tmp_path.glob(".step_*"))


def test_resolve_resume(tmp_path):
    assert ckpt.resolve_resume(None, tmp_path) is None
    assert ckpt.resolve_resume("auto", tmp_path / "nothing") is None
    model, opt = trained()
    save(tmp_path, 5, model, opt)
    save(tmp_path, 10, model, opt)
    assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "step_000010"
    assert ckpt.resolve_resume(str(tmp_path), tmp_path) == tmp_path / "step_000010"
    assert ckpt.resolve_resume(str(tmp_path / "step_000005"), "x") == tmp_path / "step_000005"
    with pytest.raises(ckpt.CheckpointError, match="no such checkpoint"):
        ckpt.resolve_resume(str(tmp_path / "missing"), tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint in"):
        ckpt.resolve_resume(str(empty), tmp_path)


def test_resolve_checkpoint_takes_a_step_a_checkpoints_folder_or_a_run(tmp_path):
    """What export / generate / evaluate take as CKPT."""
    run = tmp_path / "run"
    model, opt = trained()
    save(run / "checkpoints", 5, model, opt)
    save(run / "checkpoints", 10, model, opt)
    newest = run / "checkpoints" / "step_000010"
    assert ckpt.resolve_checkpoint(run) == newest
    assert ckpt.resolve_checkpoint(run / "checkpoints") == newest
    assert ckpt.resolve_checkpoint(str(run / "checkpoints" / "step_000005")) == newest.with_name(
        "step_000005"
    )
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint .*missing does not exist; name"):
        ckpt.resolve_checkpoint(tmp_path / "missing")
    with pytest.raises(ckpt.CheckpointError, match="is not a directory"):
        ckpt.resolve_checkpoint(newest / ckpt.MODEL_OPTIM)
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint in"):
        ckpt.resolve_checkpoint(tmp_path)  # a folder holding none


def test_corrupt_checkpoint_is_reported_and_left_alone(tmp_path):
    model, opt = trained()
    path = save(tmp_path, 3, model, opt)
    blob = path / ckpt.MODEL_OPTIM
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])  # truncated
    before = digest(tmp_path)
    fresh, fresh_opt = trained(seed=5, steps=0)
    weights = [p.detach().clone() for p in fresh.parameters()]
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.load_checkpoint(path, model=fresh, optimizer=fresh_opt)
    assert digest(tmp_path) == before
    for a, b in zip(weights, fresh.parameters()):
        assert torch.equal(a, b)  # the model was not touched


def test_garbage_meta_is_reported(tmp_path):
    model, opt = trained()
    path = save(tmp_path, 3, model, opt)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.load_checkpoint(path, model=model, optimizer=opt)


def test_mismatched_model_is_reported_before_loading(tmp_path):
    model, opt = trained(width=8)
    path = save(tmp_path, 3, model, opt)
    before = digest(tmp_path)
    wider, wider_opt = trained(width=12, steps=0)
    weights = [p.detach().clone() for p in wider.parameters()]
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_checkpoint(path, model=wider, optimizer=wider_opt)
    msg = str(err.value)
    assert "does not fit this model" in msg and "blocks.0.weight" in msg
    assert "[8, 8]" in msg and "[12, 12]" in msg and "'width': 8" in msg
    assert digest(tmp_path) == before
    assert all(torch.equal(a, b) for a, b in zip(weights, wider.parameters()))


def test_a_directory_without_meta_is_not_a_checkpoint(tmp_path):
    model, opt = trained()
    path = save(tmp_path, 3, model, opt)
    (path / "meta.json").unlink()
    assert ckpt.find_checkpoints(tmp_path) == []
    with pytest.raises(ckpt.CheckpointError, match="not a complete"):
        ckpt.resolve_resume(str(path), tmp_path)


def test_rng_state_round_trip():
    state = rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.random(), np.random.rand(), torch.rand(())
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected
