"""What a run leaves in outputs/: a refused run or a dry run leaves no folder (Hydra made one for
its log before the run was refused); a folder with anything of a run's in it is never removed."""

from __future__ import annotations

import pytest

from flashtrain.train.entry import remove_unused_run_folder


def _hydra_made(root, name="2026-11-27/19-00-00"):
    run_dir = root / "outputs" / name
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("seq_len: 128\n")
    (run_dir / "train.log").write_text("refused\n")
    return run_dir


def test_a_folder_of_hydra_files_only_is_removed_with_its_empty_date_folder(tmp_path):
    run_dir = _hydra_made(tmp_path)
    (run_dir / "checkpoints").mkdir()  # a run refused after it took the checkpoint folder's lock
    assert remove_unused_run_folder(run_dir)
    assert not run_dir.exists() and not run_dir.parent.exists()
    assert (tmp_path / "outputs").is_dir()


def test_the_date_folder_stays_while_other_runs_are_in_it(tmp_path):
    run_dir = _hydra_made(tmp_path)
    other = _hydra_made(tmp_path, "2026-11-27/18-00-00")
    (other / "metrics.jsonl").write_text('{"step": 1}\n')
    assert remove_unused_run_folder(run_dir) and other.is_dir()


@pytest.mark.parametrize(
    "left", ["metrics.jsonl", "checkpoints/step_000002/meta.json", "notes.txt"]
)
def test_a_folder_with_anything_of_a_run_is_kept(tmp_path, left):
    run_dir = _hydra_made(tmp_path)
    (run_dir / left).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / left).write_text("{}")
    assert not remove_unused_run_folder(run_dir)
    assert (run_dir / left).is_file() and (run_dir / "train.log").is_file()


def test_only_rank_0_removes_and_a_folder_of_the_caller_is_not_guessed(tmp_path, monkeypatch):
    run_dir = _hydra_made(tmp_path)
    monkeypatch.setenv("RANK", "1")
    assert not remove_unused_run_folder(run_dir) and run_dir.is_dir()
    monkeypatch.setenv("RANK", "0")
    assert not remove_unused_run_folder()  # no Hydra run (run() from Python): nothing to remove
    assert run_dir.is_dir()
