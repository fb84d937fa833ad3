"""scripts/slurm/train.sbatch on a real Slurm: a job stopped early checkpoints, is requeued, and
its next start continues the same run, ending with the weights of a run never stopped.

A one-node Slurm runs on this machine for the module (slurm_cluster.py: munged, slurmctld and
slurmd in a temporary folder, torn down at the end, failed or not). Each test submits the
shipped script on experiment=cpu/tiny (12 steps, a checkpoint every 2) with paused_train.py in
place of train.py: the first start waits before step 6 until its ranks are asked to stop, so
the test acts while the run is at a known step; a requeued start does not wait. Checked:

- `scontrol requeue` (what pre-emption does), one rank: Slurm's SIGTERM reaches the rank through
  srun and torchrun's agent, the rank checkpoints after step 6 and exits 143, Slurm requeues;
- the time-limit warning (`#SBATCH --signal=B:USR1@300`, brought due by shortening the job's
  time limit), two ranks: the batch shell has both checkpoint, then requeues the job itself;

each ending in one run folder whose metrics.jsonl has every step once, whose train.log says it
resumed from step 6's checkpoint, and whose final weights equal bit for bit (CPU, one thread)
those of the same config trained without Slurm and never stopped (`python train.py`, or
torchrun with the job's two ranks), run while the job waits.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
from config_testing import REPO
from slurm_cluster import LocalSlurm, missing_requirements
from train_testing import free_port, read_metrics, run_train, subprocess_env

from flashtrain.checkpoint import load_model
from flashtrain.checkpoint.read import find_checkpoints
from flashtrain.train.metric_names import TRAIN_LOSS

pytestmark = pytest.mark.skipif(
    missing_requirements() is not None, reason=str(missing_requirements())
)

SBATCH_SCRIPT = REPO / "scripts" / "slurm" / "train.sbatch"
PAUSED_TRAIN = Path(__file__).with_name("paused_train.py")
MAX_STEPS = 12
PAUSE_AFTER_STEP = 5  # checkpoints at 2 and 4 written; the stop's checkpoint is step 6's
OVERRIDES = [
    "experiment=cpu/tiny",
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.ckpt_interval=2",
    "trainer.device=cpu",
    "logger=none",
    "trainer.log_interval=1",
    "trainer.progress=lines",
]
# Hang guards for a busy machine (a start of train.py takes 10-30 s there), never waited out
# when things work.
JOB_TIMEOUT = 600
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, request):
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2)
    request.addfinalizer(cluster.stop)  # before start(): a half-started cluster is stopped too
    return cluster.start()


def _env(**extra: str) -> dict[str, str]:
    """A run's environment (one thread, PyTorch attention) without an enclosing job's SLURM_*."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("SLURM_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def _submit(slurm: LocalSlurm, folder: Path, nproc: int, sbatch_options=()) -> str:
    """The shipped script on OVERRIDES, submitted from `folder` (outputs/ is made there)."""
    folder.mkdir()
    env = _env(
        SLURM_CONF=str(slurm.conf),
        FLASHTRAIN_TRAIN_PY=str(PAUSED_TRAIN),
        FLASHTRAIN_NPROC_PER_NODE=str(nproc),
        FLASHTRAIN_RDZV_PORT=str(free_port()),
        PAUSE_AFTER_STEP=str(PAUSE_AFTER_STEP),
        PAUSE_MARKER=str(folder / "paused"),
    )
    return slurm.sbatch([*sbatch_options, str(SBATCH_SCRIPT), *OVERRIDES], cwd=folder, env=env)


