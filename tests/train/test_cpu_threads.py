"""The CPU thread rule on its inputs: cores (affinity, cgroup quotas), load, ranks, the model's
matmul size, trainer.cpu_threads and OMP_NUM_THREADS; no timings."""

from __future__ import annotations

import pytest
import torch

from flashtrain.train.config import TrainerConfig
from flashtrain.train.cpu_threads import (
    MIN_SPLIT_FLOPS,
    ThreadChoice,
    apply_cpu_threads,
    available_cores,
    busy_cores,
    choose_cpu_threads,
    projection_flops,
    read_cpu_times,
)
from flashtrain.train.distributed import local_ranks
from flashtrain.typed_config import ConfigError

LARGE = 10 * MIN_SPLIT_FLOPS
SMALL = MIN_SPLIT_FLOPS / 10


def cores_with(tmp_path, affinity, v2=None, v1=None):
    """available_cores() with cgroup files written in a new folder under tmp_path (v1: (quota,
    period)); the other version's files absent."""
    folder = tmp_path / f"cgroup{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    v2_path, quota, period = folder / "cpu.max", folder / "quota_us", folder / "period_us"
    if v2 is not None:
        v2_path.write_text(v2 + "\n")
    if v1 is not None:
        quota.write_text(f"{v1[0]}\n")
        period.write_text(f"{v1[1]}\n")
    return available_cores(affinity, v2_path, quota, period)


def test_affinity_when_no_cgroup_quota(tmp_path):
    assert cores_with(tmp_path, 8) == (8, "8 in this process's CPU affinity")
    assert cores_with(tmp_path, 8, v2="max 100000")[0] == 8  # "max": no quota
    assert cores_with(tmp_path, 8, v1=(-1, 100000))[0] == 8  # -1: no quota


def test_cgroup_quota_caps_the_affinity(tmp_path):
    cores, source = cores_with(tmp_path, 8, v2="150000 100000")
    assert cores == 1.5 and "cgroup CPU quota 1.5" in source
    assert cores_with(tmp_path, 8, v1=(200000, 100000))[0] == 2
    assert cores_with(tmp_path, 1, v2="400000 100000")[0] == 1  # a quota above the affinity


def test_this_machine_has_at_least_one_core():
    cores, source = available_cores()
    assert cores > 0 and source


def test_small_matmuls_run_on_one_thread_large_on_every_core():
    assert choose_cpu_threads(8, SMALL).threads == 1
    assert "too small to split" in choose_cpu_threads(8, SMALL).reason
    assert choose_cpu_threads(8, LARGE).threads == 8
    assert choose_cpu_threads(1.5, LARGE).threads == 2  # half a core of quota rounds up


def test_the_default_run_takes_both_idle_cores_and_one_when_others_use_one():
    # The README's main job: micro 8 x 128 tokens at width 128 (docs/benchmarks.md measured it:
    # 2 threads faster on idle cores, 1 thread 2-10x faster when other work keeps a core busy).
    work = projection_flops(8, 128, 128)
    assert choose_cpu_threads(2, work, busy=0.0).threads == 2
    assert choose_cpu_threads(2, work, busy=0.2).threads == 2
    assert choose_cpu_threads(2, work, busy=0.3).threads == 1  # a core a quarter busy is not free
    assert choose_cpu_threads(2, projection_flops(1, 64, 64)).threads == 1  # below any measured


