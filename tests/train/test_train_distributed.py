"""torchrun with 2 processes on gloo (CPU): DDP equals one process at the same global batch;
FSDP2 trains, checkpoints through torch.distributed.checkpoint and resumes exactly."""

from __future__ import annotations

import json

import pytest
from config_testing import compose
from train_testing import TINY, read_metrics, run_train, step_losses

from flashtrain.checkpoint.read import CheckpointError, find_checkpoints, load_checkpoint
from flashtrain.models import build_model
from flashtrain.train import run

STEPS = ["trainer.max_steps=4", "trainer.eval_interval=0"]


def _approx(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a[k], b[k])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The one-process reference: global batch 8 = micro-batch 4 x 2 accumulation steps, and the
    validation set of two ranks x 4 batches (trainer.eval_batches counts per rank)."""
    tmp = tmp_path_factory.mktemp("single")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import os

    os.environ["FLASHTRAIN_CPU_ATTENTION"] = "torch"
    try:
        out = run(compose(TINY + STEPS + ["trainer.eval_batches=8"]), tmp / "run")
    finally:
        torch.set_num_threads(threads)
    return {s: v for s, v in out["losses"]}, out["evals"][-1][1]


def test_ddp_on_two_processes_matches_one_process(tmp_path, single):
    losses, evals = single
    res = run_train(TINY + STEPS, cwd=tmp_path, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    # one run directory, made by rank 0; the other rank wrote nothing anywhere
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert {p.name for p in tmp_path.iterdir()} == {"outputs"}
    assert (run_dir / ".hydra").is_dir() and (run_dir / "train.log").is_file()
    assert res.stdout.count("the full config:") == 1  # the summary, once
    assert "micro 4 x 2 ranks x 1 accumulation" in res.stdout and "strategy: ddp" in res.stdout
    _approx(step_losses(run_dir / "metrics.jsonl"), losses)
    ddp_evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/loss" in r][-1]
    assert ddp_evals["eval/loss"] == pytest.approx(evals["eval/loss"], rel=1e-5)
    meta = json.loads((run_dir / "checkpoints" / "step_000004" / "meta.json").read_text())
    assert meta["format"] == "torch" and meta["world_size"] == 2


@pytest.mark.slow  # ~41 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_fsdp2_trains_checkpoints_and_resumes(tmp_path, single):
    losses, _ = single
    first = TINY + STEPS + ["trainer.strategy=fsdp", "trainer.ckpt_interval=2"]
    res = run_train(first + ["hydra.run.dir=a"], cwd=tmp_path, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "strategy: fsdp" in res.stdout
    full = step_losses(tmp_path / "a" / "metrics.jsonl")
    _approx(full, losses)  # FSDP2 is the same math as one process
    ckpts = find_checkpoints(tmp_path / "a" / "checkpoints")
    assert [c.step for c in ckpts] == [2, 4]
    meta = json.loads((ckpts[0].path / "meta.json").read_text())
    assert meta["format"] == "dcp" and sorted(p.name for p in ckpts[0].path.glob("*.distcp"))

    resume = first + [f"trainer.resume={ckpts[0].path}", "hydra.run.dir=b"]
    res = run_train(resume, cwd=tmp_path, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stdout
    resumed = step_losses(tmp_path / "b" / "metrics.jsonl")
    assert resumed == {s: full[s] for s in (3, 4)}  # exactly

    # resuming on another number of processes is refused (data and RNG positions are per rank)
    cfg = compose(TINY + STEPS + [f"trainer.resume={ckpts[0].path}"])
    with pytest.raises(CheckpointError, match="--nproc_per_node matching 2"):
        run(cfg, tmp_path / "c")
    # ... but the sharded weights load into a single process through the checkpoint API
    import torch

    cfg = compose(TINY)
    model = build_model(cfg.model, cfg.attention)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters())
    state, meta = load_checkpoint(ckpts[1].path, model=model, optimizer=opt)
    assert state["step"] == 4 and meta["strategy"] == "fsdp"
    assert any(not torch.equal(init[k], v) for k, v in model.state_dict().items())
    assert all(s["step"] == 4 for s in opt.state_dict()["state"].values())
