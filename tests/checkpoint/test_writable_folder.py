"""The start-up look at a folder a run will write (trainer.ckpt_dir, logger.dir), writing
nothing: what is in the way or not writable is found, and refused in the words the checkpoint
lock uses when its own creation of the folder fails."""

from __future__ import annotations

import errno
import os

import pytest

from flashtrain.checkpoint.run_lock import RunLock, check_checkpoint_folder
from flashtrain.checkpoint.writable_folder import (
    NOT_A_DIRECTORY,
    check_writable_folder,
    foreseen_problem,
)
from flashtrain.typed_config import ConfigError


def test_a_folder_that_can_be_made_is_accepted_and_left_unmade(tmp_path):
    assert foreseen_problem(tmp_path) is None
    assert foreseen_problem(tmp_path / "a" / "b") is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["the folder", "a folder above it", "a broken link"])
def test_what_is_in_the_way_is_found(where, tmp_path):
    blocker = tmp_path / "blocker"
    if where == "a broken link":
        blocker.symlink_to(tmp_path / "gone")
    else:
        blocker.write_text("not a folder")
    folder = blocker if where == "the folder" else blocker / "logs"
    assert foreseen_problem(folder) == NOT_A_DIRECTORY
    with pytest.raises(ConfigError) as refused:
        check_writable_folder(folder, "logger.dir", "logger=wandb's files")
    assert str(refused.value) == (
        f"logger.dir {folder} is not a directory (a file is in the way): logger=wandb's files "
        "need a folder this run can create and write; point logger.dir at one"
    )


def test_a_folder_this_process_may_not_write_is_found(tmp_path, monkeypatch):
    """The tests run as root, whom permissions do not stop: os.access says no instead."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: p != locked and real_access(p, mode))
    reason = f"cannot be created or written ({os.strerror(errno.EACCES)})"
    assert foreseen_problem(locked) == reason
    assert foreseen_problem(locked / "inner" / "more") == reason
    assert foreseen_problem(tmp_path / "beside") is None


def test_the_start_check_and_the_lock_refuse_a_ckpt_dir_in_the_same_words(tmp_path):
    (tmp_path / "blocker").write_text("not a folder")
    root = tmp_path / "blocker" / "checkpoints"
    with pytest.raises(ConfigError) as looked:
        check_checkpoint_folder(root)
    with pytest.raises(ConfigError) as locked:
        RunLock(root, "run").acquire()
    assert str(looked.value) == str(locked.value)
    assert f"trainer.ckpt_dir {root} is not a directory" in str(looked.value)
