"""Two exports into one OUT_DIR never both succeed: an export claims OUT_DIR (a lock beside it,
.NAME.lock) from its first write to its final rename, so a second one is refused while it writes
(exit 2, one line naming OUT_DIR and the holder), --overwrite or not; and an export never
replaces what appeared at OUT_DIR while it ran (an export that finished meanwhile, a copy).
The interleavings are made deterministic by hooks on the export's own steps."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from test_export_safety import _save

from flashtrain.checkpoint import export_hf
from flashtrain.checkpoint.export_cli import main

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "home" / "run"
    _save(run / "checkpoints", 1, seed=0)
    return run


def _export(run, out, *options) -> int:
    return main([str(run), str(out), *options])


def _dtype(out) -> str:
    """Which of the two exports OUT_DIR holds: the first is float32, the second bfloat16."""
    return json.loads((out / "config.json").read_text())["dtype"]


def _one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("export_hf")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_second_export_while_the_first_writes_is_refused(
    run, tmp_path, monkeypatch, capsys, overwrite
):
    out = tmp_path / "exported"
    write_files, second = export_hf.finish_files, []

    def second_export_starts(folder):  # the first export is writing its files
        if not second:
            second.append("started")
            options = ["--dtype", "bfloat16"] + (["--overwrite"] if overwrite else [])
            second.append(_export(run, out, *options))
        write_files(folder)

    monkeypatch.setattr(export_hf, "finish_files", second_export_starts)
    assert _export(run, out) == 0
    assert second == ["started", 2]
    refusal = _one_line(capsys)
    assert f"OUT_DIR {out} is being written by another export" in refusal
    assert f"pid {os.getpid()}" in refusal and "choose another OUT_DIR" in refusal
    assert _dtype(out) == "float32"  # the first's, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "home"]  # no lock left


def test_an_export_that_finished_meanwhile_is_not_replaced(run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "exported"
    load_model = export_hf.load_model

    def another_export_finishes(*args, **kwargs):  # while this one loads its model
        monkeypatch.setattr(export_hf, "load_model", load_model)
        assert _export(run, out, "--dtype", "bfloat16") == 0
        return load_model(*args, **kwargs)

    monkeypatch.setattr(export_hf, "load_model", another_export_finishes)
    assert _export(run, out) == 2
    refusal = _one_line(capsys)
    assert f"{out} appeared while this export ran" in refusal and "--overwrite" in refusal
    assert _dtype(out) == "bfloat16"  # the other's, kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "home"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_what_appears_before_the_final_rename_is_left_as_it_is(
    run, tmp_path, monkeypatch, capsys, overwrite
):
    """A writer that takes no claim (a copy, an older flashtrain) fills OUT_DIR meanwhile."""
    out = tmp_path / "exported"
    write_files = export_hf.finish_files

    def someone_fills_out_dir(folder):
        write_files(folder)
        out.mkdir()
        (out / "notes.txt").write_text("mine")

    monkeypatch.setattr(export_hf, "finish_files", someone_fills_out_dir)
    assert _export(run, out, *(["--overwrite"] if overwrite else [])) == 2
    refusal = _one_line(capsys)
    assert str(out) in refusal and ("--overwrite" in refusal or "another OUT_DIR" in refusal)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "home"]


PAUSED_EXPORT = """
import sys
from flashtrain.checkpoint import export_hf
from flashtrain.checkpoint.export_cli import main

def pause(folder):  # mid-export: its files written, not yet in place
    print("writing", flush=True)
    sys.stdin.read()

export_hf.finish_files = pause
main(sys.argv[1:])
"""


def test_two_processes_then_a_kill_mid_export(run, tmp_path, capsys):
    """A real second process, paused while it writes: this export is refused naming it; killed
    (kill -9), it leaves a lock file and a hidden folder that block nothing and are cleaned."""
    out = tmp_path / "exported"
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED_EXPORT, str(run), str(out)], cwd=REPO,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert select.select([first.stdout], [], [], 120)[0], "no word from the first export"
        said = first.stdout.readline()
        assert said == "writing\n", first.communicate(timeout=60)[1][-3000:]
        assert _export(run, out, "--overwrite") == 2
        refusal = _one_line(capsys)
        assert f"OUT_DIR {out} is being written by another export" in refusal
        assert f"pid {first.pid}" in refusal
    finally:
        first.kill()
        first.communicate(timeout=60)
    assert not out.exists()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".exported."))
    assert any(name.startswith(f".exported.tmp-{first.pid}-") for name in left), left
    assert _export(run, out) == 0  # the killed export blocks nothing, and its folder goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "home"]


def test_a_lock_file_this_user_cannot_write_still_claims(run, tmp_path):
    """A killed export of another user left its .NAME.lock (mode 0644, not ours): flock needs
    no write access, so it blocks nothing."""
    lock = tmp_path / ".exported.lock"
    lock.write_text('{"host": "elsewhere", "pid": 1}\n')
    lock.chmod(0o444)
    try:
        lock.open("a").close()
        pytest.skip("this user (root) writes through permission bits")
    except PermissionError:
        pass
    assert _export(run, tmp_path / "exported") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "home"]
