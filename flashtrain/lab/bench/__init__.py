"""Benchmark helpers shared by scripts/bench_*.py: timing, baselines, FLOP counts, reports."""
