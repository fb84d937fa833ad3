"""The GPU suite's loss section (flashtrain/lab/gpu_suite/loss_section.py) on CPU, dry run: every
(vocabulary, tokens, method) gets a row, the fused kernel (under the tests' TRITON_INTERPRET=1) and
the compiled baseline are checked against chunked before they are timed and a wrong one is never
timed, Liger's absence is a named skip, and loss_lines renders one table row per measurement."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from flashtrain.lab.bench import loss as loss_bench
from flashtrain.lab.bench.loss_methods import LIGER_MISSING
from flashtrain.lab.gpu_suite import loss_section
from flashtrain.lab.gpu_suite.loss_section import loss_lines, section_loss
from flashtrain.lab.gpu_suite.record import Record
from flashtrain.lab.gpu_suite.suite import Sizes, Suite

SKIP_LIGER = f"skipped: {LIGER_MISSING}"
ONE_SHAPE = SimpleNamespace(dtype=torch.float32, rep=2, matmul_n=64, loss_vocabs=((129, 16),),
                            loss_tokens=(32,))  # fmt: skip


def _render(state: dict) -> str:
    return "\n".join(loss_lines(state["sections"]["loss"])) + "\n"


def run_section(out, sizes, peaks: float | None = None):
    """section_loss through a dry-run Suite, as the suite calls it; (section data, seconds).
    peaks: a peaks section's bf16 matmul TFLOP/s already in the record."""
    if peaks is not None:
        out.mkdir(parents=True, exist_ok=True)
        state = {"sections": {"peaks": {"rows": [{"matmul_peak_tflops": peaks}]}}}
        (out / "suite.json").write_text(json.dumps(state))
    record = Record(out, 300.0, _render)
    suite = Suite(record, out, True, sizes, ())
    sec = record.section("loss")
    start = time.monotonic()
    section_loss(suite, sec)
    sec.finish()
    return record.state["sections"]["loss"], time.monotonic() - start


