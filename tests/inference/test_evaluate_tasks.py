"""scripts/evaluate.py --tasks (flashtrain/inference/retrieval_cli.py): the retrieval grid of a
checkpoint written as retrieval.md, .json and the PNGs beside the run, and every refusal
before the first sample is scored."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from inference_testing import REPO, train

from flashtrain.inference.evaluate_cli import main

RETRIEVAL = ["data=retrieval", "seq_len=256", "micro_batch_size=2", "global_batch_size=2",
             "trainer.max_steps=2"]  # fmt: skip


@pytest.fixture(scope="module")
def passkey_run(tmp_path_factory):
    """A tiny GPT-2 (a learned table of 256 positions) trained two steps on passkey windows."""
    return train(tmp_path_factory.mktemp("tasks") / "run", *RETRIEVAL)


def test_the_grid_is_written_beside_the_run(passkey_run, capsys):
    code = main([str(passkey_run), "--tasks", "passkey,niah_single", "--seq-len", "254", "256",
                 "--depths", "0:1:3", "--samples", "2", "--no-progress"], configs=REPO / "configs")  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    folder = passkey_run / "eval" / "step_000002"
    report = json.loads((folder / "retrieval.json").read_text())
    assert report["step"] == 2 and report["settings"]["score"] == "generate"
    passkey = report["tasks"]["passkey"]
    assert passkey["lengths"] == [254, 256] and passkey["depths"] == [0.0, 0.5, 1.0]
    assert all(c["samples"] == 2 and 0 <= c["accuracy"] <= 1 for c in passkey["cells"])
    assert "## passkey" in out and "| 256 |" in out
    for name in ("retrieval_heatmap.png", "retrieval_by_length.png"):
        assert (folder / name).stat().st_size > 1000


def test_the_script_runs_likelihood_scoring(passkey_run, tmp_path):
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(passkey_run), "--tasks",
         "passkey", "--seq-len", "256", "--depths", "0,1", "--samples", "1", "--score",
         "likelihood", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                          "FLASHTRAIN_CPU_ATTENTION": "torch"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "retrieval.json").read_text())
    assert report["settings"]["score"] == "likelihood"
    assert all(c["logprob_per_token"] < 0 for c in report["tasks"]["passkey"]["cells"])


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--tasks", "passkeys", "--seq-len", "256"],
            "unknown retrieval task 'passkeys': the tasks are passkey",
        ),
        (
            ["--tasks", "passkey", "--seq-len", "512"],
            "length 512 is beyond the model's 256 learned positions",
        ),
        (["--tasks", "passkey", "--seq-len", "100"], "task passkey needs at least"),
        (
            ["--tasks", "passkey", "--seq-len", "256", "--samples", "40000"],
            "over the budget of 2,000,000",
        ),
        (["--tasks", "passkey", "--seq-len", "256", "--depths", "0:2:3"], "depths must lie in"),
        (["--tasks", "passkey", "--seq-len", "256", "--data", "pysrc"], "--tasks writes its own"),
        (["--tasks", "passkey", "--seq-len", "4q"], "argument --seq-len: '4q' is not allowed"),
        (
            ["--tasks", "passkey", "--seq-len", "256", "--samples", "0"],
            "argument --samples: '0' is not allowed: an integer >= 1",
        ),
    ],
)
def test_refusals_are_one_line(passkey_run, args, message, capsys):
    with pytest.raises(SystemExit) if message.startswith("argument") else _nothing():
        code = main([str(passkey_run), *args, "--no-progress"], configs=REPO / "configs")
        assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_run_on_token_ids_cannot_write_the_tasks(recall_run, capsys):
    assert main([str(recall_run), "--tasks", "passkey", "--seq-len", "64"]) == 2
    assert (
        "this run's tokenizer (integers) writes none: its data is synthetic"
        in capsys.readouterr().err
    )


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
