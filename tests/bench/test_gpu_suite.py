"""scripts/gpu_suite.py end to end on CPU (--dry-run): every section runs at toy sizes and writes
its results, so the script cannot meet a GPU with a typo; --resume, --sections and the budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ["correctness", "peaks", "attention", "sweep", "training", "long"]


def suite(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env["FLASHTRAIN_CPU_ATTENTION"] = "torch"  # the CPU path: the interpreter is for kernel tests
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_suite.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    res = suite("--dry-run", "--out", str(out))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_dry_run_writes_every_section(dry_run):
    state = json.loads((dry_run / "suite.json").read_text())
    assert list(state["sections"]) == SECTIONS
    for name, sec in state["sections"].items():
        assert sec["status"] == "done", (name, sec.get("traceback", sec["status"]))
    env = state["runs"][-1]
    for key in ("device", "torch", "triton", "cuda", "commit"):
        assert key in env
    sections = state["sections"]
    assert sections["correctness"]["passed"] and len(sections["correctness"]["rows"]) >= 17
    assert (
        sections["peaks"]["matmul_peak_tflops"] > 0 and sections["peaks"]["copy_bandwidth_gbs"] > 0
    )
    methods = {r["method"] for r in sections["attention"]["rows"]}
    assert {"flashtrain", "sdpa_flash_attention", "sdpa_cudnn_attention", "flex"} <= methods
    assert len(sections["attention"]["targets"]) == 8
    assert (dry_run / sections["sweep"]["table_file"]).is_file()
    runs = sections["training"]["runs"]
    assert {(r["attention"], r["compile"]) for r in runs} == {
        ("flash", False),
        ("sdpa", False),
        ("flash", True),
    }
    assert all(r["tokens_per_s"] > 0 and r["step_split_ms"]["matmul"] > 0 for r in runs)
    assert {r["mode"] for r in sections["long"]["rows"]} == {"fwd", "bwd", "fwd_bwd"}
    summary = (dry_run / "summary.md").read_text()
    for piece in (
        "DRY RUN",
        "Correctness: ",
        "Targets (issue 12)",
        "Tile sweep",
        "GPT-2 training",
        "Long",
    ):
        assert piece in summary, piece
    for png in ("attention-tflops.png", "attention-fwd-tflops.png", "training-tokens-per-s.png"):
        assert (dry_run / png).stat().st_size > 1000, png


def test_resume_keeps_finished_sections_and_budget_skips(dry_run):
    before = json.loads((dry_run / "suite.json").read_text())["sections"]
    res = suite("--dry-run", "--out", str(dry_run), "--resume", "--sections", "peaks", "long")
    assert res.returncode == 0, res.stderr[-2000:]
    after = json.loads((dry_run / "suite.json").read_text())
    assert after["sections"] == before  # done sections are not run again, none is lost
    assert len(after["runs"]) == 2
    res = suite("--dry-run", "--out", str(dry_run), "--sections", "long", "--budget-min", "0.001")
    assert res.returncode == 0, res.stderr[-2000:]
    sections = json.loads((dry_run / "suite.json").read_text())["sections"]
    assert sections["long"]["status"].startswith("skipped: budget")
    assert sections["training"] == before["training"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_refuses_without_cuda_unless_dry_run_and_bad_budget(tmp_path, capsys):
    """In this process (the script's main): both refusals come before any work."""
    import runpy

    gpu_suite = runpy.run_path(str(REPO / "scripts" / "gpu_suite.py"))
    assert gpu_suite["main"](["--out", str(tmp_path), "--sections", "peaks"]) == 2
    assert "no CUDA device; use --dry-run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        gpu_suite["main"](["--dry-run", "--out", str(tmp_path), "--budget-min", "0"])
    assert exit_info.value.code == 2 and "--budget-min must be > 0" in capsys.readouterr().err
