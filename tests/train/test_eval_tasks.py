"""trainer.eval_tasks: the retrieval tasks at every evaluation, each rank its share of every
cell, logged as eval/<task>/<length> and eval/tasks_s (console, metrics.jsonl, TensorBoard),
the newest evaluation's heatmap kept in <run>/retrieval/; refused at start where they cannot
run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from config_testing import REPO
from train_testing import HANG_GUARD_S, read_metrics, run_train, subprocess_env

from flashtrain.train.loggers import TENSORBOARD_DIR

RUN = ["data=retrieval", "model=llama-tiny", "seq_len=256", "micro_batch_size=2",
       "global_batch_size=4", "trainer.max_steps=4", "trainer.eval_interval=2",
       "trainer.eval_batches=1", "trainer.log_interval=2", "trainer.progress=lines"]  # fmt: skip


def test_two_ranks_log_the_task_metrics_at_each_evaluation(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    res = run_train(
        [*RUN, "logger=tensorboard", "trainer.eval_tasks=[passkey,niah_single]",
         "trainer.eval_task_lengths=[254,256]", "trainer.eval_task_depths=[0,1]",
         "trainer.eval_task_samples=3", f"hydra.run.dir={run}"],
        tmp_path, nproc=2,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    evals = [r for r in read_metrics(run / "metrics.jsonl") if "eval/passkey/256" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        for key in ("eval/passkey/254", "eval/passkey/256", "eval/niah_single/256"):
            assert 0.0 <= r[key] <= 1.0
        assert r["eval/tasks_s"] > 0 and "eval/loss" in r
    assert "eval/passkey/256" in res.stdout + res.stderr  # the console's eval line
    events = EventAccumulator(str(run / TENSORBOARD_DIR))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/niah_single/254")] == [2, 4]
    report = json.loads((run / "retrieval" / "retrieval.json").read_text())
    assert report["step"] == 4  # the newest evaluation
    # 3 samples a cell over 2 ranks (2 + 1): the reduced cell holds all three
    assert {c["samples"] for c in report["tasks"]["passkey"]["cells"]} == {3}
    assert (run / "retrieval" / "retrieval_heatmap.png").stat().st_size > 1000


def test_fsdp_scores_as_the_checkpoint_scores_alone(tmp_path):
    """FSDP2 shards the weights the scoring passes need whole (the root's gathered around
    them): the last evaluation's log-probabilities are those scripts/evaluate.py finds on the
    checkpoint of that step, one process, whole weights."""
    run = tmp_path / "fsdp"
    res = run_train(
        [*RUN, "logger=none", "trainer.strategy=fsdp", "trainer.eval_tasks=[passkey]",
         "trainer.eval_task_depths=[0,1]", "trainer.eval_task_samples=4", "seed=5",
         f"hydra.run.dir={run}"],
        tmp_path, nproc=2,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    during = json.loads((run / "retrieval" / "retrieval.json").read_text())
    assert during["step"] == 4
    alone = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(run), "--tasks", "passkey",
         "--seq-len", "256", "--depths", "0,1", "--samples", "4", "--seed", "5", "--score",
         "likelihood", "--out", str(tmp_path / "alone"), "--no-progress"],
        capture_output=True, text=True, env=subprocess_env(), timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    after = json.loads((tmp_path / "alone" / "retrieval.json").read_text())
    assert after["step"] == 4
    logprobs = [
        [c["logprob_per_token"] for c in r["tasks"]["passkey"]["cells"]] for r in (during, after)
    ]
    assert logprobs[0] == pytest.approx(logprobs[1], rel=1e-4)
    assert [c["samples"] for c in during["tasks"]["passkey"]["cells"]] == [4, 4]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data=synthetic", "trainer.eval_tasks=[passkey]"],
            "comes as token ids, with no tokenizer",
        ),
        (["trainer.eval_tasks=[passkeys]"], "unknown retrieval task 'passkeys'"),
        (
            ["model=gpt2-tiny", "trainer.eval_tasks=[passkey]", "trainer.eval_task_lengths=[512]"],
            "512 is beyond the model's 256 learned positions",
        ),
        (
            ["trainer.eval_tasks=[passkey]", "trainer.eval_task_lengths=[100]"],
            "task passkey needs at least",
        ),
        (
            ["trainer.eval_tasks=[passkey]", "trainer.eval_task_depths=[1.5]"],
            "trainer.eval_task_depths must be depths in [0, 1]",
        ),
        (
            ["trainer.eval_tasks=[passkey]", "trainer.context_parallel=2"],
            "trainer.eval_tasks scores whole sequences",
        ),
    ],
)
def test_refused_at_start(tmp_path, overrides, message):
    res = run_train([*RUN, "logger=none", "trainer.max_steps=1", *overrides,
                     f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)  # fmt: skip
    assert res.returncode != 0
    assert message in res.stdout + res.stderr, res.stderr[-2000:]