def proc_stat(tmp_path, name, *idle_and_busy):
    """A /proc/stat with one line per CPU: (idle ticks, user ticks) each."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [
        f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0" for i, (idle, busy) in enumerate(idle_and_busy)
    ]
    path = tmp_path / name
    path.write_text("\n".join(lines + ["intr 1 2 3"]) + "\n")
    return read_cpu_times(path)


def test_busy_cores_from_two_samples_of_proc_stat(tmp_path):
    before = proc_stat(tmp_path, "before", (100, 100), (100, 100))
    assert before == {0: (100, 200), 1: (100, 200)}
    one_busy = proc_stat(tmp_path, "one_busy", (200, 100), (100, 200))  # cpu1 ran others' work
    assert busy_cores(2, before, one_busy, cpus={0, 1}) == 1.0
    idle = proc_stat(tmp_path, "idle", (200, 100), (200, 100))
    assert busy_cores(2, before, idle, cpus={0, 1}) == 0.0
    # a quota of 1 core on 2 CPUs, one of them idle: that core is free
    assert busy_cores(1, before, one_busy, cpus={0, 1}) == 0.0
    assert read_cpu_times(tmp_path / "absent") == {}


def test_cores_busy_elsewhere_are_not_used():
    assert choose_cpu_threads(2, LARGE, busy=1.0).threads == 1
    assert choose_cpu_threads(8, LARGE, busy=3.0).threads == 5
    assert choose_cpu_threads(8, LARGE, busy=lambda: 3.0).threads == 5


def test_the_cores_are_sampled_only_when_the_answer_depends_on_it():
    def not_needed():
        raise AssertionError("sampled the cores for a choice that does not depend on them")

    assert choose_cpu_threads(8, SMALL, busy=not_needed).threads == 1
    assert choose_cpu_threads(1, LARGE, busy=not_needed).threads == 1
    assert choose_cpu_threads(8, LARGE, busy=not_needed, configured=2).threads == 2


def test_ranks_on_a_node_share_its_cores(monkeypatch):
    assert choose_cpu_threads(8, LARGE, ranks=2).threads == 4
    assert choose_cpu_threads(2, LARGE, ranks=2).threads == 1
    assert choose_cpu_threads(2, LARGE, ranks=4).threads == 1  # never fewer than 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_ranks() == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert local_ranks() == 1


def test_a_users_omp_num_threads_is_respected():
    choice = choose_cpu_threads(8, SMALL, omp_num_threads="3")
    assert choice.threads == 3 and "OMP_NUM_THREADS" in choice.reason
    assert choose_cpu_threads(8, LARGE, omp_num_threads="1").threads == 1  # torchrun's too
    assert choose_cpu_threads(8, LARGE, omp_num_threads="4,2").threads == 4  # nested list
    assert choose_cpu_threads(8, LARGE, omp_num_threads="many").threads == 8  # not a count


def test_trainer_cpu_threads_wins_over_everything():
    choice = choose_cpu_threads(4, SMALL, busy=2.0, ranks=2, configured=2, omp_num_threads="1")
    assert choice == ThreadChoice(2, "trainer.cpu_threads")


def test_more_threads_than_the_cores_are_refused_or_capped():
    """10000 threads on 2 cores ran 69 s a step instead of 0.1 s: refused, naming the cores."""
    with pytest.raises(ConfigError) as error:
        choose_cpu_threads(
            2, LARGE, configured=10000, cores_from="2 in this process's CPU affinity"
        )
    message = str(error.value)
    assert "trainer.cpu_threads=10000 is more than this process's share of the cores" in message
    assert "2 cores (2 in this process's CPU affinity), at most 2 thread(s)" in message
    with pytest.raises(ConfigError, match="4 cores shared by 2 ranks, at most 2 thread"):
        choose_cpu_threads(4, LARGE, ranks=2, configured=3)
    assert choose_cpu_threads(1.5, LARGE, configured=2).threads == 2  # a 1.5-core quota: 2
    capped = choose_cpu_threads(2, SMALL, omp_num_threads="64")
    assert capped.threads == 2 and "OMP_NUM_THREADS=64 from the environment capped" in capped.reason


def test_the_run_refuses_more_threads_than_cores_at_start(tmp_path, monkeypatch, caplog):
    from config_testing import compose
    from train_testing import TINY

    from flashtrain.train import main
    from flashtrain.train.entry import EXIT_USER_ERROR

    monkeypatch.chdir(tmp_path)
    too_many = int(available_cores()[0]) + 1
    with pytest.raises(SystemExit) as exit_info:
        main(compose(TINY + [f"trainer.cpu_threads={too_many}", "trainer.max_steps=1"]))
    assert exit_info.value.code == EXIT_USER_ERROR
    assert f"trainer.cpu_threads={too_many} is more than" in caplog.text
    assert not (tmp_path / "outputs").exists()


def test_trainer_cpu_threads_is_checked():
    assert TrainerConfig(cpu_threads=3).cpu_threads == 3
    with pytest.raises(ValueError, match="trainer.cpu_threads must be >= 1, got 0"):
        TrainerConfig(cpu_threads=0)


def test_apply_sets_torchs_thread_count():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    try:
        apply_cpu_threads(ThreadChoice(other, "test"))
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)


def test_the_benchmark_suggests_a_threshold_between_the_last_loss_and_the_first_win():
    from flashtrain.lab.bench.cpu_threads import suggested_threshold, thread_schedule

    def row(flops, one, two):
        return {"projection_flops": flops, "median_s": {1: one, 2: two}}

    sizes = [row(4e8, 1.0, 0.6), row(1e7, 0.1, 0.3), row(1e8, 0.5, 0.4), row(4e7, 0.2, 0.25)]
    assert suggested_threshold(sizes) == pytest.approx((4e7 * 1e8) ** 0.5)
    assert suggested_threshold([row(1e7, 0.1, 0.3), row(1e8, 0.5, 0.9)]) is None
    assert suggested_threshold([row(1e7, 0.3, 0.1)]) == 1e7
    assert thread_schedule([1, 2], 6) == [1, 2, 2, 1, 1, 2]  # ABBA: drift hits both alike
