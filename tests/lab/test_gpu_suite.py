"""The GPU suite (flashtrain.lab.gpu_suite) end to end on CPU with --dry-run: every section runs at
toy sizes and streams its measurements into --out (flat, at most 8 files), a SIGINT mid-run
leaves a valid record of what finished, a missing wheel fails only the section that needs it and
says so, the budget skips what does not fit, and the pytest section keeps its log and junit. An
error in flashtrain's own op fails its section (a baseline's is only a note), a CUDA fault stops
the suite, and a section launches every shape it times in its compile phase first. The training
section runs the trainer per model, length and attention; its targets read rows of real sizes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from flashtrain.lab.bench import baselines, correctness, training
from flashtrain.lab.bench.training import baseline_note
from flashtrain.lab.gpu_suite import cli
from flashtrain.lab.gpu_suite.record import Record, Section
from flashtrain.lab.gpu_suite.sections import missing_modules
from flashtrain.lab.gpu_suite.summary import derive, summary_markdown
from flashtrain.lab.gpu_suite.targets import training_targets
from flashtrain.train.faults import NonFiniteLossError

REPO = Path(__file__).resolve().parents[2]


def state(out: Path) -> dict:
    return json.loads((out / "suite.json").read_text())


def assert_flat_and_few(out: Path) -> None:
    """What comes back from a GPU call: at most 8 files, no deeper than OUT/a/file, no temporaries."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files
    assert all(len(p.relative_to(out).parts) <= 2 for p in files), files
    assert not [p for p in files if p.name.endswith(".tmp")], files


