"""The ring benchmark (flashtrain.lab.bench.ring, scripts/bench_ring.py) runs end to end on CPU
(2 gloo ranks it starts itself) and writes its JSON, table and plot, so it cannot meet a GPU
session with a typo. Slow (~20 s: torchrun and two fresh interpreters): pytest -m slow."""

import json
import os
import subprocess
import sys

import pytest
from config_testing import REPO


@pytest.mark.slow
def test_bench_ring_writes_json_table_and_plot(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"FLASHTRAIN_CPU_ATTENTION": "torch", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "flashtrain.lab.bench.ring", "--ranks", "2"]
    cmd += ["--seqlens", "64", "96", "--rep", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "ring-cpu-p2.json").read_text())
    assert [r["seqlen"] for r in result["rows"]] == [64, 96]
    assert all(r["ranks"] == 2 and r["ms"] > 0 for r in result["rows"])
    assert "| 96 | 48 |" in (tmp_path / "ring-cpu-p2.md").read_text()
    assert (tmp_path / "ring-cpu-p2.png").stat().st_size > 0
