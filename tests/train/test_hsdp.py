"""trainer.strategy=hsdp: FSDP2 sharded within shard groups of trainer.shard_group_size
consecutive ranks and replicated across them. On 4 gloo ranks as 2 groups of 2 it takes the steps
of FSDP2 over 4 ranks and of one process at the same global batch, with context parallelism too;
its checkpoints resume under fsdp and fsdp's under hsdp; a group size the world cannot take is
one line at start (a dry run too); the memory estimates count a shard group's shards."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from config_testing import compose
from spawn_testing import run_ranks
from train_testing import TINY, read_metrics, run_train, step_losses

from flashtrain.checkpoint import initial_weights
from flashtrain.checkpoint.read import find_checkpoints
from flashtrain.models import build_model
from flashtrain.train import ConfigError, run
from flashtrain.train.config import batch_plan, validate_config
from flashtrain.train.context_parallel import planned_context_parallel as planned_cp
from flashtrain.train.distributed import (
    DistEnv,
    describe_strategy,
    shard_group_size,
    state_shards,
    wrap_model,
)
from flashtrain.train.dry_run import build_memory_for, memory_for, memory_lines
from flashtrain.train.host_memory import estimate_host_peak

STEPS = ["trainer.max_steps=4", "trainer.eval_interval=0"]
# Global batch 8 = micro 2 x 4 ranks (one process: x 4 accumulation steps).
FOUR_RANKS = [o for o in TINY if not o.startswith("micro_batch_size=")] + ["micro_batch_size=2"]
HSDP_2X2 = ["trainer.strategy=hsdp", "trainer.shard_group_size=2"]


def _approx(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a[k], b[k])


def _one_process(overrides: list[str], run_dir) -> dict:
    """A run in this process with one intra-op thread, as each torchrun rank has."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(compose(overrides), run_dir)
    finally:
        torch.set_num_threads(threads)


def _same_start(tmp_path) -> list[str]:
    """model.init_from a CPU-built model's weights: every strategy starts from the same ones
    (fresh weights are drawn per shard, so fsdp over 4 ranks, hsdp's shard groups of 2 and one
    process would each start elsewhere)."""
    cfg = validate_config(compose(TINY))
    torch.manual_seed(cfg.seed)
    path = tmp_path / "initial.pt"
    torch.save(build_model(cfg.model, cfg.attention).state_dict(), path)
    return [f"model.init_from={path}"]


def _last_eval(run_dir) -> float:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/loss" in r][-1]["eval/loss"]


# ---- bad input: one line at start ------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["trainer.shard_group_size=3"],
            "trainer.shard_group_size=3 does not divide the world size 1; allowed with world "
            "size 1 and trainer.context_parallel=1: 1",
        ),
        (
            ["trainer.shard_group_size=0"],
            "trainer.shard_group_size=0 is less than 1; allowed with world size 1 and "
            "trainer.context_parallel=1: 1",
        ),
        (  # the dry run plans a world of 2 for context_parallel=2 (dry_run.planned_world)
            ["trainer.context_parallel=2", "trainer.shard_group_size=1"],
            "trainer.shard_group_size=1 is not a multiple of trainer.context_parallel=2 (a "
            "sequence's ranks shard together); allowed with world size 2 and "
            "trainer.context_parallel=2: 2",
        ),
    ],
)
def test_a_shard_group_the_world_cannot_take_is_one_line_in_the_dry_run(
    overrides, message, tmp_path
):
    cfg = compose(TINY + ["trainer.strategy=hsdp", "trainer.max_steps=0", *overrides])
    with pytest.raises(ConfigError) as e:
        run(cfg, tmp_path / "run")
    assert str(e.value) == message


def test_shard_group_size_is_refused_with_another_strategy(tmp_path):
    cfg = compose(
        TINY + ["trainer.strategy=fsdp", "trainer.shard_group_size=2", "trainer.max_steps=0"]
    )
    with pytest.raises(ConfigError, match=r"^trainer.shard_group_size=2 applies to "
                       r"trainer.strategy=hsdp only \(this run's: fsdp\); drop it"):  # fmt: skip
        run(cfg, tmp_path / "run")


def _trainer(shard_group_size=None, context_parallel=1):
    return SimpleNamespace(shard_group_size=shard_group_size, context_parallel=context_parallel)


