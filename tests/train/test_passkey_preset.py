"""experiment=cpu/passkey: the tiny Llama trained on passkey windows passes passkey at its
trained length, where a fresh model of the same shape answers none (chance for a 5-digit key is
1 in 90,000). About 19 minutes on 2 cores: left out of the suite (-m slow); its figures are in
docs/results/retrieval/."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from config_testing import REPO
from train_testing import HANG_GUARD_S, run_train, subprocess_env


def _passkey(run, out) -> float:
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(run), "--tasks", "passkey",
         "--seq-len", "256", "--depths", "0:1:5", "--samples", "8", "--out", str(out),
         "--no-progress"],
        capture_output=True, text=True, env=subprocess_env(), timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "retrieval.json").read_text())["tasks"]["passkey"]["by_length"][0]


@pytest.mark.slow  # ~19 minutes of training on 2 cores
def test_the_preset_passes_passkey_and_a_fresh_model_does_not(tmp_path):
    trained, fresh = tmp_path / "trained", tmp_path / "fresh"
    for run, extra in ((trained, []), (fresh, ["trainer.max_steps=1", "optim.lr=1e-12"])):
        res = run_train(["experiment=cpu/passkey", *extra, f"hydra.run.dir={run}"], tmp_path,
                        timeout=3 * HANG_GUARD_S, env=subprocess_env(OMP_NUM_THREADS="2"))  # fmt: skip
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _passkey(trained, tmp_path / "eval-trained") >= 0.75  # 86% at 11 depths x 8 samples
    assert _passkey(fresh, tmp_path / "eval-fresh") == 0.0
