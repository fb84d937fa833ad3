"""What a run leaves in outputs/: a refused run or a dry run leaves no folder (Hydra made one for
its log before the run was refused); a folder with anything of a run's in it is never removed."""

from __future__ import annotations

import pytest
from train_testing import TINY, run_train

from flashtrain.train.entry import EXIT_USER_ERROR, remove_unused_run_folder, run_log_size


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


def test_a_folder_whose_log_an_earlier_run_wrote_is_kept(tmp_path):
    run_dir = _hydra_made(tmp_path)
    assert not remove_unused_run_folder(run_dir, earlier_log=run_log_size(run_dir))
    assert (run_dir / "train.log").read_text() == "refused\n"
    (run_dir / "train.log").write_text("")  # Hydra's file handler made it for this run
    assert run_log_size(run_dir) == 0 and remove_unused_run_folder(run_dir, earlier_log=0)


def test_a_refused_rerun_keeps_the_crash_log_of_the_run_before(tmp_path):
    """A run crashed at start (its traceback in train.log); the rerun into the same folder is
    refused: the folder and the traceback stay."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    crash = "crashed: RuntimeError: CUDA error: an illegal memory access\nTraceback ...\n"
    (run_dir / "train.log").write_text(crash)
    res = run_train([*TINY, "optim.lr=-1", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert res.returncode == EXIT_USER_ERROR, res.stderr[-2000:]
    log = (run_dir / "train.log").read_text()
    assert log.startswith(crash) and "optim.lr must be > 0" in log