@pytest.fixture
def no_liger(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # as if not installed


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setitem(sys.modules, "liger_kernel", None)
    try:
        out = tmp_path_factory.mktemp("loss")
        sec, seconds = run_section(out, Sizes.for_run(True, 2))
    finally:
        mp.undo()
    return out, sec, seconds


def test_dry_run_times_every_method_after_its_check(dry):
    out, sec, seconds = dry
    assert sec["status"] == "done", (sec["status"], sec.get("tracebacks"))
    print(f"loss section, dry run: {seconds:.1f} s (compile phase {sec['compile_seconds']} s)")
    vocabs, tokens = loss_section.DRY_SIZES
    shapes = {(v, n) for v, _ in vocabs for n in tokens}
    assert sec["planned"][0] == loss_section.PEAK  # no peaks section in this record
    assert sec["peak_source"] == "this section" and sec["matmul_peak_tflops"] > 0
    timed = [r for r in sec["rows"] if r.get("kind") == "time"]
    assert {(r["vocab"], r["tokens"], r["method"]) for r in timed} == {
        (v, n, m) for v, n in shapes for m in loss_section.METHODS
    }
    for r in timed:
        if r["method"] == "liger":  # named, not failed: the measurement is ok
            assert r["ms"] is None and r["note"] == SKIP_LIGER, r
            continue
        assert r["ms"] > 0 and r["tflops"] > 0 and r["peak_fraction"] > 0, r
        assert r["flops"] == 6 * r["tokens"] * r["hidden"] * r["vocab"]
        assert r["meets_target"] == (r["peak_fraction"] >= 0.70)
    checks = [r for r in sec["rows"] if r.get("kind") == "check"]
    assert {(r["vocab"], r["tokens"]) for r in checks} == shapes
    for r in checks:
        assert r["fused_kernel"] == "triton"  # the kernel itself, interpreted
        assert r["fused"]["agrees"] and r["compiled"]["agrees"], r
        assert r["fused"]["dw"] < 1e-5 and r["liger"] == {"note": SKIP_LIGER}
    # every check precedes its shape's timings
    planned = sec["planned"]
    for v, n in shapes:
        names = [p for p in planned if f"V={v} " in p and f"N={n} " in p]
        assert names[0].endswith("check") and len(names) == 5
    summary = (out / "summary.md").read_text()
    assert summary.count("| V=") == 4 * 4 and SKIP_LIGER in summary
    assert "DRY RUN" in summary and "Target (issue 44)" in summary


def test_a_wrong_fused_kernel_is_not_timed(tmp_path, monkeypatch, no_liger):
    """A planted 10% error in the fused dW: the check fails, fused is refused, the rest timed;
    the peaks section's figure, already in the record, is the one used."""
    right = loss_section.loss_and_grads

    def planted(method, *args):
        loss, dh, dw = right(method, *args)
        return loss, dh, (dw * 1.1 if method == "fused" else dw)

    monkeypatch.setattr(loss_section, "loss_and_grads", planted)
    sec, _ = run_section(tmp_path, ONE_SHAPE, peaks=1000.0)
    assert sec["status"].startswith("failed: 2 of 5 failed"), sec["status"]
    assert loss_section.PEAK not in sec["planned"] and sec["matmul_peak_tflops"] == 1000.0
    check, fused = (f"V=129 C=16 N=32 {m}" for m in ("check", "fused"))
    assert sec["measured"][check].startswith("failed: wrong: fused: loss err")
    assert "dw err 1.0e-01" in sec["measured"][check]
    assert sec["measured"][fused].startswith("failed: not verified: loss err")
    rows = {r["measurement"]: r for r in sec["rows"]}
    assert rows[fused]["ms"] is None
    for method in ("chunked", "compiled"):
        row = rows[f"V=129 C=16 N=32 {method}"]
        assert row["ms"] > 0 and row["peak_fraction"] == row["tflops"] / 1000.0
    summary = (tmp_path / "summary.md").read_text()
    assert "WRONG" in summary and "failed: not verified" in summary


def test_liger_missing_is_a_named_skip_in_the_benchmark_cli(no_liger):
    point = loss_bench.measure_point("liger", 32, 16, 129, 16, 1)
    assert point == {"ms": None, "peak_mib": None, "note": SKIP_LIGER}


def _row(method, tokens, ms, tflops, fraction, note=""):
    return {"kind": "time", "vocab": 50257, "hidden": 768, "tokens": tokens, "method": method,
            "ms": ms, "tflops": tflops, "peak_fraction": fraction, "peak_mib": 100.0,
            "meets_target": None if fraction is None else fraction >= 0.7, "note": note,
            "measurement": f"GPT-2 V=50257 C=768 N={tokens} {method}"}  # fmt: skip


def test_loss_lines_one_row_per_measurement_with_its_verdict():
    """GPU-like figures: fused at 75% of an 800 TFLOP/s peak meets the target, chunked below;
    a missing Liger and a budget skip say so in their rows."""
    names = [f"GPT-2 V=50257 C=768 N={n} {m}" for n in (16384, 65536)
             for m in ("check", "fused", "chunked", "liger")]  # fmt: skip
    check = {"kind": "check", "vocab": 50257, "hidden": 768, "tokens": 16384,
             "fused_kernel": "triton", "measurement": names[0],
             "fused": {"loss": 1e-6, "dh": 4e-3, "dw": 5e-3, "agrees": True},
             "liger": {"note": SKIP_LIGER}}  # fmt: skip
    sec = {
        "dry": False, "target_vocab": 50257, "matmul_peak_tflops": 800.0,
        "peak_source": "peaks section", "planned": names,
        "cells": {n: [50257, 768, int(n.split("N=")[1].split()[0]), n.rsplit(" ", 1)[1]]
                  for n in names if not n.endswith("check")},
        "measured": {**{n: "ok" for n in names[:4]}, **{n: "skipped: budget" for n in names[4:]}},
        "rows": [check, _row("fused", 16384, 10.0, 600.0, 0.75),
                 _row("chunked", 16384, 15.0, 400.0, 0.5),
                 _row("liger", 16384, None, None, None, SKIP_LIGER)],
    }  # fmt: skip
    lines = loss_lines(sec)
    table = [ln for ln in lines if ln.startswith("| GPT-2")]
    assert len(table) == 6  # 2 token counts x 3 methods; the checks are columns, not rows
    fused, chunked, liger, *skipped = table
    assert "| 10.00 | 600.0 | 75% | 100 | 1e-06 / 4e-03 / 5e-03 | meets 70% |" in fused
    assert chunked.endswith("| reference | below 70% |")
    assert liger.endswith(f"| skipped | {SKIP_LIGER} |")
    assert all(r.endswith("| skipped: budget |") for r in skipped)
    target = next(ln for ln in lines if ln.startswith("Target (issue 44)"))
    assert "GPT-2's vocabulary >= 70%" in target and "N=16384: 75% (PASS)" in target
    assert not any("DRY RUN" in ln for ln in lines)
