"""A run whose newest checkpoint is damaged, handed to the commands after training: generate,
evaluate, export and model.init_from take its newest intact checkpoint with a line naming the
damaged one (as a resume does); a damaged step_NNNNNN folder named explicitly is refused (exit 2)
naming the file and what to do instead, in the words of the command in use (never a resume's
"trainer.resume=auto" advice).

Damage probed: a tensor file whose bytes changed (its checksum fails), a listed file missing, an
empty tensor file, an unreadable meta.json, a sharded (DCP) checkpoint without a shard; and,
refused rather than passed over, a checkpoint of a newer format version or without meta.json.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint import CheckpointError, export_cli, initial_weights, load_model
from flashtrain.checkpoint.read import MODEL_OPTIM, TRAINER_STATE
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.inference import evaluate_cli, generate_cli
from flashtrain.models import build_model

GPT2 = dict(arch="gpt2", n_layer=1, n_head=2, d_model=16, max_seq_len=32, vocab_size=16)
SYNTHETIC = dict(loader="synthetic", num_keys=4, num_values=4, vocab_size=16)
PROMPT = ["--prompt", "1 2 3", "--max-new-tokens", "4", "--temperature", "0", "--device", "cpu"]
RESUME_ADVICE = "trainer.resume"  # a resume's words: no help to these commands


def _save(checkpoints: Path, step: int, *, sharded: bool = False) -> Path:
    """Checkpoint `step` of a GPT-2 of weights drawn from seed `step` (each step's differ)."""
    torch.manual_seed(step)
    model = build_model(GPT2, "reference")
    config = {"model": GPT2, "attention": {"impl": "reference"}, "data": SYNTHETIC,
              "seq_len": GPT2["max_seq_len"], "seed": 0}  # fmt: skip
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return save_checkpoint(
            checkpoints, step, model=model, optimizer=torch.optim.SGD(model.parameters()),
            trainer_state={"step": step}, meta={"run_name": "damaged", "model_config": GPT2},
            config_yaml=OmegaConf.to_yaml(config), sharded=sharded,
        )  # fmt: skip


def _flip_a_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _two_step_run(run: Path, *, sharded: bool = False) -> Path:
    for step in (1, 2):
        _save(run / "checkpoints", step, sharded=sharded)
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Steps 1 and 2, step 2's model_optim.pt changed on disk (its checksum fails)."""
    run = _two_step_run(tmp_path_factory.mktemp("damaged") / "run")
    _flip_a_byte(run / "checkpoints" / "step_000002" / MODEL_OPTIM)
    return run


@pytest.fixture(scope="module")
def step_1_text(run) -> str:
    """What greedy generation from the intact step 1, named explicitly, prints."""
    code, out, _ = _generate([str(run / "checkpoints" / "step_000001"), *PROMPT])
    assert code == 0
    return out


def _generate(argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of scripts/generate.py argv."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = generate_cli.main(argv, out=out)
    return code, out.getvalue(), err.getvalue()


def _evaluate(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = evaluate_cli.main([*argv, "--no-progress", "--device", "cpu"])
    return code, err.getvalue()


def _export(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = export_cli.main(argv)
    return code, err.getvalue()


def _one_skip_line(err: str, damaged: str, *named: str) -> str:
    """The one line of `err` that passes over checkpoint `damaged`, naming `named` too."""
    lines = [line for line in err.splitlines() if damaged in line]
    assert len(lines) == 1, err
    assert all(n in lines[0] for n in named), lines[0]
    assert RESUME_ADVICE not in err, err
    return lines[0]


def _meta_model():
    with torch.device("meta"):
        return build_model(GPT2, "reference")


def _saved_weights(step_dir: Path) -> dict:
    state = torch.load(step_dir / MODEL_OPTIM, map_location="cpu", weights_only=True)
    return state["model"]


# ---- the newest checkpoint damaged: the newest intact one, with a line naming the damaged one


def test_generate_takes_the_newest_intact_checkpoint(run, step_1_text):
    code, out, err = _generate([str(run), *PROMPT])
    assert code == 0, err
    assert out == step_1_text
    line = _one_skip_line(err, "step_000002", MODEL_OPTIM)
    assert line.startswith("note: passing over checkpoint "), line  # the command's own note


def test_evaluate_takes_the_newest_intact_checkpoint(run, tmp_path):
    out = tmp_path / "eval"
    code, err = _evaluate([str(run / "checkpoints"), "--seq-len", "8", "--batches", "1",
                           "--out", str(out)])  # fmt: skip
    assert code == 0, err
    report = json.loads((out / "eval.json").read_text())
    assert (report["checkpoint"], report["step"]) == (str(run / "checkpoints/step_000001"), 1)
    line = _one_skip_line(err, "step_000002", MODEL_OPTIM)
    assert line.startswith("note: passing over checkpoint "), line


def test_init_from_takes_the_newest_intact_checkpoint(run, caplog):
    model = _meta_model()
    with caplog.at_level(logging.INFO, logger="flashtrain"):
        initial_weights(model, str(run), device="cpu")
    want = _saved_weights(run / "checkpoints" / "step_000001")
    for name, value in model.state_dict().items():
        assert torch.equal(value, want[name]), name
    warnings_ = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    line = _one_skip_line("\n".join(warnings_), "step_000002", MODEL_OPTIM)
    assert line.startswith(f"model.init_from={run}: "), line  # the log says whose line it is


def test_load_model_tells_on_note(run):
    notes = []
    _, info = load_model(run, on_note=notes.append)
    assert info.step == 1
    _one_skip_line("\n".join(notes), "step_000002", MODEL_OPTIM)


# ---- a damaged step folder named explicitly: refused, naming the file and what to do instead


def _says_what_to_do_instead(err: str, run: Path) -> None:
    assert "step_000002" in err and MODEL_OPTIM in err and "corrupt" in err, err
    assert f"name {run} to take its newest intact checkpoint" in err, err
    assert RESUME_ADVICE not in err, err


def test_generate_refuses_a_damaged_step_folder_named_explicitly(run):
    code, out, err = _generate([str(run / "checkpoints" / "step_000002"), *PROMPT])
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    _says_what_to_do_instead(err, run)


def test_evaluate_refuses_a_damaged_step_folder_named_explicitly(run, tmp_path):
    code, err = _evaluate([str(run / "checkpoints" / "step_000002"), "--seq-len", "8",
                           "--out", str(tmp_path / "eval")])  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    _says_what_to_do_instead(err, run)
    assert not (tmp_path / "eval").exists()


def test_init_from_refuses_a_damaged_step_folder_named_explicitly(run):
    step_2 = run / "checkpoints" / "step_000002"
    with pytest.raises(CheckpointError) as err:
        initial_weights(_meta_model(), str(step_2), device="cpu")
    assert str(err.value).startswith(f"model.init_from={step_2}: ")
    _says_what_to_do_instead(str(err.value), run)


def test_export_refuses_a_damaged_step_folder_named_explicitly(run, tmp_path):
    code, err = _export([str(run / "checkpoints" / "step_000002"), str(tmp_path / "out")])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    _says_what_to_do_instead(err, run)


# ---- nothing intact: refused in the command's words


@pytest.fixture(scope="module")
def all_damaged(tmp_path_factory) -> Path:
    run = _two_step_run(tmp_path_factory.mktemp("all_damaged") / "run")
    for step_dir in (run / "checkpoints").glob("step_*"):
        _flip_a_byte(step_dir / MODEL_OPTIM)
    return run


def test_commands_refuse_a_run_with_no_intact_checkpoint(all_damaged, tmp_path):
    code, out, err = _generate([str(all_damaged), *PROMPT])
    assert (code, out) == (2, "")
    assert "step_000001" in err and "step_000002" in err  # each named, on a line of its own
    assert err.splitlines()[-1].startswith("error: none of the 2 checkpoint(s)"), err
    assert RESUME_ADVICE not in err, err
    code, err = _export([str(all_damaged), str(tmp_path / "out")])
    assert code == 2 and "none of the 2 checkpoint(s)" in err and RESUME_ADVICE not in err, err
    with pytest.raises(CheckpointError) as error:
        initial_weights(_meta_model(), str(all_damaged), device="cpu")
    message = str(error.value)
    assert message.startswith(f"model.init_from={all_damaged}: none of the 2"), message
    assert RESUME_ADVICE not in message


# ---- other damage to the newest checkpoint


def _empty_model_optim(step_dir: Path) -> str:
    (step_dir / MODEL_OPTIM).write_bytes(b"")
    return f"{MODEL_OPTIM} has 0 bytes"


def _no_trainer_state(step_dir: Path) -> str:
    (step_dir / TRAINER_STATE).unlink()
    return f"{TRAINER_STATE} (listed in its meta.json) is missing"


def _garbage_meta(step_dir: Path) -> str:
    (step_dir / "meta.json").write_text("{not json")
    return "cannot read meta.json"


def _missing_shard(step_dir: Path) -> str:
    (shard,) = step_dir.glob("*.distcp")
    shard.unlink()
    return f"{shard.name} (listed in its meta.json) is missing"


DAMAGE = {
    "empty tensor file": (_empty_model_optim, False),
    "missing file": (_no_trainer_state, False),
    "unreadable meta.json": (_garbage_meta, False),
    "dcp missing shard": (_missing_shard, True),
}


@pytest.fixture(scope="module")
def intact_runs(tmp_path_factory) -> dict[bool, Path]:
    """{sharded: a run of two intact checkpoints}, copied by the tests that damage one."""
    root = tmp_path_factory.mktemp("intact")
    return {sharded: _two_step_run(root / f"sharded_{sharded}", sharded=sharded)
            for sharded in (False, True)}  # fmt: skip


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


@pytest.mark.parametrize("damage", DAMAGE)
def test_other_damage_to_the_newest_is_passed_over_or_refused_when_named(
    damage, intact_runs, tmp_path
):
    spoil, sharded = DAMAGE[damage]
    run = _copy(intact_runs[sharded], tmp_path / "run")
    step_2 = run / "checkpoints" / "step_000002"
    what = spoil(step_2)
    code, out, err = _generate([str(run), *PROMPT])
    assert code == 0, err
    _one_skip_line(err, "step_000002", what)
    model = _meta_model()
    initial_weights(model, str(run), device="cpu")
    code, out, err = _generate([str(step_2), *PROMPT])
    assert (code, out) == (2, ""), err
    assert what in err and f"name {run} to take its newest intact checkpoint" in err, err
    assert RESUME_ADVICE not in err, err


def test_a_newer_format_version_is_refused_not_passed_over(intact_runs, tmp_path):
    """A checkpoint newer flashtrain wrote is intact as far as can be told: going back past it
    would silently take older weights. Refused, saying to update flashtrain, not to resume."""
    run = _copy(intact_runs[False], tmp_path / "run")
    meta_file = run / "checkpoints" / "step_000002" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "version": 99}))
    code, out, err = _generate([str(run), *PROMPT])
    assert (code, out) == (2, "")
    assert "format version 99" in err and "update flashtrain" in err, err
    assert "resume" not in err, err
    code, err = _export([str(run), str(tmp_path / "out")])
    assert code == 2 and "update flashtrain" in err and "resume" not in err, err


def test_a_step_folder_without_meta_json_named_explicitly(intact_runs, tmp_path):
    """A step folder without meta.json (a prune or a copy cut short) is no checkpoint: named
    explicitly, refused saying what to name instead."""
    run = _copy(intact_runs[False], tmp_path / "run")
    step_2 = run / "checkpoints" / "step_000002"
    (step_2 / "meta.json").unlink()
    code, out, err = _generate([str(step_2), *PROMPT])
    assert (code, out) == (2, "")
    assert "not a complete flashtrain checkpoint" in err, err
    assert f"name {run} to take its newest intact checkpoint" in err, err
    assert "Resume" not in err and RESUME_ADVICE not in err, err
    _, info = load_model(run)  # the run: its newest checkpoint, step 1
    assert info.step == 1
