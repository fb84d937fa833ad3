"""Checkpoint checksums: recorded while writing, checked before loading; resume=auto passes over a
damaged checkpoint; pruning cut short at any point never leaves a checkpoint without its files."""

from __future__ import annotations

import hashlib
import json
import logging
import os

import pytest
import torch
from test_train_checkpoint import digest, save, trained

from flashtrain.checkpoint import manifest as checkpoint_manifest
from flashtrain.checkpoint import read as ckpt

COMPLETE = {"config.yaml", "model_optim.pt", "trainer.pt"}  # besides meta.json


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip_inside_tensor(file, tensor):
    """Flip one bit in the middle of `tensor`'s bytes inside a torch.save file."""
    data = bytearray(file.read_bytes())
    at = data.find(tensor.detach().numpy().tobytes())
    assert at > 0, "tensor bytes not found in the file"
    data[at + tensor.numel() * tensor.element_size() // 2] ^= 0x10
    file.write_bytes(bytes(data))


@pytest.fixture
def no_read_back(monkeypatch):
    """Fail if a checkpoint file is read back to hash it (they are hashed while written)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a file was read back to hash it")

    monkeypatch.setattr(checkpoint_manifest, "hash_file", refuse)
    yield
    monkeypatch.undo()


def test_every_file_is_listed_with_its_size_and_sha256(tmp_path, no_read_back):
    model, opt = trained()
    path = save(tmp_path, 1, model, opt)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["version"] == ckpt.FORMAT_VERSION == 2
    files = {p.name for p in path.iterdir()} - {"meta.json"}
    assert set(meta["files"]) == files == COMPLETE
    for name, entry in meta["files"].items():
        assert entry == {"bytes": (path / name).stat().st_size, "sha256": sha256(path / name)}


def test_a_flipped_bit_inside_a_tensor_is_refused_naming_the_file(tmp_path):
    model, opt = trained()
    path = save(tmp_path, 3, model, opt)
    flip_inside_tensor(path / ckpt.MODEL_OPTIM, model.head.weight)
    before = digest(tmp_path)
    fresh, fresh_opt = trained(seed=5, steps=0)
    weights = [p.detach().clone() for p in fresh.parameters()]
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_checkpoint(path, model=fresh, optimizer=fresh_opt)
    msg = str(err.value)
    assert "corrupt" in msg and "model_optim.pt" in msg and str(path) in msg
    assert "trainer.resume=auto" in msg  # says what to do
    assert all(torch.equal(a, b) for a, b in zip(weights, fresh.parameters()))  # untouched
    assert digest(tmp_path) == before  # and the checkpoint left as it was
    with pytest.raises(ckpt.CheckpointError, match="model_optim.pt"):
        ckpt.resolve_resume(str(path), tmp_path)  # named explicitly: refused


def test_resume_auto_passes_over_a_damaged_newest_checkpoint(tmp_path, caplog):
    model, opt = trained()
    save(tmp_path, 1, model, opt)
    newest = save(tmp_path, 2, model, opt)
    flip_inside_tensor(newest / ckpt.MODEL_OPTIM, model.blocks[1].weight)
    with caplog.at_level(logging.WARNING, logger="flashtrain"):
        assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "step_000001"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(newest) in warning and "model_optim.pt" in warning
    # a checkpoints folder named explicitly is refused, not silently replaced by an older one
    with pytest.raises(ckpt.CheckpointError, match="model_optim.pt"):
        ckpt.resolve_resume(str(tmp_path), tmp_path)
    # nothing intact at all: refused rather than silently starting afresh
    flip_inside_tensor(tmp_path / "step_000001" / ckpt.MODEL_OPTIM, model.blocks[1].weight)
    with pytest.raises(ckpt.CheckpointError, match="none of the 2 checkpoint"):
        ckpt.resolve_resume("auto", tmp_path)


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage_trainer_state"])
def test_missing_or_resized_files_are_named(tmp_path, damage):
    model, opt = trained()
    path = save(tmp_path, 1, model, opt)
    if damage == "missing":
        (path / "config.yaml").unlink()
        expected = "config.yaml .*is missing"
    elif damage == "truncated":
        blob = path / ckpt.MODEL_OPTIM
        blob.write_bytes(blob.read_bytes()[:-7])
        expected = "model_optim.pt has .* bytes"
    else:
        blob = path / ckpt.TRAINER_STATE
        blob.write_bytes(b"x" * blob.stat().st_size)
        expected = "trainer.pt does not match"
    with pytest.raises(ckpt.CheckpointError, match=expected):
        ckpt.load_checkpoint(path, model=model, optimizer=opt)


def test_unlisted_files_are_reported_and_ignored(tmp_path, caplog):
    model, opt = trained()
    path = save(tmp_path, 1, model, opt)
    (path / "notes.txt").write_text("mine")
    with caplog.at_level(logging.WARNING, logger="flashtrain"):
        ckpt.load_checkpoint(path, model=model, optimizer=opt)
    assert any("notes.txt" in r.getMessage() for r in caplog.records)


def test_a_checkpoint_without_checksums_loads_only_when_allowed_and_with_a_note(tmp_path, caplog):
    model, opt = trained()
    path = save(tmp_path, 4, model, opt, state={"step": 4})
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"]
    meta["version"] = 1  # what the first format wrote (or a file list removed)
    (path / "meta.json").write_text(json.dumps(meta))
    fresh, fresh_opt = trained(seed=3, steps=0)
    allow = "trainer.allow_unverified_checkpoint=true"
    for resume in ("auto", str(path)):  # auto does not go back past it either
        with pytest.raises(ckpt.UnverifiedCheckpointError, match=allow):
            ckpt.resolve_resume(resume, tmp_path)
    with pytest.raises(ckpt.UnverifiedCheckpointError, match=allow):
        ckpt.load_checkpoint(path, model=fresh, optimizer=fresh_opt)
    assert ckpt.resolve_resume("auto", tmp_path, allow_unverified=True) == path
    with caplog.at_level(logging.INFO, logger="flashtrain"):
        state, _ = ckpt.load_checkpoint(
            path, model=fresh, optimizer=fresh_opt, allow_unverified=True
        )
    assert state == {"step": 4}
    notes = [r.getMessage() for r in caplog.records if "unverified" in r.getMessage()]
    assert len(notes) == 1 and "version 1" in notes[0]


def test_resolve_then_load_reads_each_file_once(tmp_path, monkeypatch):
    model, opt = trained()
    path = save(tmp_path, 1, model, opt)
    reads = []
    real = checkpoint_manifest.hash_file
    monkeypatch.setattr(
        checkpoint_manifest, "hash_file", lambda p, *a: reads.append(p.name) or real(p, *a)
    )
    assert ckpt.resolve_resume("auto", tmp_path) == path
    ckpt.load_checkpoint(path, model=model, optimizer=opt)
    assert sorted(reads) == ["config.yaml", "model_optim.pt", "trainer.pt"]
    # ... but a file rewritten since is hashed again (and caught)
    flip_inside_tensor(path / ckpt.MODEL_OPTIM, model.head.weight)
    with pytest.raises(ckpt.CheckpointError, match="model_optim.pt"):
        ckpt.load_checkpoint(path, model=model, optimizer=opt)


def test_a_prune_cut_short_anywhere_leaves_only_complete_checkpoints(tmp_path, monkeypatch):
    """Kill the prune at every file deletion in turn: whatever find_checkpoints / resume=auto
    see afterwards is complete, and the next save clears the leftovers."""
    model, opt = trained()
    real_unlink = os.unlink
    kill_at = 0
    while True:
        kill_at += 1
        root = tmp_path / f"run{kill_at}"
        for step in (1, 2):
            save(root, step, model, opt)
        calls = 0

        def dying_unlink(*args, _kill_at=kill_at, **kwargs):
            nonlocal calls
            calls += 1
            if calls == _kill_at:
                raise KeyboardInterrupt("killed while pruning")
            return real_unlink(*args, **kwargs)

        monkeypatch.setattr(os, "unlink", dying_unlink)
        try:
            save(root, 3, model, opt, keep_last=1)
            finished = True
        except KeyboardInterrupt:
            finished = False
        monkeypatch.setattr(os, "unlink", real_unlink)
        for info in ckpt.find_checkpoints(root):
            left = {p.name for p in info.path.iterdir()}
            assert left == {"meta.json", *COMPLETE}, f"kill {kill_at} left {info.path}: {left}"
        assert ckpt.resolve_resume("auto", root) == root / "step_000003"
        save(root, 4, model, opt, keep_last=1)  # the next save finishes the job
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000004"]
        if finished:
            break
    assert kill_at > 6  # the kill really hit inside both pruned checkpoints


def test_the_trainer_resumes_auto_from_the_newest_intact_checkpoint(tmp_path, caplog):
    from config_testing import compose
    from train_testing import TINY

    from flashtrain.train import run

    def cfg(*extra):
        return compose(TINY + list(extra))

    full = run(cfg("trainer.max_steps=4", "trainer.ckpt_interval=2"), tmp_path / "a")
    newest = tmp_path / "a" / "checkpoints" / "step_000004"
    weights = torch.load(newest / ckpt.MODEL_OPTIM, weights_only=True)["model"]
    flip_inside_tensor(newest / ckpt.MODEL_OPTIM, max(weights.values(), key=torch.numel))
    with caplog.at_level(logging.WARNING, logger="flashtrain"):
        resumed = run(cfg("trainer.max_steps=4", "trainer.resume=auto"), tmp_path / "a")
    assert any(str(newest) in r.getMessage() for r in caplog.records)
    assert resumed["losses"] == full["losses"][2:]  # from step 2, exactly as the first run
    ckpt.verify_checkpoint(newest)  # and step 4 was written anew,
    # the damaged one moved aside when the run went on from step 2, kept for a look, never
    # taken for the run's (issue 56, item 1)
    (aside,) = (tmp_path / "a" / "checkpoints" / "abandoned").glob("*/step_000004")
    with pytest.raises(ckpt.CheckpointError, match="does not match the sha256"):
        ckpt.verify_checkpoint(aside)


def test_a_kill_while_replacing_a_checkpoint_of_the_same_step_loses_nothing(tmp_path):
    model, opt = trained()
    path = save(tmp_path, 5, model, opt)
    before = digest(path)
    path.rename(tmp_path / ".step_000005.old")  # killed between moving it aside and the swap
    save(tmp_path, 6, model, opt)  # the next save puts it back
    assert [c.step for c in ckpt.find_checkpoints(tmp_path)] == [5, 6]
    assert digest(path) == before and not list(tmp_path.glob(".step_*"))
