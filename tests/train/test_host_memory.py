"""The host-memory estimate of a CPU run and its refusal (flashtrain/train/host_memory.py):
arithmetic on meta-built models, and the available figure read from files under tmp_path."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from config_testing import compose

from flashtrain.models import build_model
from flashtrain.train.config import batch_plan, validate_config
from flashtrain.train.host_memory import (
    MARGIN,
    SEQ_LEN_STEP,
    HostAvailable,
    available_host_bytes,
    available_host_memory,
    check_host_memory,
    estimate_host_peak,
    process_rss,
)
from flashtrain.train.memory_estimate import gib
from flashtrain.typed_config import ConfigError

GIB = 2**30


def planned(*overrides: str):
    """(model on the meta device, validated config, one process's batch plan)."""
    cfg = validate_config(compose(list(overrides)))
    with torch.device("meta"):
        model = build_model(cfg.model, cfg.attention)
    return model, cfg, batch_plan(cfg, 1)


def estimator(model, cfg, precision="fp32", ranks=1):
    def estimate(plan):
        return estimate_host_peak(
            model, cfg, plan, precision=precision, strategy="single", ranks=ranks
        )

    return estimate


def test_states_are_16_bytes_per_param_and_flash_activations_are_linear_in_tokens():
    model, cfg, plan = planned("seq_len=256", "micro_batch_size=1", "global_batch_size=1")
    estimate = estimator(model, cfg)
    one = estimate(plan)
    two_rows = estimate(dataclasses.replace(plan, micro_batch_size=2))
    twice_longer = estimate(dataclasses.replace(plan, seq_len=512))
    assert one.states == 16 * model.num_parameters()
    assert two_rows.states == twice_longer.states == one.states
    assert two_rows.activations == pytest.approx(2 * one.activations)
    assert twice_longer.activations == pytest.approx(2 * one.activations)
    assert one.total == pytest.approx(one.states + one.activations + one.working_set + one.baseline)


def test_ranks_on_the_node_multiply_the_estimate():
    model, cfg, plan = planned()
    one, four = estimator(model, cfg)(plan), estimator(model, cfg, ranks=4)(plan)
    assert four.total == pytest.approx(4 * one.total)
    assert "x 4 ranks on this node" in four.describe()


def test_a_route_that_keeps_s_by_s_probabilities_grows_quadratically():
    model, cfg, plan = planned("attention=reference", "micro_batch_size=1", "global_batch_size=1")
    estimate = estimator(model, cfg)
    short = estimate(dataclasses.replace(plan, seq_len=1024))
    long = estimate(dataclasses.replace(plan, seq_len=2048))
    square = 4 * model.config.n_head * 2048**2 * model.config.n_layer  # float32 (H, S, S) per block
    assert long.activations - 2 * short.activations == pytest.approx(square / 2)


def test_the_chunked_loss_holds_a_chunk_of_float32_logits():
    model, cfg, plan = planned("data.vocab_size=50257", "seq_len=2048", "micro_batch_size=1")
    small_chunks = dataclasses.replace(cfg.model, loss_chunk_size=512)
    with torch.device("meta"):
        other = build_model(small_chunks, cfg.attention)
    big, small = estimator(model, cfg)(plan), estimator(other, cfg)(plan)
    assert big.working_set - small.working_set == pytest.approx(4 * (2048 - 512) * 50257)


def test_refusal_names_estimate_available_and_a_micro_batch_that_fits():
    model, cfg, plan = planned("seq_len=2048", "micro_batch_size=8", "global_batch_size=8")
    estimate = estimator(model, cfg)
    fitting = estimate(dataclasses.replace(plan, micro_batch_size=3)).total
    available = HostAvailable(int(fitting / (1 - MARGIN)) + 1, "MemAvailable in /proc/meminfo")
    with pytest.raises(ConfigError) as refused:
        check_host_memory(estimate(plan), available, plan, estimate)
    message = str(refused.value)
    assert "\n" not in message
    assert estimate(plan).describe() in message
    assert f"{gib(available.bytes)} is available (MemAvailable in /proc/meminfo" in message
    assert "micro_batch_size=3 fits" in message and "trainer.max_steps=0" in message
    budget = (1 - MARGIN) * available.bytes
    assert estimate(dataclasses.replace(plan, micro_batch_size=4)).total > budget


def test_refusal_suggests_a_seq_len_that_fits_when_one_sequence_does_not():
    model, cfg, plan = planned("seq_len=8192", "micro_batch_size=1", "global_batch_size=1")
    estimate = estimator(model, cfg)
    available = HostAvailable(int(estimate(dataclasses.replace(plan, seq_len=3000)).total), "x")
    with pytest.raises(ConfigError, match=r"micro_batch_size=1 seq_len=\d+ fits") as refused:
        check_host_memory(estimate(plan), available, plan, estimate)
    seq_len = int(re.search(r"seq_len=(\d+) fits", str(refused.value)).group(1))
    budget = (1 - MARGIN) * available.bytes
    assert seq_len % SEQ_LEN_STEP == 0
    assert estimate(dataclasses.replace(plan, seq_len=seq_len)).total <= budget
    assert estimate(dataclasses.replace(plan, seq_len=seq_len + SEQ_LEN_STEP)).total > budget


def test_a_run_that_fits_or_an_unknown_host_is_not_refused():
    model, cfg, plan = planned()
    estimate = estimator(model, cfg)
    check_host_memory(estimate(plan), None, plan, estimate)
    check_host_memory(
        estimate(plan), HostAvailable(int(2 * estimate(plan).total), "x"), plan, estimate
    )


def test_the_running_ranks_baselines_are_not_counted_twice():
    """Under torchrun every rank's process exists when rank 0 reads MemAvailable: what they
    hold is out of it already and counts once, up to the estimate's baseline per rank."""
    model, cfg, plan = planned()
    estimate = estimator(model, cfg, ranks=4)
    needed = estimate(plan)
    to_come = needed.total - 4 * needed.baseline
    available = HostAvailable(int(to_come / (1 - MARGIN)) + 1, "MemAvailable in /proc/meminfo")
    check_host_memory(needed, available, plan, estimate, resident_per_rank=needed.baseline)
    with pytest.raises(ConfigError, match="already in use by the running processes"):
        check_host_memory(needed, available, plan, estimate, resident_per_rank=needed.baseline / 2)
    with pytest.raises(ConfigError):  # more resident than the baseline is the run's own growth
        small = HostAvailable(int(to_come / 2), "x")
        check_host_memory(needed, small, plan, estimate, resident_per_rank=10 * needed.baseline)


def test_this_process_resident_size_is_read(tmp_path):
    assert process_rss() > 0  # Linux: /proc/self/statm
    assert process_rss(tmp_path / "no-such-file") == 0


def test_gpt2_at_16k_with_the_default_micro_batch_is_refused_on_24_gib():
    """The design card's `python train.py model=gpt2 seq_len=16384` crashed a 24 GiB host."""
    model, cfg, plan = planned("model=gpt2", "seq_len=16384")
    assert plan.micro_batch_size == 8
    estimate = estimator(model, cfg)
    available = HostAvailable(24 * GIB, "MemAvailable in /proc/meminfo")
    with pytest.raises(ConfigError, match=r"micro_batch_size=\d fits"):
        check_host_memory(estimate(plan), available, plan, estimate)
    assert estimate(plan).total > 24 * GIB


def _host(tmp_path, meminfo_kb=None, **files):
    """A fake /proc/meminfo and cgroup folders under tmp_path: files "v2/memory.max"="max", ..."""
    if meminfo_kb is not None:
        (tmp_path / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kb} kB\n")
    for name, text in files.items():
        path = tmp_path / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dict(meminfo=tmp_path / "meminfo", cgroup_v2=tmp_path / "v2", cgroup_v1=tmp_path / "v1")


def test_available_is_mem_available_without_a_cgroup_limit(tmp_path):
    paths = _host(tmp_path, 8 * 2**20, **{"v2__memory.max": "max", "v2__memory.current": "123"})
    found = available_host_memory(**paths)
    assert found.bytes == 8 * GIB and found.source.startswith("MemAvailable")
    assert available_host_bytes(**paths) == 8 * GIB


def test_a_cgroup_v2_limit_caps_available_less_its_usage_but_not_its_page_cache(tmp_path):
    paths = _host(
        tmp_path,
        8 * 2**20,
        **{
            "v2__memory.max": str(4 * GIB),
            "v2__memory.current": str(3 * GIB),
            "v2__memory.stat": f"anon {GIB}\ninactive_file {2 * GIB}\n",
        },
    )
    found = available_host_memory(**paths)
    assert found.bytes == 3 * GIB and "memory.max" in found.source


def test_a_cgroup_v1_limit_caps_available_and_its_no_limit_value_does_not(tmp_path):
    v1 = {"v1__memory.limit_in_bytes": str(2 * GIB), "v1__memory.usage_in_bytes": str(GIB // 2)}
    assert available_host_bytes(**_host(tmp_path, 8 * 2**20, **v1)) == GIB + GIB // 2
    v1["v1__memory.limit_in_bytes"] = "9223372036854771712"
    assert available_host_bytes(**_host(tmp_path, 8 * 2**20, **v1)) == 8 * GIB


def test_nothing_readable_means_unknown(tmp_path):
    assert available_host_bytes(**_host(tmp_path)) is None
