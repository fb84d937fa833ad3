"""One run per run folder (flashtrain/train/run_folder.py): a second live run is refused naming
the folder and the first, a run with another checkpoint folder is refused even once the first
has ended, and the same run continuing (a resume, a restarted job, the folder moved whole) is
let in. Issue 56, 5: two trainings with one hydra.run.dir and different trainer.ckpt_dir both
exited 0 into one metrics.jsonl, train.log and config.yaml."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch
from config_testing import compose
from train_testing import TINY

from flashtrain.checkpoint.run_info import RUN_INFO_FILE, write_run_info
from flashtrain.train import run
from flashtrain.train.run_folder import RUN_LOCK_FILE, RunFolderClaim, RunFolderTaken


def _finished_run(run_dir, ckpt_root):
    """A run folder whose run.json records a run that checkpointed into ckpt_root."""
    claim = RunFolderClaim(run_dir, ckpt_root, "first").acquire()
    write_run_info(run_dir, torch.device("cpu"), 1, 0, ckpt_dir=claim.record)
    claim.release()


def test_a_second_live_run_is_refused_naming_the_folder_and_the_first(tmp_path):
    run_dir = tmp_path / "run"
    first = RunFolderClaim(run_dir, run_dir / "checkpoints", "first").acquire()
    for ckpt_root in (tmp_path / "elsewhere", run_dir / "checkpoints"):
        with pytest.raises(RunFolderTaken) as refused:
            RunFolderClaim(run_dir, ckpt_root, "second").acquire()
        message = str(refused.value)
        assert "\n" not in message and f"run folder {run_dir} (hydra.run.dir)" in message
        assert "run 'first' (host " in message and f"pid {os.getpid()}" in message
        assert "trainer.wait_for_lock=true" in message
    first.release()
    assert not (run_dir / RUN_LOCK_FILE).exists()  # and the folder Hydra would make is kept
    RunFolderClaim(run_dir, run_dir / "checkpoints", "second").acquire().release()


def test_a_finished_runs_folder_is_refused_to_a_run_with_another_ckpt_dir(tmp_path):
    run_dir = tmp_path / "run"
    _finished_run(run_dir, run_dir / "checkpoints")
    assert json.loads((run_dir / RUN_INFO_FILE).read_text())["ckpt_dir"] == "checkpoints"
    with pytest.raises(RunFolderTaken) as refused:
        RunFolderClaim(run_dir, tmp_path / "other", "second").acquire()
    message = str(refused.value)
    assert f"whose checkpoints are in {(run_dir / 'checkpoints').resolve()}" in message
    assert f"trainer.ckpt_dir={(run_dir / 'checkpoints').resolve()} to continue" in message
    assert not (run_dir / RUN_LOCK_FILE).exists()  # the refused claim let go of the lock
    # the same run continuing: its checkpoint folder named either way, or the folder moved whole
    RunFolderClaim(run_dir, run_dir / "checkpoints", "first").acquire().release()
    RunFolderClaim(run_dir, (run_dir / "checkpoints").resolve(), "first").acquire().release()
    moved = tmp_path / "moved"
    shutil.move(run_dir, moved)
    RunFolderClaim(moved, moved / "checkpoints", "first").acquire().release()


def test_a_checkpoint_folder_outside_is_recorded_whole_and_an_old_record_names_no_owner(
    tmp_path,
):
    run_dir, outside = tmp_path / "run", tmp_path / "ckpts"
    _finished_run(run_dir, outside)
    assert json.loads((run_dir / RUN_INFO_FILE).read_text())["ckpt_dir"] == str(outside)
    with pytest.raises(RunFolderTaken):
        RunFolderClaim(run_dir, run_dir / "checkpoints", "second").acquire()
    RunFolderClaim(run_dir, outside, "first").acquire().release()
    info = json.loads((run_dir / RUN_INFO_FILE).read_text())
    del info["ckpt_dir"]  # a run.json written before the record
    (run_dir / RUN_INFO_FILE).write_text(json.dumps(info))
    RunFolderClaim(run_dir, tmp_path / "any", "second").acquire().release()


def test_a_run_into_a_finished_runs_folder_with_another_ckpt_dir_is_refused(tmp_path):
    """The trainer end to end: the second run is refused before it writes anything (its
    checkpoint folder never made), the first run's records stay as they were."""
    run_dir = tmp_path / "run"
    steps = ["trainer.max_steps=1", "trainer.eval_at_end=false"]
    run(compose(TINY + steps + [f"trainer.ckpt_dir={tmp_path / 'a'}"]), run_dir)
    records = {name: (run_dir / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")}
    with pytest.raises(RunFolderTaken, match=re.escape(f"checkpoints are in {tmp_path / 'a'}")):
        run(compose(TINY + steps + [f"trainer.ckpt_dir={tmp_path / 'b'}"]), run_dir)
    assert {name: (run_dir / name).read_bytes() for name in records} == records
    assert not (tmp_path / "b").exists() and not (run_dir / RUN_LOCK_FILE).exists()
