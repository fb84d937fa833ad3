"""Peak-FLOPs lookup, MFU arithmetic, throughput / ETA, memory metrics and the progress output."""

from __future__ import annotations

import io
import logging

import pytest
import torch

from flashtrain.train import metrics as M
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
    assert out["tokens_per_s"] == pytest.approx(2000.0)
    assert out["tokens_per_s_per_device"] == pytest.approx(1000.0)
    assert out["step_time_s"] == pytest.approx(0.5)
    assert out["mfu"] == pytest.approx(100 * 1e6 * 1000 / 1e12)
    assert tp.eta_seconds(10) == pytest.approx(5.0)
    assert tp.flush() == {}  # the window restarts


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
        "loss": 2.5,
        "lr": 3e-4,
        "grad_norm": 0.75,
        "tokens_per_s": 12345.0,
        "mfu": 41.5,
        "step_time_s": 0.25,
        "memory/max_reserved_gib": 10.5,
    }
    line = format_line(20, 100, metrics, eta=65)
    for piece in (
        "step  20/100",
        "train/loss (last step) 2.5000",
        "lr 3.000e-04",
        "grad_norm 0.750",
        "tokens/s 12.35K",
        "mfu 41.50%",
        "step_time 0.250s",
        "mem 10.50GiB",
        "eta 1:05",
    ):
        assert piece in line, (piece, line)


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
        p.interval(5, {"loss": 1.25}, eta=3)
        p.close()
    finally:
        root.removeHandler(console)
        root.removeHandler(logfile)
        root.setLevel(old)
    assert "step  5/10 | train/loss (last step) 1.2500" in con.getvalue()
    assert "(last step) 1.2500" in fil.getvalue()


def test_bar_on_a_terminal_keeps_lines_in_the_log_file_only():
    root, console, logfile, con, fil, old = _capture_logging()
    tty = _Tty()
    try:
        p = Progress("auto", total=10, initial=2, enabled=True, stream=tty)
        assert p.mode == "bar" and p.bar is not None
        p.step(5)
        p.interval(5, {"loss": 1.25, "tokens_per_s": 1000.0}, eta=3)
        logging.getLogger("flashtrain").info("eval at step 5")
        p.close()
    finally:
        root.removeHandler(console)
        root.removeHandler(logfile)
        root.setLevel(old)
    drawn = tty.getvalue()
    assert "5/10" in drawn and "loss_mean=1.2500" in drawn  # the bar, with its postfix
    assert "<" in drawn  # tqdm's elapsed<remaining (ETA)
    assert "(last step) 1.2500" in fil.getvalue()  # the plain line reached the log file
    assert "step  5/10 | loss" not in con.getvalue() + drawn  # ... but not the terminal
    assert "eval at step 5" in drawn + con.getvalue()  # other messages still show


def test_disabled_progress_prints_nothing():
    root, console, logfile, con, fil, old = _capture_logging()
    try:
        p = Progress("lines", total=10, initial=0, enabled=False, stream=io.StringIO())
        p.interval(1, {"loss": 1.0}, eta=None)
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
    assert stats.flush() == {"loss": 3.0, "lr": 2e-3, "grad_norm": 0.7, "accuracy": 0.5}
    assert stats.flush() == {}  # the next interval starts empty
