"""A restarted job continues its run (flashtrain/train/job_run.py): torchrun's elastic agent
restarting its workers after one was killed (SIGKILL, right after a checkpoint) ends with one run
folder, each step in metrics.jsonl once, and the weights of a run that was never interrupted, bit
for bit; the job identity and the run-folder rule on their own; a restart whose config differs
from its run is refused as a resume is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_testing import TINY, read_metrics, subprocess_env

from flashtrain.checkpoint.read import CheckpointError, find_checkpoints
from flashtrain.checkpoint.run_info import RUN_INFO_FILE
from flashtrain.train.job_run import Job, continues_job_run, current_job, find_job_run, job_run_dir

HERE = Path(__file__).resolve().parent
KILLER = HERE / "kill_after_checkpoint.py"
STEPS = ["trainer.max_steps=6", "trainer.ckpt_interval=2", "trainer.eval_interval=0"]


# ---- the job and its run folder, from the environment --------------------------------------


@pytest.mark.parametrize(
    ("environ", "want"),
    [
        ({}, None),
        ({"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}, Job("torchrun:abc", 0, True)),
        ({"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "2"}, Job("torchrun:none", 2, False)),
        ({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}, Job("slurm:77", 1, True)),
        # torchrun inside Slurm: one job, the Slurm one; a torchrun restart is its restart
        (
            {"SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "77", "TORCHELASTIC_RESTART_COUNT": "1"},
            Job("slurm:77", 1, True),
        ),
        ({"SLURM_JOB_ID": "81", "SLURM_ARRAY_JOB_ID": "80", "SLURM_ARRAY_TASK_ID": "3"}, Job("slurm:80_3", 0, True)),
        ({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "x"}, Job("slurm:77", 0, True)),
    ],
)  # fmt: skip
def test_the_job_comes_from_slurm_first_then_torchrun(environ, want):
    assert current_job(environ, argv=[]) == want
    if want is not None:
        assert current_job(environ, argv=["seed=2"]).command == ("seed=2",)


def _run_folder(root: Path, name: str, job: str | None, command=("seed=1",)) -> Path:
    folder = root / "2026-12-01" / name
    folder.mkdir(parents=True)
    (folder / RUN_INFO_FILE).write_text(json.dumps({"job": job, "job_command": list(command)}))
    return folder


def test_a_job_finds_the_run_folder_it_recorded_and_an_unnamed_one_only_in_a_restart(tmp_path):
    root = tmp_path / "outputs"
    _run_folder(root, "10-00-00", "slurm:5")
    mine = _run_folder(root, "11-00-00", "slurm:7")
    _run_folder(root, "11-30-00", "slurm:7", command=("seed=2",))  # the job's next run
    unnamed = _run_folder(root, "12-00-00", "torchrun:none")
    (root / "2026-12-01" / "13-00-00").mkdir()  # a folder without run.json
    (root / "2026-12-01" / "14-00-00").mkdir()
    (root / "2026-12-01" / "14-00-00" / RUN_INFO_FILE).write_text("[not a run's")
    cmd = ("seed=1",)
    assert find_job_run(root, Job("slurm:7", 1, True, cmd)) == mine
    assert find_job_run(root, Job("slurm:7", 0, True, cmd)) == mine  # the Slurm job seen again
    assert find_job_run(root, Job("slurm:7", 1, True, ("seed=3",))) is None  # another command
    assert find_job_run(root, Job("slurm:8", 1, True, cmd)) is None
    assert find_job_run(root, Job("torchrun:none", 0, False, cmd)) is None  # a new launch
    assert find_job_run(root, Job("torchrun:none", 1, False, cmd)) == unnamed
    assert continues_job_run(mine, Job("slurm:7", 1, True, cmd))
    assert not continues_job_run(mine, Job("slurm:7", 1, True, ("seed=2",)))
    assert not continues_job_run(mine, Job("slurm:5", 1, True, cmd))
    assert not continues_job_run(mine, None)


def test_the_resolver_gives_a_first_start_a_fresh_folder(tmp_path, monkeypatch):
    root = tmp_path / "outputs"
    mine = _run_folder(root, "11-00-00", "slurm:7")
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    assert job_run_dir(str(root), "2026-12-02/09-00-00") == str(root / "2026-12-02/09-00-00")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setattr("sys.argv", ["train.py", "seed=1"])
    assert job_run_dir(str(root), "2026-12-02/09-00-00") == str(mine)


# ---- torchrun --max-restarts: a killed worker, the job restarted -------------------------------


def _torchrun(args: list[str], cwd: Path, *, nproc: int, env: dict, script: Path, restarts=0):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", f"--max-restarts={restarts}", "--monitor-interval=0.2",
        str(script), *args,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    last = find_checkpoints(run_dir / "checkpoints")[-1]
    return torch.load(last.path / "model_optim.pt", map_location="cpu", weights_only=True)["model"]


def _restart_continues_the_run(tmp_path: Path, nproc: int, strategy: str) -> None:
    args = [*TINY, *STEPS, f"trainer.strategy={strategy}"]
    if strategy == "ddp":
        args.append(f"micro_batch_size={8 // nproc}")
    env = subprocess_env(KILL_AFTER_STEP="4", KILL_RANK=str(nproc - 1))
    killed = tmp_path / "killed"
    killed.mkdir()
    res = _torchrun(args, killed, nproc=nproc, env=env, script=KILLER, restarts=1)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    (run_dir,) = (killed / "outputs").glob("*/*")  # one run folder, the restart's too
    log = (run_dir / "train.log").read_text()
    assert "(restart 1) continues its run: resuming from" in log
    assert f"{run_dir / 'checkpoints' / 'step_000004'}, the newest intact" in log
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # each step once
    info = json.loads((run_dir / RUN_INFO_FILE).read_text())
    assert info["job"].startswith("torchrun:") and info["job_restart"] == 1
    assert info["start_step"] == 4

    whole = tmp_path / "whole"
    whole.mkdir()
    res = _torchrun(
        args, whole, nproc=nproc, env=subprocess_env(), script=HERE.parents[1] / "train.py"
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    (reference,) = (whole / "outputs").glob("*/*")
    want, got = _final_weights(reference), _final_weights(run_dir)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name  # bit for bit


def test_a_torchrun_restart_continues_the_run_folder_and_its_weights(tmp_path):
    """One worker (of one) killed after the step-4 checkpoint; torchrun restarts it."""
    _restart_continues_the_run(tmp_path, nproc=1, strategy="auto")


@pytest.mark.slow  # ~40 s on 2 busy cores: two 2-rank torchrun jobs and a restart
def test_a_torchrun_restart_of_two_ddp_ranks_continues_the_run(tmp_path):
    """Rank 1 of two killed after the step-4 checkpoint: the agent stops rank 0 and restarts
    both; the run continues from step 4 as the issue's user saw it fail to."""
    _restart_continues_the_run(tmp_path, nproc=2, strategy="ddp")


def test_a_restart_with_another_config_is_refused_naming_the_field(tmp_path, monkeypatch):
    """A job's restart is a resume: a config the checkpoint cannot continue is refused (a
    restart repeats its command line, but a preset it names may have been edited meanwhile)."""
    from config_testing import compose

    from flashtrain.train import run

    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    run_dir = tmp_path / "run"
    first = [*TINY, "trainer.max_steps=2", "trainer.eval_interval=0", "trainer.eval_at_end=false"]
    run(compose(first), run_dir)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(CheckpointError, match="d_model") as refused:
        run(compose([*first, "model.d_model=32"]), run_dir)
    assert "step_000002" in str(refused.value)
    assert os.path.isdir(run_dir / "checkpoints" / "step_000002")
