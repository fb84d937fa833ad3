"""micro_batch_size=auto: the largest micro-batch the memory plan fits in the GPU (a stand-in
device size here), capped by a rank's share of the global batch; 8 on a CPU run; the summary
says what it chose and why."""

from __future__ import annotations

import random

import pytest
import torch
from config_testing import compose
from train_testing import TINY

from flashtrain.train import ConfigError, batch_sizing, run
from flashtrain.train.batch_sizing import (
    ESTIMATE_FACTOR,
    MARGIN,
    DeviceMemory,
    auto_micro_batch,
    choose_micro_batch,
)
from flashtrain.train.config import AUTO_MICRO_BATCH_CPU, validate_config
from flashtrain.train.dry_run import memory_for, plan_world
from flashtrain.train.faults import oom_advice

GIB = 2**30
GPT2_1K = ["model=gpt2", "seq_len=1024", "global_batch_size=null", "global_batch_tokens=65536"]


def _brute_force(share, needs, free):
    fits = [
        d
        for d in range(1, share + 1)
        if share % d == 0 and needs(d) * ESTIMATE_FACTOR <= free * (1 - MARGIN)
    ]
    return max(fits, default=1)


def test_the_largest_divisor_that_fits_matches_a_brute_force_search():
    rng = random.Random(0)
    for _ in range(300):
        share = rng.randint(1, 200)
        fixed, per_seq = rng.uniform(0, 5) * GIB, rng.uniform(0.01, 2) * GIB
        free = rng.uniform(1, 140) * GIB
        calls = []

        def needs(micro, calls=calls, fixed=fixed, per_seq=per_seq):
            calls.append(micro)
            return fixed + per_seq * micro

        choice = choose_micro_batch(share, needs, DeviceMemory(free, "a stand-in GPU"))
        assert choice.micro_batch_size == _brute_force(share, needs, free), (share, free)
        assert share % choice.micro_batch_size == 0
        assert len(set(calls)) <= 2 + share.bit_length() * 2  # bisection, not every candidate


def test_the_choice_says_what_it_chose_and_what_did_not_fit():
    def needs(micro):
        return micro * GIB

    choice = choose_micro_batch(64, needs, DeviceMemory(40 * GIB, "a 40 GiB stand-in"))
    # 40 GiB x 0.9 / 1.25 = 28.8 GiB: 16 sequences fit, 32 do not
    assert choice.micro_batch_size == 16 and choice.refused == (32, 32 * GIB)
    text = choice.describe()
    assert "micro_batch_size=auto: 16 (the largest that fits" in text
    assert "32 would need 32.0 GiB" in text and "a 40 GiB stand-in" in text

    whole = choose_micro_batch(8, needs, DeviceMemory(40 * GIB, "a 40 GiB stand-in"))
    assert whole.micro_batch_size == 8 and whole.refused is None
    assert "a rank's whole share of the global batch" in whole.describe()

    none = choose_micro_batch(8, lambda m: 100 * GIB, DeviceMemory(40 * GIB, "a 40 GiB stand-in"))
    assert none.micro_batch_size == 1 and not none.fits
    assert "it may not fit" in none.describe() and "model.recompute=all" in none.describe()


def _world_and_model(overrides):
    from flashtrain.models import build_model
    from flashtrain.train.distributed import DistEnv

    cfg = validate_config(compose(overrides))
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    world = plan_world(cfg, env, dry_run=True)
    with torch.device("meta"):
        model = build_model(cfg.model, cfg.attention)
    return cfg, world, model


@pytest.mark.parametrize("gib", [12, 24, 80, 141])
def test_auto_fits_the_memory_plan_in_a_stand_in_device(gib):
    cfg, world, model = _world_and_model(GPT2_1K)

    def memory_of(plan):
        return memory_for(model, cfg.trainer, plan, world.strategy, world.cp)

    device = DeviceMemory(gib * GIB, f"a {gib} GiB stand-in")
    sized, choice = auto_micro_batch(cfg, world, memory_of, device)
    micro = sized.plan.micro_batch_size
    assert micro == choice.micro_batch_size and sized.plan.tokens_per_step == 65536
    assert micro * sized.plan.grad_accum == 64  # the global batch is kept
    budget = device.free * (1 - MARGIN)
    assert memory_of(sized.plan).total * ESTIMATE_FACTOR <= budget
    if micro < 64:  # the next divisor of the share would not fit
        bigger = sized.plan.__class__(1024, micro * 2, 1, 64 // (micro * 2))
        assert memory_of(bigger).total * ESTIMATE_FACTOR > budget


def test_a_dry_run_sizes_for_the_planned_gpu_and_says_so(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(batch_sizing, "ASSUMED_GPU_MEMORY", 16 * GIB)
    caplog.set_level("INFO", logger="flashtrain")
    out = run(compose([*GPT2_1K, "trainer.max_steps=0", "logger=none"]), tmp_path / "run")
    assert out["dry_run"]
    line = next(x for x in caplog.text.splitlines() if x.startswith("micro_batch_size=auto"))
    assert "an H100's 16.0 GiB (assumed: no GPU here)" in line
    micro = int(line.split(":")[1].split("(")[0])
    assert f"micro {micro} x 1 ranks x {64 // micro} accumulation" in caplog.text
    assert 1 < micro < 64


def test_a_cpu_run_takes_the_cpu_default_and_a_configured_number_is_kept(tmp_path, caplog):
    caplog.set_level("INFO", logger="flashtrain")
    base = [o for o in TINY if not o.startswith("micro_batch_size")]
    run(compose([*base, "global_batch_size=16", "trainer.max_steps=1", "trainer.eval_at_end=false",
                 "trainer.ckpt_at_end=false"]), tmp_path / "auto")  # fmt: skip
    assert f"micro_batch_size=auto: {AUTO_MICRO_BATCH_CPU} (a CPU run" in caplog.text
    assert f"micro {AUTO_MICRO_BATCH_CPU} x 1 ranks x 2 accumulation" in caplog.text
    caplog.clear()
    run(compose([*TINY, "trainer.max_steps=0"]), tmp_path / "fixed")
    assert "micro_batch_size=auto" not in caplog.text
    assert "micro 4 x 1 ranks x 2 accumulation" in caplog.text


@pytest.mark.parametrize("value", ["big", "0", "-2"])
def test_a_bad_micro_batch_size_is_one_line(value):
    with pytest.raises(ConfigError, match="micro_batch_size"):
        validate_config(compose([f"micro_batch_size={value}"]))


def test_out_of_memory_advice_halves_the_micro_batch_the_run_used():
    cfg = validate_config(compose(GPT2_1K))
    text = oom_advice(cfg, torch.device("cpu"), micro_batch_size=32)
    assert "micro_batch_size=16" in text
    assert "micro_batch_size=" not in oom_advice(cfg, torch.device("cpu"), micro_batch_size=1)