def test_the_shard_group_is_the_ranks_per_node_unless_set(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert shard_group_size(_trainer(), 16) == 4  # null: a node's ranks
    assert shard_group_size(_trainer(8), 16) == 8  # set: as set
    assert shard_group_size(_trainer(context_parallel=2), 16) == 4
    # a context-parallel group wider than a node: the group holds whole sequences' ranks
    assert shard_group_size(_trainer(context_parallel=8), 16) == 8
    with pytest.raises(ConfigError) as e:
        shard_group_size(_trainer(), 6)  # 4 ranks per node of a world of 6
    assert str(e.value) == (
        "trainer.shard_group_size=null (the ranks per node, 4) does not divide the world size 6; "
        "allowed with world size 6 and trainer.context_parallel=1: 1, 2, 3, 6"
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"=null \(the ranks per node, 3, raised to a multiple "
                       r"of trainer.context_parallel: 6\) does not divide the world size 4; "
                       r"allowed with world size 4 and trainer.context_parallel=2: 2, 4$"):  # fmt: skip
        shard_group_size(_trainer(context_parallel=2), 4)


def test_the_summary_says_how_hsdp_groups_the_ranks():
    assert describe_strategy("hsdp", _trainer(2), 4) == (
        "hsdp (sharded in 2 groups of 2 consecutive ranks, replicated across them)"
    )
    assert describe_strategy("hsdp", _trainer(4), 4) == (
        "hsdp (one shard group of all 4 ranks: the same as fsdp)"
    )
    assert describe_strategy("fsdp", _trainer(), 4) == "fsdp"


# ---- memory estimates: a shard group's shards ------------------------------------------------


def test_hsdp_memory_is_fsdp_memory_over_one_shard_group():
    """hsdp on 8 ranks in groups of 4 holds per rank what fsdp on 4 ranks does (the states, the
    gathered blocks, the build peak, a CPU host's states), and a quarter of ddp's states."""
    hsdp = validate_config(
        compose(FOUR_RANKS + ["trainer.strategy=hsdp", "trainer.shard_group_size=4"])
    )
    fsdp = validate_config(compose(FOUR_RANKS + ["trainer.strategy=fsdp"]))
    ddp = validate_config(compose(FOUR_RANKS + ["trainer.strategy=ddp"]))
    with torch.device("meta"):
        model = build_model(hsdp.model, hsdp.attention)
    plan8, plan4 = batch_plan(hsdp, 8), batch_plan(fsdp, 4)

    def estimate(cfg, plan):
        return memory_for(
            model, cfg.trainer, plan, cfg.trainer.strategy, planned_cp(cfg, plan.world_size)
        )

    h, f, d = estimate(hsdp, plan8), estimate(fsdp, plan4), estimate(ddp, plan8)
    assert h.states == f.states == d.states / 4 and h.gathered == f.gathered > 0
    assert state_shards("hsdp", hsdp.trainer, 8) == 4 and state_shards("ddp", ddp.trainer, 8) == 1
    assert build_memory_for(model, "hsdp", 4) == build_memory_for(model, "fsdp", 4)
    lines = memory_lines(h, model, plan8, "hsdp", 4)
    assert "params / 4 FSDP2 shards (one shard group; replicated across the groups)" in lines[1]

    def host(cfg, plan):
        return estimate_host_peak(
            model, cfg, plan, precision="fp32", strategy=cfg.trainer.strategy, ranks=1
        )

    assert host(hsdp, plan8).states == host(fsdp, plan4).states == host(ddp, plan8).states / 4


# ---- the mesh and the fresh weights ----------------------------------------------------------


def _fresh_shards(rank: int, world_size: int, cfg, out: str) -> None:
    """One rank of 4: the trainer's hsdp wrapping of the meta model and its fresh weights."""
    env = DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"))
    torch.manual_seed(cfg.seed)
    with torch.device("meta"):
        model = build_model(cfg.model, cfg.attention)
    model = wrap_model(model, "hsdp", env, precision="fp32", trainer_cfg=cfg.trainer)
    initial_weights(model, None, device="cpu")
    mesh = next(model.parameters()).device_mesh
    found = {
        "shards": {name: p.to_local().clone() for name, p in model.named_parameters()},
        "placements": {str(p.placements) for p in model.parameters()},
        "shard_group": dist.get_process_group_ranks(mesh.get_group("shard")),
        "replicas": dist.get_process_group_ranks(mesh.get_group("replicate")),
    }
    torch.save(found, f"{out}/rank{rank}.pt")


def test_hsdp_shards_in_groups_of_consecutive_ranks_and_replicas_start_alike(tmp_path):
    """4 ranks as 2 x 2: shard groups {0, 1} and {2, 3}; ranks 0 and 2 hold the same shard and
    draw the same fresh weights (a replica that started elsewhere would never come back: the
    all-reduce across the groups averages gradients, not weights), while ranks 0 and 1 hold
    different shards."""
    cfg = validate_config(compose(TINY + HSDP_2X2))
    run_ranks(_fresh_shards, 4, tmp_path, cfg, str(tmp_path))
    found = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    assert [f["shard_group"] for f in found] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [f["replicas"] for f in found] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert found[0]["placements"] == {"(Replicate(), Shard(dim=0))"}
    for a, b in ((0, 2), (1, 3)):
        for name, shard in found[a]["shards"].items():
            assert torch.equal(shard, found[b]["shards"][name]), (a, b, name)
    first = found[0]["shards"]["blocks.0.mlp.c_fc.weight"]
    assert not torch.equal(first, found[1]["shards"]["blocks.0.mlp.c_fc.weight"])


# ---- one process: the same as fsdp -----------------------------------------------------------


def test_hsdp_in_one_process_is_fsdp_and_says_so(tmp_path, caplog):
    caplog.set_level("INFO", logger="flashtrain")
    steps = ["trainer.max_steps=2", "trainer.eval_interval=0", "trainer.eval_at_end=false"]
    fsdp = _one_process(TINY + steps + ["trainer.strategy=fsdp"], tmp_path / "fsdp")
    hsdp = _one_process(TINY + steps + ["trainer.strategy=hsdp"], tmp_path / "hsdp")
    assert "strategy: hsdp (one shard group of all 1 rank: the same as fsdp)" in caplog.text
    assert dict(hsdp["losses"]) == dict(fsdp["losses"])  # the same math, bit for bit
    meta = json.loads((tmp_path / "hsdp" / "checkpoints" / "step_000002" / "meta.json").read_text())
    assert meta["format"] == "dcp" and meta["strategy"] == "hsdp"


# ---- 4 ranks as 2 x 2 ------------------------------------------------------------------------


@pytest.mark.slow  # ~110 s on 2 busy cores: four 4-process torchrun runs
def test_hsdp_on_four_ranks_is_fsdp_and_one_process_and_shares_checkpoints(tmp_path):
    first = FOUR_RANKS + STEPS + ["trainer.ckpt_interval=2"] + _same_start(tmp_path)
    single = _one_process(first, tmp_path / "single")
    res = run_train(first + HSDP_2X2 + ["hydra.run.dir=hsdp"], cwd=tmp_path, nproc=4)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "micro 2 x 4 ranks x 1 accumulation" in res.stdout
    assert "strategy: hsdp (sharded in 2 groups of 2 consecutive ranks" in res.stdout
    res = run_train(first + ["trainer.strategy=fsdp", "hydra.run.dir=fsdp"], cwd=tmp_path, nproc=4)
    assert res.returncode == 0, res.stderr[-3000:]
    hsdp = step_losses(tmp_path / "hsdp" / "metrics.jsonl")
    fsdp = step_losses(tmp_path / "fsdp" / "metrics.jsonl")
    assert len(hsdp) == 4
    _approx(hsdp, fsdp)
    _approx(hsdp, dict(single["losses"]))
    # the sharded evaluation: every rank's validation batches, as fsdp reads them
    assert _last_eval(tmp_path / "hsdp") == pytest.approx(_last_eval(tmp_path / "fsdp"), rel=1e-5)

    hsdp_ckpt = find_checkpoints(tmp_path / "hsdp" / "checkpoints")[0].path
    meta = json.loads((hsdp_ckpt / "meta.json").read_text())
    assert meta["format"] == "dcp" and meta["strategy"] == "hsdp" and meta["world_size"] == 4
    fsdp_ckpt = find_checkpoints(tmp_path / "fsdp" / "checkpoints")[0].path
    # hsdp's checkpoint continues under fsdp, and fsdp's under hsdp, as the runs did unbroken
    for ckpt, strategy, uninterrupted, name in (
        (hsdp_ckpt, ["trainer.strategy=fsdp"], fsdp, "fsdp_from_hsdp"),
        (fsdp_ckpt, HSDP_2X2, hsdp, "hsdp_from_fsdp"),
    ):
        resume = first + strategy + [f"trainer.resume={ckpt}", f"hydra.run.dir={name}"]
        res = run_train(resume, cwd=tmp_path, nproc=4)
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"resumed from {ckpt} at step 2" in res.stdout
        _approx(
            step_losses(tmp_path / name / "metrics.jsonl"), {s: uninterrupted[s] for s in (3, 4)}
        )


@pytest.mark.slow  # ~72 s on 2 busy cores: two 4-process torchrun runs
def test_hsdp_with_context_parallelism_is_fsdp_with_it(tmp_path):
    """context_parallel=2 on 4 ranks: 2 data-parallel groups of 2 ranks splitting each sequence;
    hsdp with shard groups of 2 shards each parameter over a sequence's two ranks and
    replicates it across the data-parallel groups."""
    start = _same_start(tmp_path)
    args = TINY + STEPS + start + ["trainer.context_parallel=2"]
    single = _one_process(TINY + STEPS + start, tmp_path / "single")
    res = run_train(args + HSDP_2X2 + ["hydra.run.dir=hsdp"], cwd=tmp_path, nproc=4)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "each sequence split over 2 ranks" in res.stdout
    assert "strategy: hsdp (sharded in 2 groups of 2 consecutive ranks" in res.stdout
    res = run_train(args + ["trainer.strategy=fsdp", "hydra.run.dir=fsdp"], cwd=tmp_path, nproc=4)
    assert res.returncode == 0, res.stderr[-3000:]
    hsdp = step_losses(tmp_path / "hsdp" / "metrics.jsonl")
    assert len(hsdp) == 4
    _approx(hsdp, step_losses(tmp_path / "fsdp" / "metrics.jsonl"))
    _approx(hsdp, dict(single["losses"]))
