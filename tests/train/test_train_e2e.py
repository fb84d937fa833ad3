"""The trainer end to end on CPU: the default command, resume, reproducibility, bad input."""

from __future__ import annotations

import hashlib
import re
import shutil

import pytest
import torch
from config_testing import compose
from train_testing import TINY, read_metrics, run_train, step_losses, subprocess_env

from flashtrain.checkpoint.read import CheckpointError, find_checkpoints
from flashtrain.train import ConfigError, run
from flashtrain.train.metric_names import TRAIN_ACCURACY, TRAIN_LOSS

# The default command shrunk to a few seconds; wandb stays at its default (offline).
SHORT = [o for o in TINY if o != "logger=none"] + [
    "trainer.max_steps=30",
    "trainer.eval_interval=15",
    "trainer.ckpt_interval=15",
    "optim.warmup_steps=5",
    "optim.lr=3e-3",
]


def digest(folder):
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_default_command_trains_evaluates_checkpoints_and_logs(tmp_path):
    res = run_train(SHORT, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = list((tmp_path / "outputs").glob("*/*"))
    assert len(runs) == 1 and re.fullmatch(r"\d\d-\d\d-\d\d", runs[0].name)
    run_dir = runs[0]
    rows = read_metrics(run_dir / "metrics.jsonl")
    losses = [r[TRAIN_LOSS] for r in rows if TRAIN_LOSS in r]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < losses[0] - 0.4, losses  # the loss falls
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [15, 30] and evals[1]["eval/ppl"] > 1
    line_keys = (TRAIN_LOSS, "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu")
    line_keys += ("perf/step_time_s", "memory/max_rss_gib")
    for key in line_keys + ("train/tokens_seen", "perf/tokens_per_s_per_device"):
        assert key in rows[0], key
    assert [c.step for c in find_checkpoints(run_dir / "checkpoints")] == [15, 30]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000030"
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert "max_steps: 30" in (run_dir / "config.yaml").read_text()  # the whole resolved config
    log = (run_dir / "train.log").read_text()
    assert re.search(r"^params: \d+$", log, re.M)
    # a short summary pointing at the config, not the config itself
    assert f"(the full config: {run_dir / 'config.yaml'})" in log and "max_steps: 30" not in log
    # plain progress lines (not a terminal), every metric named as in metrics.jsonl
    line = next(s for s in res.stdout.splitlines() if "step 30/30" in s)
    for piece in [f"| {key} " for key in line_keys] + ["| eta "]:
        assert piece in line, (piece, line)
    assert "eval at step 30" in res.stdout and "checkpoint:" in res.stdout
    assert "data loss: without using the context 2.079, best possible at seq_len" in res.stdout
    assert "eval/loss" in res.stdout.splitlines()[-1]  # the last line: what the loss shows
    assert "the no-context floor is 2.079" in res.stdout.splitlines()[-1]


def _tiny(tmp_path, *extra):
    return compose(TINY + list(extra))


def test_resume_continues_with_exactly_the_same_losses(tmp_path):
    full = run(_tiny(tmp_path, "trainer.max_steps=8", "trainer.ckpt_interval=4"), tmp_path / "a")
    again = run(_tiny(tmp_path, "trainer.max_steps=8", "trainer.ckpt_interval=0"), tmp_path / "b")
    assert full["losses"] == again["losses"]  # same seed and config: same losses
    assert len(full["losses"]) == 8

    # an explicit checkpoint, into a new run directory
    ckpt4 = tmp_path / "a" / "checkpoints" / "step_000004"
    resumed = run(_tiny(tmp_path, "trainer.max_steps=8", f"trainer.resume={ckpt4}"), tmp_path / "c")
    assert resumed["losses"] == full["losses"][4:]
    assert resumed["evals"] == full["evals"][-1:]

    # a branch in a's own folder from its step 4, saving every 2 steps with keep_last=1 (issue
    # 56, 1: the prune deleted the new step 6 and kept a's abandoned step 8): the new line is
    # the run's, a's step 8 is set aside whole, and a's metrics hold each step once
    checkpoints = tmp_path / "a" / "checkpoints"
    abandoned_step_8 = digest(checkpoints / "step_000008")
    branch = ["trainer.ckpt_interval=2", "trainer.keep_last=1", f"trainer.resume={ckpt4}"]
    branched = run(_tiny(tmp_path, "trainer.max_steps=8", *branch), tmp_path / "a")
    assert branched["losses"] == full["losses"][4:]
    assert [c.step for c in find_checkpoints(checkpoints)] == [8]
    assert branched["checkpoint"] == str(checkpoints / "step_000008")
    (set_aside,) = (checkpoints / "abandoned").glob("*/step_000008")
    assert digest(set_aside) == abandoned_step_8
    assert step_losses(tmp_path / "a" / "metrics.jsonl") == dict(full["losses"])

    # resume=auto in the same run directory, after a run that stopped at step 4 (its schedule
    # pinned to the full run's: optim.decay_steps)
    run(_tiny(tmp_path, "trainer.max_steps=4", "optim.decay_steps=8"), tmp_path / "d")
    auto = run(_tiny(tmp_path, "trainer.max_steps=8", "trainer.resume=auto"), tmp_path / "d")
    assert auto["losses"] == full["losses"][4:]
    assert step_losses(tmp_path / "d" / "metrics.jsonl") == dict(full["losses"])


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path):
    out = run(_tiny(tmp_path, "trainer.max_steps=2", "trainer.resume=auto"), tmp_path / "r")
    assert [s for s, _ in out["losses"]] == [1, 2]


