"""scripts/export_hf.py never loses data: an OUT_DIR that is, holds or lies inside the run it
exports is refused, --overwrite replaces only a previous export (its flashtrain_export.json),
a killed export's hidden folders are cleaned by the next one, and a run folder whose newest
checkpoint is damaged exports the newest intact one, saying which it passed over."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from omegaconf import OmegaConf

from flashtrain.checkpoint.export_cli import main
from flashtrain.checkpoint.export_hf import EXPORT_MARKER
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.models import build_model

pytest.importorskip("transformers")

DEAD_PID = 2**31 - 7  # above any pid_max: no such process


def _save(checkpoints, step: int, seed: int):
    torch.manual_seed(seed)
    model = build_model(
        dict(arch="gpt2", n_layer=1, n_head=2, d_model=16, max_seq_len=16, vocab_size=32),
        {"impl": "reference"},
    )
    meta = {"model_config": dataclasses.asdict(model.config), "run_name": "safety"}
    return save_checkpoint(
        checkpoints, step, model=model, optimizer=torch.optim.AdamW(model.parameters()),
        trainer_state={}, meta=meta, config_yaml=OmegaConf.to_yaml({"data": {"name": "synthetic"}}),
    )  # fmt: skip


@pytest.fixture
def run(tmp_path):
    """home/run: a run folder (checkpoints/step_000001, a metrics file) inside a folder."""
    run = tmp_path / "home" / "run"
    _save(run / "checkpoints", 1, seed=0)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


def _run_is_whole(run) -> bool:
    step = run / "checkpoints" / "step_000001"
    return (
        (step / "meta.json").is_file()
        and (step / "model_optim.pt").is_file()
        and (run / "metrics.jsonl").is_file()
    )


@pytest.mark.parametrize(
    "source, out, overwrite",
    [
        ("run", "home/run", True),  # the command: exit 0 and the run was gone
        ("run", "home/run/exported", False),  # inside the run folder
        ("run", "home", True),  # a folder holding the run
        ("checkpoints", "home/run", True),  # the run of a checkpoints folder given directly
        ("step", "home/run/checkpoints/step_000001", True),  # the step folder itself
        ("step", "home/link/exported", False),  # inside the run, through a symlink
    ],
)
def test_an_out_dir_that_is_holds_or_lies_in_the_run_is_refused(
    run, source, out, overwrite, tmp_path, capsys
):
    home = run.parent
    (home / "link").symlink_to(run)
    sources = {"run": run, "checkpoints": run / "checkpoints",
               "step": run / "checkpoints" / "step_000001"}  # fmt: skip
    argv = [str(sources[source]), str(tmp_path / out)] + (["--overwrite"] if overwrite else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "export_hf: ValueError: OUT_DIR" in err and "choose an OUT_DIR outside" in err
    assert _run_is_whole(run)
    assert sorted(p.name for p in home.iterdir()) == ["link", "run"]  # nothing written beside
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]


def test_overwrite_refuses_a_folder_that_is_not_an_export_naming_what_it_holds(
    run, tmp_path, capsys
):
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    assert main([str(run), str(mine), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "is not a previous export" in err and "notes/, thesis.tex" in err
    assert EXPORT_MARKER in err
    assert (mine / "thesis.tex").read_text() == "years of work" and (mine / "notes").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "mine"]  # no temporary left


def test_overwrite_replaces_a_previous_export(run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main([str(run), str(out)]) == 0
    marker = json.loads((out / EXPORT_MARKER).read_text())
    assert marker["exported_by"] == "flashtrain" and marker["checkpoint"] == "step_000001"
    assert marker["run"] == "safety" and "time" in marker and str(tmp_path) not in str(marker)
    (out / "stale.txt").write_text("from the previous export")
    assert main([str(run), str(out), "--overwrite"]) == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    # an export written before the marker existed is recognised by its README
    (out / EXPORT_MARKER).unlink()
    assert main([str(run), str(out), "--overwrite"]) == 0
    assert (out / EXPORT_MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "home"]
    capsys.readouterr()


def test_a_killed_exports_hidden_folders_are_cleaned_by_the_next_one(run, tmp_path):
    dead_tmp = tmp_path / f".exported.tmp-{DEAD_PID}-x1y2"
    dead_old = tmp_path / f".exported.old-{DEAD_PID}"
    live_tmp = tmp_path / f".exported.tmp-{os.getppid()}-a1b2"  # a live export's: kept
    others = tmp_path / ".exported-notes.tmp-1"  # not ours (another name): kept
    for folder in (dead_tmp, dead_old, live_tmp, others):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    assert main([str(run), str(tmp_path / "exported")]) == 0
    assert not dead_tmp.exists() and not dead_old.exists()
    assert live_tmp.is_dir() and others.is_dir()


def test_a_damaged_newest_checkpoint_is_passed_over_naming_it(run, tmp_path, capsys):
    newest = _save(run / "checkpoints", 2, seed=1)
    weights = newest / "model_optim.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    out = tmp_path / "exported"
    assert main([str(run), str(out)]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "passing over" in line]
    assert len(skipped) == 1 and "step_000002" in skipped[0] and "corrupt" in skipped[0]
    assert "checkpoint\n`step_000001` (step 1," in (out / "README.md").read_text()
    assert json.loads((out / EXPORT_MARKER).read_text())["step"] == 1