def _job_log(folder: Path, job_id: str) -> str:
    path = folder / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _wait(condition, what: str, slurm: LocalSlurm, folder: Path, job_id: str) -> None:
    """Poll until condition() holds; fail with the job's log if the job ends without it (or
    after JOB_TIMEOUT, a hang guard)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not condition():
        state = slurm.job(job_id).get("JobState")
        if (state in ENDED and not condition()) or time.monotonic() > deadline:
            pytest.fail(
                f"job {job_id} ({state}): {what} did not happen\n"
                f"{_job_log(folder, job_id)[-4000:]}\n--- slurmctld.log\n{slurm.log_tail()}"
            )
        time.sleep(0.2)


def _wait_paused(slurm, folder, job_id) -> Path:
    """Wait for the first start to wait before step 6; returns its run folder."""
    _wait((folder / "paused").exists, "the pause before step 6", slurm, folder, job_id)
    (run_dir,) = _run_folders(folder)
    steps = [c.step for c in find_checkpoints(run_dir / "checkpoints")]
    assert steps == [2, 4], steps
    return run_dir


def _wait_done(slurm, folder, job_id) -> dict[str, str]:
    _wait(
        lambda: slurm.job(job_id).get("JobState") == "COMPLETED",
        "the end of the job",
        slurm,
        folder,
        job_id,
    )
    return slurm.job(job_id)


def _run_folders(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "outputs").glob("*/*") if p.is_dir())


def _reference_run(folder: Path, nproc: int) -> Path:
    """The same config trained without Slurm and never stopped: `python train.py`, or torchrun
    with `nproc` ranks."""
    folder.mkdir()
    launcher = nproc if nproc > 1 else 0  # 0: python train.py
    res = run_train(OVERRIDES, cwd=folder, timeout=JOB_TIMEOUT, nproc=launcher, env=_env())
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    (run_dir,) = _run_folders(folder)
    return run_dir


def _assert_continued_to_the_end(run_dir: Path, reference: Path, log: str) -> None:
    """One run folder trained each step once, resumed from step 6's checkpoint, and ended with
    the reference's weights exactly."""
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if TRAIN_LOSS in r]
    assert steps == list(range(1, MAX_STEPS + 1)), steps
    train_log = (run_dir / "train.log").read_text()
    resumed = f"resumed from {run_dir / 'checkpoints' / 'step_000006'} at step 6"
    assert resumed in train_log, (train_log + log)[-4000:]
    assert "pre-empted at step 6" in log, log[-4000:]
    got, got_info = load_model(run_dir)
    want, want_info = load_model(reference)
    assert got_info.step == want_info.step == MAX_STEPS
    got_state, want_state = got.state_dict(), want.state_dict()
    assert sorted(got_state) == sorted(want_state)
    for name, value in want_state.items():
        assert torch.equal(got_state[name], value), name


@pytest.mark.slow  # ~45-100 s on 2 busy cores: a Slurm job started twice, a reference run
def test_a_requeued_job_continues_its_run(slurm, tmp_path):
    folder = tmp_path / "submit"
    job_id = _submit(slurm, folder, nproc=1)
    run_dir = _wait_paused(slurm, folder, job_id)
    reference = _reference_run(tmp_path / "reference", nproc=1)  # while the job waits
    slurm.run(["scontrol", "requeue", job_id])
    job = _wait_done(slurm, folder, job_id)
    log = _job_log(folder, job_id)
    assert job["Restarts"] == "1" and job["ExitCode"] == "0:0", job
    assert "DUE TO JOB REQUEUE" in log
    assert _run_folders(folder) == [run_dir]
    _assert_continued_to_the_end(run_dir, reference, log)


@pytest.mark.slow  # ~70-100 s on 2 busy cores: 2 ranks started twice, a reference run
def test_the_time_limit_warning_checkpoints_and_requeues(slurm, tmp_path):
    folder = tmp_path / "submit"
    job_id = _submit(slurm, folder, nproc=2, sbatch_options=["--time=30"])
    run_dir = _wait_paused(slurm, folder, job_id)
    reference = _reference_run(tmp_path / "reference", nproc=2)  # while the job waits
    # 5 minutes in all: the script's warning 300 s before the end is due at once (slurmctld
    # looks at time limits every few seconds).
    slurm.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=5"])
    warned = "the time limit is near"
    _wait(lambda: warned in _job_log(folder, job_id), "the warning", slurm, folder, job_id)
    # The warning is sent once a start: the requeued start gets the full 30 minutes back, not
    # another warning at once.
    slurm.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=30"])
    job = _wait_done(slurm, folder, job_id)
    log = _job_log(folder, job_id)
    assert job["Restarts"] == "1" and job["ExitCode"] == "0:0", job
    assert "rank 0/2: pre-empted at step 6" in log and "rank 1/2: pre-empted at step 6" in log
    assert f"requeueing job {job_id}" in log
    assert _run_folders(folder) == [run_dir]
    _assert_continued_to_the_end(run_dir, reference, log)
