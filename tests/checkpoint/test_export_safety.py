"""scripts/export_hf.py never loses data: an OUT_DIR that is, holds or lies inside the run it
exports is refused, --overwrite replaces only a previous export (its flashtrain_export.json),
a killed export's hidden folders are cleaned by the next one, and a run folder whose newest
checkpoint is damaged exports the newest intact one, saying which it passed over."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def _one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("export_hf")]
    assert len(err) == 1, err
    return err[0]


def _writes_through_permission_bits(folder) -> bool:
    """Root (CAP_DAC_OVERRIDE) writes into a folder whose mode says no."""
    try:
        (folder / "probe").touch()
    except PermissionError:
        return False
    (folder / "probe").unlink()
    return True


@pytest.mark.parametrize("out", ["locked/exported", "locked/new/exported"])
def test_an_out_dir_in_a_folder_this_user_cannot_write_is_one_line_naming_it(
    run, tmp_path, capsys, out
):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if _writes_through_permission_bits(locked):
        locked.chmod(0o755)
        pytest.skip(
            "this user (root) writes through permission bits; test_a_read_only_or_full_file_"
            "system_is_one_line_naming_out_dir covers a refused write there"
        )
    try:
        assert main([str(run), str(tmp_path / out)]) == 2
    finally:
        locked.chmod(0o755)
    refusal = _one_line(capsys)
    assert f"OUT_DIR {tmp_path / out} cannot be written: Permission denied" in refusal
    assert "choose an OUT_DIR in a folder you can write" in refusal and ".tmp-" not in refusal
    assert list(locked.iterdir()) == []


def test_a_full_disk_is_one_line_naming_out_dir_and_leaves_nothing(
    run, tmp_path, capsys, monkeypatch
):
    from flashtrain.checkpoint import export_hf

    def disk_full(folder):  # fsync is where a full disk often shows (delayed allocation)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_hf, "finish_files", disk_full)
    out = tmp_path / "exported"
    assert main([str(run), str(out)]) == 2
    refusal = _one_line(capsys)
    assert f"OUT_DIR {out} cannot be written: No space left on device" in refusal
    assert "free space" in refusal and ".tmp-" not in refusal
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no partial export, no lock


IN_OWN_MOUNTS = """
mount -t tmpfs -o ro,size=64k tmpfs "$1" && mount -t tmpfs -o size=12k tmpfs "$2" || exit 77
shift 2
exec "$@"
"""
EXPORT_TWICE = """
import contextlib, io, json, os, sys
from flashtrain.checkpoint.export_cli import main

run, *outs = sys.argv[1:]
results = []
for out in outs:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([run, out])
    results.append([code, err.getvalue(), sorted(os.listdir(os.path.dirname(out)))])
print(json.dumps(results))
"""


def test_a_read_only_or_full_file_system_is_one_line_naming_out_dir(run, tmp_path):
    """Real mounts (a private mount namespace: root, or skipped): a read-only tmpfs, and one
    whose 12 KB take the lock and config.json but not the weights."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    read_only, full = tmp_path / "read-only", tmp_path / "full"
    read_only.mkdir()
    full.mkdir()
    outs = [str(read_only / "exported"), str(full / "exported")]
    repo = Path(__file__).resolve().parents[2]
    res = subprocess.run(
        ["unshare", "-m", "sh", "-c", IN_OWN_MOUNTS, "sh", str(read_only), str(full),
         sys.executable, "-c", EXPORT_TWICE, str(run), *outs],
        capture_output=True, text=True, timeout=120, cwd=repo,
    )  # fmt: skip
    if res.returncode == 77 or "unshare failed" in res.stderr:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {res.stderr[-300:]}")
    assert res.returncode == 0, res.stderr[-3000:]
    (ro_code, ro_err, ro_left), (full_code, full_err, full_left) = json.loads(res.stdout)
    assert ro_code == 2 and len(ro_err.strip().splitlines()) == 1, ro_err
    assert f"OUT_DIR {outs[0]} cannot be written: Read-only file system" in ro_err
    assert "choose an OUT_DIR on a writable file system" in ro_err and ".tmp-" not in ro_err
    full_err = [line for line in full_err.splitlines() if line.startswith("export_hf")]
    assert full_code == 2 and len(full_err) == 1, full_err
    assert f"OUT_DIR {outs[1]} cannot be written: No space left on device" in full_err[0]
    assert "free space" in full_err[0] and ".tmp-" not in full_err[0]
    assert ro_left == full_left == []  # no partial export, temporary folder or lock


@pytest.mark.parametrize("target", ["a previous export", "nothing"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_symlink_out_dir_is_refused_naming_where_it_points(
    run, tmp_path, capsys, target, overwrite
):
    """An export replaces OUT_DIR whole: the link itself, not the folder it names."""
    real = tmp_path / "real"
    if target == "a previous export":
        assert main([str(run), str(real)]) == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    assert main([str(run), str(link)] + (["--overwrite"] if overwrite else [])) == 2
    refusal = _one_line(capsys)
    assert f"OUT_DIR {link} is a symbolic link to {real}" in refusal
    assert link.is_symlink() and os.readlink(link) == str(real)
    want = ["home", "link"] + (["real"] if target == "a previous export" else [])
    assert sorted(p.name for p in tmp_path.iterdir()) == want


@pytest.mark.parametrize(
    "out, overwrite, says",
    [
        ("notes.txt", False, "notes.txt exists; pass overwrite=True (--overwrite)"),
        ("notes.txt", True, "notes.txt is a file and is not a previous export"),
        ("notes.txt/exported", False, "notes.txt is a file, not a folder; choose another OUT_DIR"),
        ("notes.txt/a/exported", True, "notes.txt is a file, not a folder; choose another OUT_DIR"),
        ("broken/exported", False, "broken is a broken symbolic link, not a folder; choose"),
    ],
)
def test_a_file_at_or_above_out_dir_is_one_line(run, tmp_path, capsys, out, overwrite, says):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "broken").symlink_to(tmp_path / "gone")
    assert main([str(run), str(tmp_path / out)] + (["--overwrite"] if overwrite else [])) == 2
    refusal = _one_line(capsys)
    assert f"{tmp_path / out}" in refusal and says in refusal
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "home", "notes.txt"]
