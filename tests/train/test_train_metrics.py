"""Peak-FLOPs lookup, MFU arithmetic, throughput / ETA, memory metrics and the progress output,
all under the metric names of flashtrain/train/metric_names.py."""

from __future__ import annotations

import io
import logging

import pytest
import torch

from flashtrain.train import metrics as M
from flashtrain.train.metric_names import (
    MFU,
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_DEVICE,
    TRAIN_ACCURACY,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
    TRAIN_LR,
)
from flashtrain.train.progress import Progress, format_line


@pytest.mark.parametrize(
    "name,precision,peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
        ("NVIDIA H100 PCIe", "bf16", 756.0e12),
        ("NVIDIA H200", "bf16", 989.4e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 156.0e12),  # TF32
        ("NVIDIA L40S", "bf16", 362.05e12),
        ("NVIDIA L4", "fp16", 121.0e12),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_gpu_peak_table(name, precision, peak):
    assert M.lookup_gpu_peak(name, precision) == peak


def test_configured_peak_wins_and_cpu_is_estimated():
    cpu = torch.device("cpu")
    assert M.device_peak_flops(cpu, "fp32", 1e12) == M.PeakFlops(1e12, "configured")
    est = M.device_peak_flops(cpu, "fp32")
    if est.flops is not None:  # Linux: /proc/cpuinfo is there
        assert est.source.startswith("estimated")
        assert 1e9 < est.flops < 1e14


def test_flops_per_cycle_from_cpu_flags():
    assert M.cpu_flops_per_cycle({"avx512f", "avx2", "fma"}) == 64
    assert M.cpu_flops_per_cycle({"avx2", "fma"}) == 32
    assert M.cpu_flops_per_cycle({"avx"}) == 16
    assert M.cpu_flops_per_cycle(set()) == 8


def test_mfu_arithmetic():
    # 6 * 124M params ~ 0.75 GFLOP/token; 100K tokens/s on a 989 TFLOP/s GPU ~ 7.5 %
    assert M.mfu_percent(7.5e8, 1e5, 989.4e12) == pytest.approx(100 * 7.5e13 / 989.4e12)
    assert M.mfu_percent(7.5e8, 1e5, None) is None


def test_throughput_window_and_eta():
    tp = M.Throughput(flops_per_token=1e6, peak=M.PeakFlops(1e12, "configured"), world_size=2)
    for _ in range(4):
        tp.add(step_time=0.5, tokens=1000)
    out = tp.flush()
    assert out[TOKENS_PER_S] == pytest.approx(2000.0)
    assert out[TOKENS_PER_S_PER_DEVICE] == pytest.approx(1000.0)
    assert out[STEP_TIME_S] == pytest.approx(0.5)
    assert out[MFU] == pytest.approx(100 * 1e6 * 1000 / 1e12)
    assert tp.eta_seconds(10) == pytest.approx(5.0)
    assert tp.flush() == {}  # the window restarts


def _eta_after(intervals: list[tuple[float, int]], remaining: int = 100) -> float:
    """The ETA of `remaining` steps after intervals of (seconds per step, steps)."""
    tp = M.Throughput(flops_per_token=1e6, peak=M.PeakFlops(None, "unknown"), world_size=1)
    for step_time, steps in intervals:
        for _ in range(steps):
            tp.add(step_time, tokens=100)
        tp.flush()
    return tp.eta_seconds(remaining)


def test_one_slow_interval_moves_the_eta_far_less_than_its_slowness():
    steady = [(1.0, 10)] * 20
    assert _eta_after(steady) == pytest.approx(100.0)
    jumped = _eta_after(steady + [(10.0, 10)])  # another job took the cores for 10 steps
    assert 100.0 < jumped < 2 * 100.0  # the last interval alone would say 1000


def test_the_first_interval_warm_up_does_not_weigh_on_the_eta():
    assert _eta_after([(30.0, 5)]) == pytest.approx(3000.0)  # nothing better known yet
    assert _eta_after([(30.0, 5), (1.0, 5)]) == pytest.approx(100.0)


def test_the_eta_follows_a_lasting_change_of_speed():
    slower = _eta_after([(1.0, 10)] * 20 + [(2.0, 10)] * 40)
    assert slower == pytest.approx(200.0, rel=0.1)


def test_memory_metrics_on_cpu():
    out = M.memory_metrics(torch.device("cpu"))
    assert set(out) == {"memory/max_rss_gib"} and out["memory/max_rss_gib"] > 0.01
    assert M.peak_memory_gib(out) == out["memory/max_rss_gib"]


def test_measured_matmul_speed_is_plausible():
    flops = M.measure_matmul_flops(torch.device("cpu"), size=128, repeats=2, trials=2)
    assert 1e7 < flops < 1e14


@pytest.mark.parametrize(
    "seconds,text",
    [(None, "?"), (59.4, "0:59"), (61, "1:01"), (3725, "1:02:05"), (90000, "1d01h00m")],
)
def test_format_duration(seconds, text):
    assert M.format_duration(seconds) == text


def test_format_line_has_every_metric():
    metrics = {
        TRAIN_LOSS: 2.5,
        TRAIN_LR: 3e-4,
        TRAIN_GRAD_NORM: 0.75,
        TOKENS_PER_S: 12345.0,
        MFU: 41.5,
        STEP_TIME_S: 0.25,
        "memory/max_reserved_gib": 10.5,
    }
    line = format_line(20, 100, metrics, eta=65)
    assert line == (
        "step  20/100 | train/loss 2.5000 (last step) | train/lr 3.000e-04 | "
        "train/grad_norm 0.750 | perf/tokens_per_s 12.35K | perf/mfu 41.50% | "
        "perf/step_time_s 0.250s | memory/max_reserved_gib 10.50 | eta 1:05"
    )
    assert "train/loss 2.5000 (mean of 5 steps)" in format_line(20, 100, metrics, 65, 5)
    assert "memory/max_rss_gib 0.61" in format_line(1, 9, {"memory/max_rss_gib": 0.61}, None)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _capture_logging():
    console_stream, file_stream = io.StringIO(), io.StringIO()
    console = logging.StreamHandler(console_stream)
    logfile = logging.FileHandler("/dev/null")
    logfile.stream = file_stream  # a FileHandler: the progress filter leaves it alone
    root = logging.getLogger()
    root.addHandler(console)
    root.addHandler(logfile)
    old = root.level
    root.setLevel(logging.INFO)
    return root, console, logfile, console_stream, file_stream, old


def test_plain_lines_when_not_a_terminal():
    root, console, logfile, con, fil, old = _capture_logging()
    try:
        p = Progress("auto", total=10, initial=0, enabled=True, stream=io.StringIO())
        assert p.mode == "lines" and p.bar is None
        p.step(5)
        p.interval(5, {TRAIN_LOSS: 1.25}, eta=3)
        p.close()
    finally:
        root.removeHandler(console)
        root.removeHandler(logfile)
        root.setLevel(old)
    assert "step  5/10 | train/loss 1.2500 (last step)" in con.getvalue()
    assert "train/loss 1.2500 (last step)" in fil.getvalue()


def test_bar_on_a_terminal_keeps_lines_in_the_log_file_only():
    root, console, logfile, con, fil, old = _capture_logging()
    tty = _Tty()
    try:
        p = Progress("auto", total=10, initial=2, enabled=True, stream=tty)
        assert p.mode == "bar" and p.bar is not None
        p.step(5)
        p.interval(5, {TRAIN_LOSS: 1.25, TOKENS_PER_S: 1000.0}, eta=3)
        logging.getLogger("flashtrain").info("eval at step 5")
        p.close()
    finally:
        root.removeHandler(console)
        root.removeHandler(logfile)
        root.setLevel(old)
    drawn = tty.getvalue()
    # the bar, its postfix under the log line's names
    assert "5/10" in drawn and "train/loss=1.2500" in drawn and "perf/tokens_per_s=1.00K" in drawn
    assert "<" in drawn  # tqdm's elapsed<remaining (ETA)
    assert "train/loss 1.2500 (last step)" in fil.getvalue()  # the line reached the log file
    assert "step  5/10 | train/loss" not in con.getvalue() + drawn  # ... but not the terminal
    assert "eval at step 5" in drawn + con.getvalue()  # other messages still show


def test_disabled_progress_prints_nothing():
    root, console, logfile, con, fil, old = _capture_logging()
    try:
        p = Progress("lines", total=10, initial=0, enabled=False, stream=io.StringIO())
        p.interval(1, {TRAIN_LOSS: 1.0}, eta=None)
        p.close()
    finally:
        root.removeHandler(console)
        root.removeHandler(logfile)
        root.setLevel(old)
    assert con.getvalue() == "" and fil.getvalue() == ""


def test_a_measured_cpu_speed_above_the_estimate_becomes_the_peak():
    cpu = torch.device("cpu")
    est = M.estimate_cpu_peak_flops()
    huge = 1e15
    assert M.device_peak_flops(cpu, "fp32", measured=huge) == M.PeakFlops(
        huge, "measured: fp32 matmul"
    )
    if est.flops is not None:
        assert M.device_peak_flops(cpu, "fp32", measured=1.0) == est


def test_interval_stats_average_the_updates_and_the_targets():
    from flashtrain.train.interval import IntervalStats

    stats = IntervalStats()
    assert stats.flush() == {}
    stats.add_update(2.0, lr=1e-3, grad_norm=0.5)
    stats.add_update(4.0, lr=2e-3, grad_norm=0.7)
    stats.add_accuracy(3.0, 4.0)
    stats.add_accuracy(1.0, 4.0)  # a skipped step still scores its targets
    assert stats.flush() == {
        TRAIN_LOSS: 3.0,
        TRAIN_LR: 2e-3,
        TRAIN_GRAD_NORM: 0.7,
        TRAIN_ACCURACY: 0.5,
    }
    assert stats.flush() == {}  # the next interval starts empty
