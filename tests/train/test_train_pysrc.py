"""data=pysrc trained end to end (a small stdlib folder), and the run.json every run writes."""

from __future__ import annotations

import json
import platform

import torch
from config_testing import compose
from train_testing import TINY

from flashtrain.checkpoint.run_info import cpu_model
from flashtrain.train import run


def test_pysrc_prepares_trains_and_records_where_it_ran(tmp_path):
    overrides = [
        "data=pysrc",
        "data.pysrc_under=json",  # a few files: the whole library takes ~11 s to read
        "data.val_fraction=0.3",
        f"data.cache_dir={tmp_path / 'cache'}",
        "trainer.max_steps=4",
        "trainer.eval_interval=4",
    ]
    summary = run(compose(TINY + overrides), tmp_path / "run")
    assert len(summary["losses"]) == 4 and summary["evals"]
    assert summary["losses"][0][1] > 5.0  # (step, loss); byte-level: starts near ln(258)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["device"].startswith(cpu_model()) and "thread" in info["device"]
    assert (info["torch"], info["python"]) == (torch.__version__, platform.python_version())
    assert info["commit"] and info["commits"][-1] == info["commit"] and info["start_step"] == 0