def test_max_steps_zero_builds_and_prints_params(tmp_path, caplog):
    caplog.set_level("INFO", logger="flashtrain")
    out = run(_tiny(tmp_path, "trainer.max_steps=0"), tmp_path / "z")
    from flashtrain.models import build_model

    cfg = _tiny(tmp_path)
    expected = build_model(cfg.model, cfg.attention).num_parameters()
    assert out["params"] == expected and f"\nparams: {expected}\n" in caplog.text
    assert "dry run: nothing written" in caplog.text and "trainer:" not in caplog.text


def test_gpt2_16k_on_cpu_refuses_with_the_estimate_and_the_override(tmp_path):
    res = run_train(["model=gpt2", "seq_len=16384", "logger=none"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "per optimizer step on this CPU" in out
    assert "trainer.allow_slow_cpu=true" in out
    assert re.search(r"^params: \d+$", out, re.M)  # it built and described the model first
    assert "Traceback" not in out
    assert not list((tmp_path / "outputs").glob("*/*"))  # a refused run leaves no run folder


def test_the_design_cards_command_with_its_advice_refuses_on_host_memory(tmp_path, monkeypatch):
    """`model=gpt2 seq_len=16384 trainer.allow_slow_cpu=true` crashed in the allocator after
    minutes: refused at start (exit 2 through train.py) with the estimate and what fits."""
    from flashtrain.train import host_memory, trainer

    available = host_memory.HostAvailable(24 * 2**30, "MemAvailable in /proc/meminfo")
    monkeypatch.setattr(trainer, "available_host_memory", lambda: available)  # a 24 GiB host
    cfg = compose(["model=gpt2", "seq_len=16384", "logger=none", "trainer.allow_slow_cpu=true"])
    with pytest.raises(ConfigError) as error:
        run(cfg, tmp_path / "r")
    message = str(error.value)
    assert re.search(
        r"this CPU run needs ~\d+\.\d GiB .* of host memory, \d+ MiB of it already in use by "
        r"the running processes; 24.0 GiB is available",
        message,
    )
    assert "micro_batch_size=1 fits" in message and not (tmp_path / "r").exists()


def test_seq_len_the_model_cannot_take(tmp_path):
    with pytest.raises(ConfigError, match="longer than the model takes"):
        run(_tiny(tmp_path, "model.max_seq_len=32"), tmp_path / "s")


class TestBadCheckpoints:
    @pytest.fixture
    def saved(self, tmp_path):
        run(_tiny(tmp_path, "trainer.max_steps=2", "trainer.ckpt_interval=1"), tmp_path / "a")
        return tmp_path / "a" / "checkpoints"

    def test_corrupt(self, tmp_path, saved):
        blob = saved / "step_000002" / "model_optim.pt"
        blob.write_bytes(blob.read_bytes()[:1000])
        before = digest(saved)
        with pytest.raises(CheckpointError, match="corrupt"):
            run(_tiny(tmp_path, "trainer.max_steps=4", f"trainer.resume={saved}"), tmp_path / "b")
        assert digest(saved) == before
        assert not (tmp_path / "b" / "checkpoints").exists()

    def test_mismatched_model(self, tmp_path, saved):
        before = digest(saved)
        cfg = _tiny(tmp_path, "trainer.max_steps=4", "trainer.resume=auto", "model.d_model=32")
        with pytest.raises(CheckpointError, match="does not fit this model"):
            run(cfg, tmp_path / "a")
        assert digest(saved) == before

    def test_existing_checkpoints_are_not_overwritten_by_a_fresh_run(self, tmp_path, saved):
        before = digest(saved)
        with pytest.raises(ConfigError, match="already holds checkpoints"):
            run(_tiny(tmp_path, "trainer.max_steps=4", "trainer.keep_last=1"), tmp_path / "a")
        assert digest(saved) == before

    def test_cli_reports_without_traceback(self, tmp_path, saved):
        shutil.copytree(saved, tmp_path / "copy")
        (tmp_path / "copy" / "step_000002" / "trainer.pt").write_bytes(b"garbage")
        args = TINY + ["trainer.max_steps=4", f"trainer.resume={tmp_path / 'copy'}"]
        res = run_train(args, cwd=tmp_path)
        assert res.returncode == 2
        assert "CheckpointError" in res.stdout + res.stderr and "corrupt" in res.stdout + res.stderr
        assert "Traceback" not in res.stderr


def test_wandb_mode_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = compose([o for o in TINY if o != "logger=none"] + ["trainer.max_steps=1"])
    run(cfg, tmp_path / "w")
    assert not list((tmp_path / "w").glob("wandb/offline-run-*"))
    monkeypatch.delenv("WANDB_MODE")
    cfg = compose([o for o in TINY if o != "logger=none"] + ["trainer.max_steps=1"])
    run(cfg, tmp_path / "w2")
    (offline,) = (tmp_path / "w2").glob("wandb/offline-run-*")
    assert offline.is_dir()


def test_cpu_run_is_fp32_and_reproducible(tmp_path):
    torch.manual_seed(0)
    a = run(_tiny(tmp_path, "trainer.max_steps=3", "seed=7"), tmp_path / "a")
    torch.manual_seed(99)  # global state before the run does not matter
    b = run(_tiny(tmp_path, "trainer.max_steps=3", "seed=7"), tmp_path / "b")
    c = run(_tiny(tmp_path, "trainer.max_steps=3", "seed=8"), tmp_path / "c")
    assert a["losses"] == b["losses"] and a["losses"] != c["losses"]


@pytest.mark.slow  # ~9 s on 2 idle cores: left out of the normal suite (10 minutes)
def test_compiled_blocks_train_like_eager(tmp_path):
    """trainer.compile=true: inductor compiles each block through the attention custom ops."""
    eager = run(_tiny(tmp_path, "trainer.max_steps=3"), tmp_path / "eager")
    compiled = run(_tiny(tmp_path, "trainer.max_steps=3", "trainer.compile=true"), tmp_path / "c")
    assert [s for s, _ in compiled["losses"]] == [s for s, _ in eager["losses"]] == [1, 2, 3]
    for (_, a), (_, b) in zip(eager["losses"], compiled["losses"]):
        assert abs(a - b) < 1e-4 * abs(a), (eager["losses"], compiled["losses"])


@pytest.mark.slow  # ~21 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_multirun_sweep(tmp_path):
    res = run_train(["-m", *TINY, "trainer.max_steps=2", "optim.lr=1e-3,2e-3"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = sorted((tmp_path / "multirun").glob("*/*/[0-9]"))
    assert [j.name for j in jobs] == ["0", "1"]
    lrs = []
    for job in jobs:
        assert find_checkpoints(job / "checkpoints")[-1].step == 2
        lrs.append((job / ".hydra" / "overrides.yaml").read_text())
    assert "optim.lr=0.001" in lrs[0] and "optim.lr=0.002" in lrs[1]


@pytest.mark.slow
def test_python_train_py_as_is(tmp_path):
    """`python train.py` exactly as a user types it: about two minutes on 2 CPU cores."""
    env = subprocess_env()
    env.pop("OMP_NUM_THREADS")
    res = run_train([], cwd=tmp_path, timeout=900, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    rows = read_metrics(run_dir / "metrics.jsonl")
    losses = [r[TRAIN_LOSS] for r in rows if TRAIN_LOSS in r]
    assert losses[-1] < losses[0] - 0.5, losses  # from ~ln(16) = 2.77
    # From ~ln(16) = 2.77 to clearly below ln(8) = 2.079, the floor of a model blind to the context.
    final_eval = [r["eval/loss"] for r in rows if "eval/loss" in r][-1]
    assert final_eval < 2.079 - 0.3, final_eval
    assert "the model uses its context" in res.stdout.splitlines()[-1]
    assert find_checkpoints(run_dir / "checkpoints")
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def test_classification_and_mlm_report_accuracy(tmp_path):
    common = [
        "logger=none",
        "trainer.max_steps=2",
        "trainer.progress=lines",
        "micro_batch_size=2",
        "global_batch_size=4",
        "model.n_layer=1",
        "model.n_head=2",
        "model.d_model=32",
        "model.d_ff=64",
    ]
    cls = run(
        compose(
            common
            + [
                "model=pathx-classifier",
                "data=pathfinder32",
                "seq_len=1024",
                "data.num_samples=40",
                "data.num_workers=1",
                f"data.cache_dir={tmp_path / 'cache'}",
            ]
        ),
        tmp_path / "cls",
    )
    (step, metrics) = cls["evals"][-1]
    assert step == 2 and set(metrics) == {"eval/loss", "eval/accuracy"}
    assert 0.0 <= metrics["eval/accuracy"] <= 1.0

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i % 10} of a tiny corpus words.\n\n" for i in range(300)))
    vocab = tmp_path / "vocab.txt"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab.write_text(
        "\n".join(specials + "line of a tiny corpus words .".split() + list("0123456789"))
    )
    mlm = run(
        compose(
            common
            + [
                "model=bert-base",
                "data=bert_mlm",
                "seq_len=32",
                f"data.data_files={corpus}",
                f"data.tokenizer_path={vocab}",
                "data.sample_by=paragraph",
                "data.vocab_size=22",  # the lines of vocab.txt
                f"data.cache_dir={tmp_path / 'cache'}",
            ]
        ),
        tmp_path / "mlm",
    )
    metrics = mlm["evals"][-1][1]
    assert set(metrics) == {"eval/loss", "eval/ppl", "eval/accuracy"}
    rows = read_metrics(tmp_path / "mlm" / "metrics.jsonl")
    # the MLM head's argmax runs in evaluation only, never in a training step
    assert not any(TRAIN_ACCURACY in r for r in rows if TRAIN_LOSS in r)
