"""Faults: NaN/inf losses (stop or skip), SIGTERM (checkpoint, then stop), CUDA OOM advice."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from config_testing import REPO, compose
from train_testing import TINY, free_port, read_metrics, subprocess_env

import flashtrain.models
import flashtrain.train.context_parallel
from flashtrain.checkpoint.read import find_checkpoints
from flashtrain.train import run, validate_config
from flashtrain.train.entry import EXIT_PREEMPTED
from flashtrain.train.faults import (
    NonFiniteLossError,
    Preempted,
    PreemptionHandler,
    is_out_of_memory,
    oom_advice,
)


def _tiny(tmp_path, *extra):
    return compose(TINY + list(extra))


def _patch_forward(monkeypatch, transform, *, training=True):
    """Wrap the built model's forward: transform(call_index, output) -> output, for the
    training forward passes (training=False: the evaluation's)."""
    real = flashtrain.models.build_model
    calls = {"n": 0}

    def build(model_cfg, attention_cfg):
        model = real(model_cfg, attention_cfg)
        forward = model.forward

        def patched(**batch):
            out = forward(**batch)
            if model.training == training:
                calls["n"] += 1
                out = transform(calls["n"], out)
            return out

        model.forward = patched
        return model

    monkeypatch.setattr(flashtrain.train.context_parallel, "build_model", build)


def _nan_at_step(step, accum=2):
    def transform(call, out):
        if (call - 1) // accum + 1 == step:
            return dataclasses.replace(out, loss=out.loss * float("nan"))
        return out

    return transform


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    _patch_forward(monkeypatch, _nan_at_step(3))
    cfg = _tiny(tmp_path, "trainer.max_steps=6", "trainer.ckpt_interval=2")
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 3") as err:
        run(cfg, tmp_path / "run")
    assert "step_000002" in str(err.value)
    assert [c.step for c in find_checkpoints(tmp_path / "run" / "checkpoints")] == [2]


def test_nan_loss_skip_mode_drops_the_update_and_goes_on(tmp_path, monkeypatch, caplog):
    _patch_forward(monkeypatch, _nan_at_step(3))
    cfg = _tiny(tmp_path, "trainer.max_steps=5", "trainer.on_nonfinite=skip")
    out = run(cfg, tmp_path / "run")
    assert out["step"] == 5 and [s for s, _ in out["losses"]] == [1, 2, 4, 5]
    assert "step 3: non-finite loss" in caplog.text
    params = torch.load(
        tmp_path / "run" / "checkpoints" / "step_000005" / "model_optim.pt", weights_only=True
    )["model"]
    assert all(torch.isfinite(v).all() for v in params.values())


def test_too_many_skips_in_a_row_stop(tmp_path, monkeypatch):
    _patch_forward(
        monkeypatch, lambda call, out: dataclasses.replace(out, loss=out.loss * torch.inf)
    )
    cfg = _tiny(
        tmp_path, "trainer.max_steps=9", "trainer.on_nonfinite=skip", "trainer.max_skipped_steps=2"
    )
    with pytest.raises(NonFiniteLossError, match="at step 3"):
        run(cfg, tmp_path / "run")


def test_preemption_handler_sets_a_flag_and_restores():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionHandler() as h:
        assert not h.requested
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            if h.requested:
                break
            time.sleep(0.01)
        assert h.requested and h.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_in_process_writes_a_checkpoint_and_stops(tmp_path, monkeypatch):
    sent = []

    def transform(call, out):
        if call == 5 and not sent:  # during step 3 (2 micro-batches per step)
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    _patch_forward(monkeypatch, transform)
    # the schedule pinned to the 5-step run's, which resumes it below
    cfg = _tiny(tmp_path, "trainer.max_steps=50", "optim.decay_steps=5", "trainer.ckpt_interval=0")
    with pytest.raises(Preempted, match="stopped by SIGTERM after step 3") as err:
        run(cfg, tmp_path / "run")
    assert err.value.step == 3
    assert [c.step for c in find_checkpoints(tmp_path / "run" / "checkpoints")] == [3]
    full = run(_tiny(tmp_path, "trainer.max_steps=5"), tmp_path / "full")
    resumed = run(_tiny(tmp_path, "trainer.max_steps=5", "trainer.resume=auto"), tmp_path / "run")
    assert resumed["losses"] == full["losses"][3:]


def test_sigterm_during_an_evaluation_abandons_it_checkpoints_and_stops(tmp_path, monkeypatch):
    """A scheduler's SIGTERM during an evaluation at a step without a checkpoint: the
    evaluation stops at its next batch (it used to run on, and a long one into the scheduler's
    SIGKILL), the step is checkpointed and the run stops; the resume is exact."""
    evaluated = []

    def transform(call, out):
        evaluated.append(call)
        if call == 2:  # the evaluation's second batch of 20
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    _patch_forward(monkeypatch, transform, training=False)
    steps = ["optim.decay_steps=5", "trainer.eval_interval=3", "trainer.eval_at_end=false"]
    cfg = _tiny(tmp_path, *steps, "trainer.max_steps=50", "trainer.eval_batches=20")
    with pytest.raises(Preempted, match="stopped by SIGTERM after step 3"):
        run(cfg, tmp_path / "run")
    assert evaluated == [1, 2]  # no batch after the signal
    assert [c.step for c in find_checkpoints(tmp_path / "run" / "checkpoints")] == [3]
    full = run(_tiny(tmp_path, *steps, "trainer.max_steps=5"), tmp_path / "full")
    resume = ["trainer.max_steps=5", "trainer.resume=auto"]
    resumed = run(_tiny(tmp_path, *steps, *resume), tmp_path / "run")
    assert resumed["losses"] == full["losses"][3:]


@pytest.mark.slow  # ~31 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_sigterm_to_the_command(tmp_path):
    args = TINY + ["trainer.max_steps=100000", "trainer.ckpt_interval=0", "hydra.run.dir=out"]
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tmp_path / "out" / "metrics.jsonl"
    deadline = time.monotonic() + 300  # a hang guard: the third step comes in seconds
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no third step before the signal:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_PREEMPTED, output[-2000:]
    (ckpt,) = find_checkpoints(tmp_path / "out" / "checkpoints")
    assert ckpt.step >= 3 and ckpt.step == read_metrics(metrics)[-1]["step"]
    assert f"stopped by SIGTERM after step {ckpt.step}" in output
    assert f"pre-empted at step {ckpt.step}, checkpoint {ckpt.path} written, exit 143" in output
    assert "trainer.resume=auto" in output


@pytest.mark.slow  # ~40 s on 2 busy cores: two ranks under torchrun
def test_sigterm_to_one_rank_during_an_evaluation_stops_every_rank(tmp_path):
    """SIGTERM to one rank of two while they evaluate (100000 batches a rank: minutes): the
    ranks vote before each batch, so both leave the evaluation at the same batch, checkpoint
    step 2 together and exit 143 (one rank alone in the save's collectives would hang)."""
    args = TINY + [
        "trainer.max_steps=100",
        "trainer.ckpt_interval=0",
        "trainer.eval_interval=2",
        "trainer.eval_batches=100000",
        "hydra.run.dir=out",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    proc = subprocess.Popen(
        [*torchrun, f"--master_port={free_port()}", str(REPO / "train.py"), *args],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        metrics = tmp_path / "out" / "metrics.jsonl"
        deadline = time.time() + 300  # a hang guard: the row comes in seconds
        # step 2's row is written after its stop vote and before its evaluation
        while not (metrics.exists() and any(r["step"] == 2 for r in read_metrics(metrics))):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.1)
        children = Path("/proc") / str(proc.pid) / "task" / str(proc.pid) / "children"
        workers = [int(pid) for pid in children.read_text().split()]
        assert len(workers) == 2
        os.kill(workers[-1], signal.SIGTERM)  # one rank's scheduler signal
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    (ckpt,) = find_checkpoints(tmp_path / "out" / "checkpoints")
    assert ckpt.step == 2, output[-3000:]
    assert "eval at step 2: evaluation abandoned after" in output
    for rank in (0, 1):
        line = f"rank {rank}/2: pre-empted at step 2, checkpoint {ckpt.path} written, exit 143"
        assert line in output, output[-3000:]


def test_oom_advice_names_the_overrides():
    cfg = validate_config(compose(["micro_batch_size=8", "trainer.strategy=ddp"]))
    text = oom_advice(cfg, torch.device("cuda"), RuntimeError("CUDA out of memory. Tried 2 GiB"))
    assert text.startswith("CUDA out of memory") and "Tried 2 GiB" in text
    for hint in ("model.recompute=all", "micro_batch_size=4", "trainer.strategy=fsdp", "seq_len="):
        assert hint in text
    text = oom_advice(cfg, torch.device("cpu"), RuntimeError(HOST_OOM))
    assert text.startswith("out of host memory: [enforce fail")
    assert "micro_batch_size=4" in text and "fsdp" not in text  # ranks on one host share it
    cfg = validate_config(
        compose(["micro_batch_size=1", "model.recompute=all", "trainer.strategy=fsdp"])
    )
    text = oom_advice(cfg, torch.device("cpu"))
    assert "model.recompute=all" not in text and "micro_batch_size=" not in text


HOST_OOM = (
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
    "tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)"
)


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        RuntimeError(HOST_OOM),
    ],
    ids=["cuda", "host"],
)
def test_oom_during_a_step_prints_the_advice(tmp_path, monkeypatch, caplog, error):
    def transform(call, out):
        raise error

    _patch_forward(monkeypatch, transform)
    with pytest.raises(type(error)):
        run(_tiny(tmp_path, "trainer.max_steps=3"), tmp_path / "run")
    assert "To use less memory" in caplog.text and "model.recompute=all" in caplog.text
    assert is_out_of_memory(error) and not is_out_of_memory(RuntimeError("a bug"))
