"""The experiment driver (flashtrain.lab.reproduce, scripts/reproduce.py): the experiment
matrices, the commands, and a smoke run of the driver (real train.py subprocesses, a few steps of
a tiny model on the synthetic task)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashtrain.lab.experiments import EXPERIMENT_NAMES, SCALES, plan
from flashtrain.lab.experiments.matrices import MATRICES
from flashtrain.lab.experiments.overrides import (
    merge_overrides,
    override_key,
    override_value,
    preset_settings,
    setting,
)
from flashtrain.lab.experiments.spec import Run
from flashtrain.lab.reproduce import command, hydra_value, shown, train_state
from flashtrain.train.metric_names import TRAIN_LOSS


def all_plans():
    for experiment in EXPERIMENT_NAMES:
        for scale in MATRICES[experiment]:
            for data in MATRICES[experiment][scale].data or [None]:
                yield plan(experiment, scale, data)


def test_every_train_run_names_its_steps_and_every_name_is_unique():
    names = set()
    for p in all_plans():
        for run in p.runs:
            assert run.name not in names
            names.add(run.name)
            if run.kind == "train":
                assert setting(run.args, "trainer.max_steps") is not None, run.name
    assert {p.scale for p in all_plans()} == set(SCALES)


def test_context_length_sees_equal_tokens_per_step_at_every_context():
    for p in all_plans():
        if p.experiment != "context-length" or p.scale == "paper":
            continue
        tokens = set()
        for run in p.runs:
            seq_len = int(setting(run.args, "seq_len"))
            per_step = int(setting(run.args, "global_batch_tokens"))
            micro = int(setting(run.args, "micro_batch_size"))
            assert per_step % (seq_len * micro) == 0, run.name
            tokens.add(per_step)
        assert len(tokens) == 1 and len(p.runs) == 4


def test_each_experiment_is_defined_once_in_its_presets():
    """Every train run names an experiment preset, and no override of a matrix repeats a value
    its preset already sets (the run's settings live in configs/experiment/, the matrix holds
    what varies between runs)."""
    for p in all_plans():
        for run in p.runs:
            if run.kind != "train":
                continue
            name = override_value(run.args, "experiment")
            assert name is not None, run.name
            settings = preset_settings(name)
            for override in run.args:
                key, value = override_key(override), override.split("=", 1)[1]
                if key != "experiment" and key in settings:
                    assert str(settings[key]) != value, f"{run.name}: {override} repeats {name}"


def test_setting_reads_the_preset_chain_and_overrides_win():
    args = ("experiment=context-length/tiny-synthetic", "seq_len=64")
    assert setting(args, "trainer.max_steps") == "600"  # tiny-synthetic's own
    assert setting(args, "global_batch_tokens") == "2048"  # from context-length/tiny below it
    assert setting(args, "global_batch_size") == "null"
    assert setting(args, "data") == "synthetic" and setting(args, "model") == "gpt2-tiny"
    assert setting((*args, "trainer.max_steps=7"), "trainer.max_steps") == "7"
    assert setting(("experiment=speed-memory/tiny",), "trainer.eval_at_end") == "false"
    assert setting(("seq_len=64",), "trainer.max_steps") is None
    with pytest.raises(ValueError, match="no experiment preset nope"):
        setting(("experiment=nope",), "trainer.max_steps")


def test_paper_scale_runs_on_eight_gpus_and_pathx_starts_from_path64(tmp_path):
    p = plan("pathfinder", "paper")
    assert all(run.nproc == 8 for run in p.runs)
    argv = command(p.runs[1], tmp_path / "runs" / p.runs[1].name)
    assert shown(argv).startswith("torchrun --nproc_per_node=8 ")
    init = override_value(argv, "model.init_from")
    assert init == str(
        tmp_path / "runs" / p.runs[0].name / "checkpoints/step_050000/model_optim.pt"
    )


def test_overrides_merge_last_value_wins_and_values_are_quoted_for_hydra():
    merged = merge_overrides(["a=1", "b=2"], ["+a=3"], ["c=4"])
    assert merged == ["+a=3", "b=2", "c=4"] and override_value(merged, "a") == "3"
    assert hydra_value("/tmp/out-1/runs") == "/tmp/out-1/runs"
    assert hydra_value("/tmp/my runs/it's") == "'/tmp/my runs/it\\'s'"


def test_a_run_is_finished_at_its_last_step_and_final_evaluation(tmp_path):
    run = Run("r", ("trainer.max_steps=4",))
    assert train_state(run, tmp_path) == ("new", 0)
    rows = [{"step": 2, "loss": 1.0}, {"step": 4, "loss": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train_state(run, tmp_path) == ("partial", 4)  # killed before its final evaluation
    assert train_state(run, tmp_path, ["trainer.eval_at_end=false"]) == ("finished", 4)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "eval/loss": 0.95}) + "\n")
    assert train_state(run, tmp_path) == ("finished", 4)
    assert train_state(run, tmp_path, ["trainer.max_steps=8"]) == ("partial", 4)


def test_bad_choices_are_refused():
    with pytest.raises(ValueError, match="pysrc, synthetic"):
        plan("context-length", "tiny", "wikitext")
    with pytest.raises(ValueError, match="takes no --data"):
        plan("bert", "tiny", "pysrc")
    with pytest.raises(ValueError, match="unknown scale"):
        plan("bert", "huge")


def test_paper_scale_and_dry_run_print_commands_and_run_nothing(tmp_path, capsys):
    from flashtrain.lab import reproduce

    assert reproduce.main(["bert", "--scale", "paper", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "17.4" in out and "torchrun --nproc_per_node=8 train.py" in out and "--run" in out
    args = ["pathfinder", "--scale", "tiny", "--out", str(tmp_path), "--dry-run"]
    assert reproduce.main(args) == 0
    assert "python train.py" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()
    assert reproduce.main([*args, "--only", "nothing*"]) == 2
    assert "matches no run" in capsys.readouterr().err


SMOKE = [
    "--override",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "global_batch_tokens=256",
    "micro_batch_size=2",
    "trainer.log_interval=1",
    "trainer.eval_interval=2",
    "trainer.eval_batches=1",
    "trainer.ckpt_interval=2",
    "optim.warmup_steps=1",
]


def metrics_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if TRAIN_LOSS in json.loads(line)]


@pytest.mark.slow  # ~57 s on 2 busy cores: left out of the normal suite (10 minutes)
def test_driver_runs_reports_skips_finished_runs_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    from flashtrain.lab import reproduce

    out = tmp_path / "out"
    base = ["context-length", "--scale", "tiny", "--data", "synthetic", "--out", str(out)]
    # the lr schedule pinned to 4 steps: extending the runs below keeps it (a resume that would
    # change the schedule is refused: trainer.allow_schedule_change)
    base += ["--only", "*-ctx64", "*-ctx128", *SMOKE, "optim.decay_steps=4"]
    assert reproduce.main([*base, "trainer.max_steps=2"]) == 0
    first = capsys.readouterr().out
    assert first.count(": new") == 2 and "report:" in first
    runs = {ctx: out / "runs" / f"context-length-tiny-synthetic-ctx{ctx}" for ctx in (64, 128)}
    for run_dir in runs.values():
        assert metrics_steps(run_dir) == [1, 2]
        assert (run_dir / ".hydra" / "config.yaml").is_file()
    report = (out / "context-length.md").read_text()
    assert (
        "| `context-length-tiny-synthetic-ctx64` | gpt2 (gpt2-tiny) | tiny | done | 2/2 | 512 |"
        in report
    )
    assert "Tokens per optimizer step: 256 at every context length." in report
    assert (out / "context-length-loss.png").stat().st_size > 10_000

    # Again: both runs are finished, nothing runs, nothing is appended.
    before = {ctx: (d / "metrics.jsonl").read_text() for ctx, d in runs.items()}
    assert reproduce.main([*base, "trainer.max_steps=2"]) == 0
    second = capsys.readouterr().out
    assert second.count(": finished at step 2") == 2 and "running" not in second
    assert before == {ctx: (d / "metrics.jsonl").read_text() for ctx, d in runs.items()}

    # Longer: the runs are partial and continue from their step-2 checkpoints.
    assert reproduce.main([*base, "trainer.max_steps=4", "--only", "*-ctx64"]) == 0
    third = capsys.readouterr().out
    assert ": partial at step 2" in third
    assert metrics_steps(runs[64]) == [1, 2, 3, 4]
    assert "resumed from" in (runs[64] / "train.log").read_text()
    launches = json.loads((runs[64] / "reproduce.json").read_text())["launches"]
    assert [x["exit_code"] for x in launches] == [0, 0]
    assert "trainer.max_steps=4" in launches[-1]["command"]
    assert (
        "| `context-length-tiny-synthetic-ctx64` | gpt2 (gpt2-tiny) | tiny | done | 4/4 |"
        in (out / "context-length.md").read_text()
    )


@pytest.mark.slow  # ~9 s of interpreted kernels (the suite's 10 minutes)
def test_driver_runs_the_kernel_benchmark(tmp_path, capsys, monkeypatch):
    """speed-memory's benchmark run: on a CPU, bench_attention.py writes tile counts."""
    monkeypatch.delenv("RANK", raising=False)
    from flashtrain.lab import reproduce

    args = ["speed-memory", "--scale", "tiny", "--out", str(tmp_path), "--only", "*-kernels"]
    assert reproduce.main(args) == 0
    capsys.readouterr()
    report = (tmp_path / "speed-memory.md").read_text()
    expected = "tile counts" if not torch_cuda() else "dense sweep"
    assert expected in report.lower()


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