@pytest.fixture
def cpu_route(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")  # the interpreter is for kernel tests


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    mp = pytest.MonkeyPatch()
    mp.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    try:
        code = cli.main(["--dry-run", "--out", str(out)])
    finally:
        mp.undo()
    return out, code


def test_dry_run_streams_every_section(dry_run):
    out, code = dry_run
    record = state(out)
    assert code == 0, {n: s["status"] for n, s in record["sections"].items()}
    assert list(record["sections"]) == list(cli.DEFAULT)  # the order of value
    for name, sec in record["sections"].items():
        assert sec["status"] == "done", (name, sec.get("traceback", sec["status"]))
        assert set(sec["measured"]) == set(sec["planned"]) and sec["planned"], name
    env = record["runs"][-1]
    for key in ("device", "driver", "torch", "triton", "cuda", "commit", "missing_modules"):
        assert key in env
    sections = record["sections"]
    assert len(sections["correctness"]["rows"]) == 11 and sections["correctness"]["passed"]
    kinds = {(r["kind"], r["deterministic"]) for r in sections["correctness"]["rows"]}
    assert {("gqa", False), ("varlen", False), ("blocksparse", False), ("varlen", True)} <= kinds
    peaks = {k: v for r in sections["peaks"]["rows"] for k, v in r.items()}
    assert peaks["matmul_peak_tflops"] > 0 and peaks["copy_bandwidth_gbs"] > 0
    rows = sections["attention"]["rows"]
    assert {r["method"] for r in rows} == {"flashtrain", "sdpa_flash_attention",
                                           "sdpa_cudnn_attention", "flex"}  # fmt: skip
    assert {(r["head_dim"], r["causal"], r["seqlen"]) for r in rows if not r["variant"]} == {
        (d, c, s) for d in (16, 32) for c in (False, True) for s in (64, 128)
    }
    planned = sections["attention"]["planned"]  # targets' shapes, block-sparse, then the rest
    assert planned[12:15] == [
        "blocksparse flashtrain",
        "blocksparse flex",
        "blocksparse dense flashtrain",
    ]
    targets = sections["attention"]["targets"]
    assert len(targets) == 8 and targets[0]["ratio"] > 0
    assert (out / sections["sweep"]["table_file"]).is_file()
    # the dry run checks descriptor loads first, so the forward's Hopper variants are timed
    assert sections["sweep"]["tma_allowed"]
    assert {"fwd/16/float32 32x16 w4 s1 tma ws", "fwd/16/float32 32x16 w4 s1 tma persistent",
            "fwd/16/float32 32x16 w4 s1 tma ws persistent"} <= set(sections["sweep"]["measured"])  # fmt: skip
    check_training(sections["training"], out)
    assert {(r["causal"], r["mode"]) for r in sections["long"]["rows"]} == {
        (c, m) for c in (True, False) for m in ("fwd", "bwd", "fwd_bwd")
    }
    for name in ("correctness", "attention", "long", "sweep"):  # they launch our kernels
        assert sections[name]["compile_seconds"] >= 0, name
    summary = (out / "summary.md").read_text()
    for piece in ("DRY RUN", "Correctness: 11/11", "Targets (issue 12)", "Tile sweep",
                  "Long sequence", "| attention | done | 27/27 |",
                  "| seconds | compile s |"):  # fmt: skip
        assert piece in summary, piece
    assert (out / "attention-fwd-bwd.png").stat().st_size > 1000
    assert_flat_and_few(out)


def check_training(sec: dict, out: Path) -> None:
    """The training section of a dry run: a row per model, length and attention through the
    trainer, the micro-batch auto chose, the profiled step's split, the targets computed on the
    dry numbers, the table in summary.md and the plot."""
    runs = sec["rows"]
    assert [(r["model"], r["seqlen"], r["attention"]) for r in runs] == [
        (m, s, a) for m, s in (("gpt2", 64), ("llama-125m", 128))
        for a in ("flash", "sdpa-flash", "sdpa-cudnn")
    ]  # fmt: skip
    # cuDNN has no CPU kernel: a baseline's missing kernel is a note, the run still ok
    cudnn = [r for r in runs if r["attention"] == "sdpa-cudnn"]
    assert all(r["note"].startswith("unsupported: No viable backend") for r in cudnn)
    measured = [r for r in runs if r["attention"] != "sdpa-cudnn"]
    for r in measured:
        assert r["tokens_per_s"] > 0 and r["mfu_percent"] > 0 and r["step_ms"] > 0, r
        # micro_batch_size=auto on a CPU is 8; 1024 tokens a step: 16 sequences at 64, 8 at 128
        assert r["micro_batch_size"] == 8 and r["grad_accum"] == 1024 // r["seqlen"] // 8, r
        split = r["split"]
        assert split["device"] == "cpu" and split["ms_per_step"]["matmul"] > 0, split
        assert sum(split["ms_per_step"].values()) == pytest.approx(split["window_ms"], rel=0.02)
    targets = {t["target"]: t for t in sec["targets"]}
    assert targets["GPT-2 small 1K MFU % (flash)"]["ratio"] > 0
    assert targets["Llama-125M 16K tokens/s flash vs best SDPA"]["ratio"] > 0
    assert targets["step split accounts for the GPU window (worst row)"]["passed"]
    summary = (out / "summary.md").read_text()
    for piece in ("## Training through the trainer (issue 44)", "| micro x accum |",
                  "| matmul | attention | loss | elementwise | optimizer | other | idle |",
                  "| gpt2 | 64 | flash | 8 x 2 |", "| llama-125m | 128 | sdpa-cudnn | unsupported",
                  "### Targets (issue 44, predictions)"):  # fmt: skip
        assert piece in summary, piece
    if not missing_modules(["matplotlib"]):
        assert (out / "training-mfu.png").stat().st_size > 1000


def test_second_call_names_the_gpu_and_measures_decode(tmp_path, cpu_route):
    """Call 2 of docs/gpu_session.md: its files start with the environment though it names only
    decode; every decode method per cache length, in summary.md."""
    code = cli.main(["--dry-run", "--out", str(tmp_path), "--sections", "decode"])
    record = state(tmp_path)
    assert code == 0, {n: s["status"] for n, s in record["sections"].items()}
    assert list(record["sections"]) == ["environment", "decode"]
    assert "device" in record["runs"][-1]
    rows = record["sections"]["decode"]["rows"]
    assert {(r["cache_len"], r["method"]) for r in rows} == {
        (n, m) for n in (64, 256) for m in ("kvcache", "kvcache-1", "flash", "sdpa")
    }
    assert all(r["max_abs_diff_vs_kvcache"] < 1e-4 for r in rows), rows
    assert record["sections"]["decode"]["compile_seconds"] >= 0
    summary = (tmp_path / "summary.md").read_text()
    for piece in ("## Decode step", "| 256 | sdpa |"):
        assert piece in summary, piece
    assert_flat_and_few(tmp_path)


def training_row(model, seqlen, attention, tokens_per_s, mfu, window=100.0, accounted=100.0):
    buckets = {"matmul": accounted / 2, "attention": accounted / 4, "idle": accounted / 4}
    split = {"window_ms": window, "ms_per_step": buckets} if window else None
    return {"model": model, "seqlen": seqlen, "attention": attention,
            "tokens_per_s": tokens_per_s, "mfu_percent": mfu, "split": split}  # fmt: skip


def test_training_targets_at_real_sizes():
    """GPT-2 at 1K with our attention against 45% MFU; Llama at 16K ours over the faster SDPA
    backend (an unsupported one left out); the worst row's split against its GPU window, and a
    row without a split fails that target."""
    rows = [
        training_row("gpt2", 1024, "flash", 3e5, 46.0),
        training_row("gpt2", 1024, "sdpa-flash", 3e5, 50.0),  # not ours: not the MFU target
        training_row("llama-125m", 16384, "flash", 1.2e5, 30.0, accounted=101.0),
        training_row("llama-125m", 16384, "sdpa-flash", 1.0e5, 25.0),
        training_row("llama-125m", 16384, "sdpa-cudnn", 1.5e5, 37.0, accounted=99.5),
        {"model": "llama-125m", "seqlen": 1024, "attention": "sdpa-cudnn", "note": "unsupported"},
    ]
    mfu, vs_sdpa, split = training_targets(rows, dry=False)
    assert (mfu["ratio"], mfu["passed"]) == (46.0, True)
    assert vs_sdpa["ratio"] == pytest.approx(1.2 / 1.5) and vs_sdpa["passed"] is False
    assert split["ratio"] == pytest.approx(0.99) and split["passed"] is True
    rows[1]["split"] = None  # step_split could not account for its window
    assert training_targets(rows, dry=False)[2]["passed"] is False
    assert [t["passed"] for t in training_targets([], dry=False)] == [None, None, None]


def test_only_a_baselines_missing_kernel_is_a_note():
    """A trainer run of an SDPA backend that raises is a note; ours, out of memory, a CUDA fault
    and flashtrain's own errors (a non-finite loss) are failures."""
    assert baseline_note("sdpa-cudnn", RuntimeError("No available kernel. Aborting.")) == (
        "unsupported: No available kernel."
    )
    for attention, err in (("flash", RuntimeError("No available kernel.")),
                           ("sdpa-flash", torch.OutOfMemoryError("CUDA out of memory.")),
                           ("sdpa-flash", RuntimeError(CUDA_FAULT)),
                           ("sdpa-flash", NonFiniteLossError(3, float("nan"), 1.0, None))):  # fmt: skip
        assert baseline_note(attention, err) is None, err


def test_a_trainer_run_refused_by_its_sdpa_backend_is_a_note(tmp_path, monkeypatch, cpu_route):
    """Past the probe (a backend that runs on the device but not on a run's shapes): the trainer
    raises at its first step, closes, and the row is the note."""
    monkeypatch.setattr(training, "backend_missing", lambda attention, device: None)
    row = training.run_training("gpt2", 64, "sdpa-cudnn", False, training.Schedule(1, 1, 1), 256,
                                tmp_path, dry_run=True)  # fmt: skip
    assert (
        row["note"] == "unsupported: No viable backend for scaled_dot_product_attention was found."
    )
    assert "tokens_per_s" not in row


def test_every_measurement_is_on_disk_before_the_next_starts(tmp_path):
    record = Record(tmp_path, 60.0, summary_markdown, derive)
    record.state["runs"].append({"dry_run": True})
    sec = record.section("peaks")
    sec.plan(["first", "second", "third"])
    sec.measure("first", lambda: {"matmul_peak_tflops": 1.5})
    seen = []
    sec.measure("second", lambda: seen.append(state(tmp_path)) or {"copy_bandwidth_gbs": 2.0})
    assert seen[0]["sections"]["peaks"]["measured"] == {"first": "ok"}
    assert "bf16 matmul 1.5 TFLOP/s" in (tmp_path / "summary.md").read_text()

    def broken():
        raise RuntimeError("no such backend")

    assert sec.measure("third", broken) is None
    status = sec.finish()
    assert status == "failed: 1 of 3 failed (first: third: RuntimeError: no such backend)"
    assert state(tmp_path)["sections"]["peaks"]["status"] == status


def raising(message: str):
    def fail(*args, **kwargs):
        raise RuntimeError(message)

    return fail


def attention_only(out: Path) -> tuple[int, dict]:
    code = cli.main(["--dry-run", "--out", str(out), "--sections", "attention"])
    return code, state(out)["sections"]["attention"]


def test_a_baselines_error_is_only_a_note(tmp_path, monkeypatch, cpu_route):
    """SDPA's FLASH backend raising RuntimeError (no kernel for these inputs) is noted
    "unsupported" on its rows; the attention section is still done."""
    real = baselines.dense_methods

    def without_sdpa_flash(q, k, v, **kwargs):
        methods = real(q, k, v, **kwargs)
        if "sdpa_flash_attention" in methods:
            methods["sdpa_flash_attention"] = (raising("injected: no kernel here"), (q, k, v))
        return methods

    monkeypatch.setattr(baselines, "dense_methods", without_sdpa_flash)
    code, sec = attention_only(tmp_path)
    assert code == 0 and sec["status"] == "done", sec["status"]
    noted = [r for r in sec["rows"] if r["method"] == "sdpa_flash_attention"]
    assert noted and {r["note"] for r in noted} == {"unsupported: injected: no kernel here"}
    assert all(r["ms"] is not None for r in sec["rows"] if r["method"] == "flashtrain")


def test_an_error_in_our_op_fails_the_section_and_is_quoted(tmp_path, monkeypatch, cpu_route):
    """The same RuntimeError from flashtrain's own op is a failed measurement (and a failed
    compile launch), never a note: the section fails and its status quotes the error."""
    monkeypatch.setattr(baselines, "flash_attn_func", raising("injected fault in our kernel"))
    code, sec = attention_only(tmp_path)
    assert code == 1
    quoted = "RuntimeError: injected fault in our kernel"
    assert sec["status"].startswith("failed: ") and quoted in sec["status"], sec["status"]
    ours = [n for n in sec["planned"] if n.startswith("hd") and n.endswith(" flashtrain")]
    assert len(ours) == 8 and all(sec["measured"][n] == f"failed: {quoted}" for n in ours)
    assert any(n.startswith("compile: ") for n in sec["measured"])  # the first launch failed too
    baseline = [n for n in sec["planned"] if n.endswith("sdpa_flash_attention")]
    assert all(sec["measured"][n] == "ok" for n in baseline)  # one failure loses nothing else
    assert not [r for r in sec["rows"] if r["method"] == "flashtrain" and not r["variant"]]
    assert "| attention | failed: " in (tmp_path / "summary.md").read_text()


CUDA_FAULT = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("where", ["measurement", "compile"])
def test_a_cuda_fault_stops_the_suite_and_it_still_writes(tmp_path, monkeypatch, cpu_route, where):
    """A sticky CUDA error in the second correctness case (its timed check, or its first launch
    in the compile phase): every later measurement is skipped, later sections are not started,
    both files are written, exit 1."""
    cases = correctness.default_cases(True)
    faulty = cases[1].name
    real = correctness.check_case if where == "measurement" else correctness.launch_once

    def fault_in_second(case, device):
        if case.name == faulty:
            raise RuntimeError(CUDA_FAULT)
        return real(case, device)

    monkeypatch.setattr(correctness, "check_case" if where == "measurement" else "launch_once",
                        fault_in_second)  # fmt: skip
    code = cli.main(["--dry-run", "--out", str(tmp_path), "--sections", "correctness",
                     "attention", "long"])  # fmt: skip
    assert code == 1
    record = state(tmp_path)
    sec = record["sections"]["correctness"]
    failed = faulty if where == "measurement" else f"compile: {faulty}"
    reason = f"CUDA fault in correctness / {failed}"
    assert sec["measured"][failed] == f"failed: RuntimeError: {CUDA_FAULT}"
    later = [c.name for c in cases[2:]] if where == "measurement" else [c.name for c in cases]
    assert {sec["measured"][n] for n in later} == {f"skipped: {reason}"}
    assert sec["status"].startswith("failed: 1 of ") and CUDA_FAULT in sec["status"]
    for name in ("attention", "long"):
        assert record["sections"][name]["status"] == f"not started: {reason}"
    assert f"| long | not started: {reason} |" in (tmp_path / "summary.md").read_text()


def test_compile_phase_launches_side_by_side_and_records_failures(tmp_path):
    """Section.compile runs the first launches on a pool (two launches that each wait for the
    other finish only if they run at once), adds its wall time to compile_seconds, records a
    raising launch as a failed measurement "compile: <what>", and stops the suite on a CUDA
    fault."""
    record = Record(tmp_path, 60.0, summary_markdown, derive)
    record.state["runs"].append({"dry_run": True})
    sec = record.section("long")
    sec.plan(["timed"])
    both_running = threading.Barrier(2, timeout=120)  # a hang guard: they meet at once

    def broken():
        both_running.wait()
        raise RuntimeError("no such kernel")

    sec.compile({"first": both_running.wait, "second": broken}, workers=2)
    assert sec.data["measured"] == {"compile: second": "failed: RuntimeError: no such kernel"}
    assert "RuntimeError: no such kernel" in sec.data["tracebacks"]["compile: second"]
    assert sec.data["compile_seconds"] >= 0 and record.stop_reason is None
    sec.compile({"third": raising(CUDA_FAULT)}, workers=2)
    assert record.stop_reason == "CUDA fault in long / compile: third"
    assert sec.measure("timed", lambda: pytest.fail("measured after a CUDA fault")) is None
    assert sec.finish() == (
        "failed: 2 of 3 failed (first: compile: second: RuntimeError: no such kernel)"
    )
    assert state(tmp_path)["sections"]["long"]["measured"]["timed"] == (
        "skipped: CUDA fault in long / compile: third"
    )


def test_compile_phase_launches_every_shape_a_section_times(tmp_path, monkeypatch, cpu_route):
    """Every call of our attention ops that a measurement makes (correctness, attention, long)
    was made before, with the same shapes, dtypes and arguments, in its section's compile
    phase: no measurement is the first launch of a kernel."""
    calls, phase = [], ["measure"]
    real_compile = Section.compile

    def compile_phase(self, launches, workers):
        phase[0] = "compile"
        try:
            real_compile(self, launches, workers)
        finally:
            phase[0] = "measure"

    def describe(value):
        return (tuple(value.shape), value.dtype) if torch.is_tensor(value) else repr(value)

    def spy(module, name):
        real = getattr(module, name)

        def call(*args, **kwargs):
            signature = (name, *map(describe, args), *sorted(kwargs.items()))
            calls.append((phase[0], signature))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    monkeypatch.setattr(Section, "compile", compile_phase)
    for module, name in ((baselines, "flash_attn_func"), (baselines, "blocksparse_attn_func"),
                         (correctness, "flash_attn_func"), (correctness, "blocksparse_attn_func"),
                         (correctness, "flash_attn_varlen_func")):  # fmt: skip
        spy(module, name)
    code = cli.main(["--dry-run", "--out", str(tmp_path), "--sections", "correctness",
                     "attention", "long"])  # fmt: skip
    assert code == 0
    compiled = set()
    for when, signature in calls:
        if when == "compile":
            compiled.add(signature)
        else:
            assert signature in compiled, signature
    assert {s[0] for w, s in calls if w == "measure"} == {
        "flash_attn_func", "blocksparse_attn_func", "flash_attn_varlen_func"
    }  # fmt: skip


def test_sigterm_stops_at_the_next_measurement(tmp_path):
    """The handler's effect, in this process: the measurement in flight ends, the next is
    skipped with the signal's name, and the section says so."""
    record = Record(tmp_path, 60.0, summary_markdown, derive)
    record.state["runs"].append({"dry_run": True})
    sec = record.section("peaks")
    sec.plan(["first", "second"])
    stop = lambda: record._on_signal(signal.SIGTERM, None) or {"matmul_peak_tflops": 1.0}  # noqa: E731
    sec.measure("first", stop)
    sec.measure("second", lambda: pytest.fail("started after the stop"))
    assert sec.finish() == "incomplete: 1 of 2 measured (stopped by SIGTERM)"
    measured = state(tmp_path)["sections"]["peaks"]["measured"]
    assert measured == {"first": "ok", "second": "skipped: stopped by SIGTERM"}


@pytest.mark.slow  # ~9 s on 2 idle cores: left out of the normal suite (10 minutes)
def test_sigint_mid_run_keeps_what_finished(tmp_path):
    """SIGINT while the training section runs: the measurement in flight finishes, nothing else
    starts, and suite.json holds every finished measurement; exit 130."""
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    env["FLASHTRAIN_CPU_ATTENTION"] = "torch"
    cmd = [sys.executable, "-m", "flashtrain.lab.gpu_suite.cli", "--dry-run", "--out",
           str(tmp_path), "--sections", "correctness", "training", "long"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600  # a hang guard: the section starts in seconds
        path = tmp_path / "suite.json"
        while not (path.is_file() and "training" in state(tmp_path)["sections"]):
            assert proc.poll() is None, "the suite ended before the signal"
            assert time.monotonic() < deadline, "the training section never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=600)[0].decode()
    finally:
        proc.kill()
    assert proc.returncode == 130, output[-3000:]
    sections = state(tmp_path)["sections"]
    assert sections["correctness"]["status"] == "done"
    assert len(sections["correctness"]["rows"]) == 11
    training = sections["training"]
    assert (
        training["status"].startswith("incomplete: ") and "stopped by SIGINT" in training["status"]
    )
    finished = [n for n, s in training["measured"].items() if s == "ok"]
    assert len(training["rows"]) == len(finished) < 2
    assert sections["long"]["status"] == "not started: stopped by SIGINT"
    assert "| training | incomplete" in (tmp_path / "summary.md").read_text()
    assert_flat_and_few(tmp_path)


def test_missing_wheel_fails_only_its_section(tmp_path, monkeypatch, cpu_route, capsys):
    monkeypatch.setitem(sys.modules, "hydra", None)  # as on the GPU image without the wheels
    code = cli.main(["--dry-run", "--out", str(tmp_path), "--sections", "peaks", "training"])
    assert code == 1
    assert "[suite] missing: hydra: carry their wheels" in capsys.readouterr().out  # named at start
    record = state(tmp_path)
    assert record["runs"][-1]["missing_modules"] == ["hydra"]
    assert record["sections"]["peaks"]["status"] == "done"
    assert record["sections"]["training"]["status"].startswith(
        "failed: hydra missing: carry their wheels"
    )


def test_budget_skips_and_says_so(tmp_path, cpu_route):
    code = cli.main(["--dry-run", "--out", str(tmp_path), "--sections", "peaks", "long",
                     "--budget-min", "1e-9"])  # fmt: skip
    assert code == 1
    for name, planned in (("peaks", 2), ("long", 2)):
        sec = state(tmp_path)["sections"][name]
        assert sec["status"] == f"incomplete: 0 of {planned} measured (budget)", sec
        assert set(sec["measured"].values()) == {"skipped: budget"}


@pytest.mark.slow  # ~10 s on 2 idle cores: left out of the normal suite (10 minutes)
def test_pytest_section_keeps_log_and_junit(tmp_path):
    selection = "-m gpu tests/attention/test_attention_gpu.py"  # every case skips without CUDA
    code = cli.main(["--dry-run", "--out", str(tmp_path), "--sections", "pytest",
                     "--pytest-args", selection])  # fmt: skip
    sec = state(tmp_path)["sections"]["pytest"]
    assert code == 0 and sec["status"] == "done", sec
    assert "skipped" in sec["rows"][0]["summary"]
    assert "skipped" in (tmp_path / "pytest.log").read_text()
    assert "<testsuite" in (tmp_path / "pytest-junit.xml").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_refuses_without_cuda_unless_dry_run_and_bad_budget(tmp_path, capsys):
    assert cli.main(["--out", str(tmp_path), "--sections", "peaks"]) == 2
    assert "no CUDA device; use --dry-run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dry-run", "--out", str(tmp_path), "--budget-min", "0"])
    assert exit_info.value.code == 2 and "--budget-min must be > 0" in capsys.readouterr().err
