"""Checkpoints written before the checkpoint package (issue 31) still load, resume and export.

tests/fixtures/checkpoints_2026_11/ holds two tiny GPT-2 runs written by the code at commit
a733383 (its README says how): one single-process "torch" checkpoint and one FSDP2 "dcp"
checkpoint of two ranks, both at step 2. Checked here against them, never rewriting them (every
test that could write next to a checkpoint works on a copy in tmp_path, and the module checks the
fixture folder byte for byte afterwards):

- load_model of each (run directory, checkpoints folder, step folder) holds exactly the tensors
  read without flashtrain (torch.load; DCP through torch's own dcp_to_torch_save), and names
  the run, the step and the commit of its run.json;
- the same `python train.py` command today writes the fixture's weights (to float32 rounding,
  which differs between CI's hosts): the model built on the meta device and materialised draws
  the old initial weights, and trains the same;
- resuming the old checkpoint continues it exactly as an uninterrupted run would have;
- model.init_from of either (a run folder, the bare model_optim.pt) starts from exactly its
  weights;
- generate, evaluate and export_hf run on them (export: the folder maps back to the weights).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from config_testing import train_testing

from flashtrain.checkpoint import initial_weights, load_model
from flashtrain.models import build_model
from flashtrain.train.metric_names import TRAIN_LOSS

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "checkpoints_2026_11"
COMMIT = "a733383c265158c19d37dfb4080d11e8853eae0c"
RUN_NAME = "gpt2-tiny-synthetic-16"
STEP = "step_000002"
# the command the torch fixture was written with (tests/fixtures/checkpoints_2026_11/README.md)
TORCH_OVERRIDES = [
    "model=gpt2-tiny",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=16",
    "model.vocab_size=64",
    "seq_len=16",
    "global_batch_size=2",
    "trainer.eval_batches=1",
    "logger=none",
    "trainer.progress=lines",
    "trainer.max_steps=2",
    "trainer.ckpt_interval=0",
    "micro_batch_size=2",
]


_tt = train_testing()
read_metrics, run_train, step_losses = _tt.read_metrics, _tt.run_train, _tt.step_losses


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module", autouse=True)
def _fixtures_untouched():
    """The fixture folder is the same, file for file and byte for byte, after every test here."""
    before = _tree_digest(FIXTURES)
    assert any(name.endswith("model_optim.pt") for name in before)
    assert any(name.endswith(".distcp") for name in before)
    yield
    assert _tree_digest(FIXTURES) == before, "a test wrote into tests/fixtures/checkpoints_2026_11"


@pytest.fixture(autouse=True)
def _torch_attention(monkeypatch):
    """The runs' attention config says flash: on CPU, its PyTorch path (not the interpreter)."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")


def _copy(fmt: str, tmp_path: Path) -> Path:
    """A copy of fixture run `fmt` (torch | dcp) to work on."""
    return Path(shutil.copytree(FIXTURES / fmt, tmp_path / f"old-{fmt}"))


def _saved_weights(fmt: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The fixture's model tensors, read with torch alone."""
    step_dir = FIXTURES / fmt / "checkpoints" / STEP
    if fmt == "torch":
        return torch.load(step_dir / "model_optim.pt", map_location="cpu", weights_only=True)[
            "model"
        ]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / "dcp_as_torch.pt"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_to_torch_save(str(step_dir), str(out))
    state = torch.load(out, map_location="cpu", weights_only=False)
    if isinstance(state.get("model"), dict):  # {"model": {...}, "optim": {...}}
        return state["model"]
    return {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}


def _assert_same_tensors(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize("form", ["run", "checkpoints", "step"])
@pytest.mark.parametrize("fmt", ["torch", "dcp"])
def test_load_model_reads_exactly_the_saved_tensors(fmt, form, tmp_path):
    run = FIXTURES / fmt
    ref = {"run": run, "checkpoints": run / "checkpoints", "step": run / "checkpoints" / STEP}[form]
    model, info = load_model(ref)
    want = _saved_weights(fmt, tmp_path)
    _assert_same_tensors(model.state_dict(), want)
    assert not model.training
    assert info.step == 2
    assert info.path.resolve() == (run / "checkpoints" / STEP).resolve()
    assert info.run_name == RUN_NAME
    assert info.commit == COMMIT == json.loads((run / "run.json").read_text())["commit"]
    assert info.facts()["commit"] == COMMIT


def test_the_two_fixtures_hold_different_weights(tmp_path):
    """So that a loader reading one fixture for the other fails the tests here."""
    torch_w, dcp_w = _saved_weights("torch", tmp_path), _saved_weights("dcp", tmp_path)
    assert torch_w.keys() == dcp_w.keys()
    assert not torch.equal(torch_w["wte.weight"], dcp_w["wte.weight"])


def _train_in_process(overrides: list[str], run_dir: Path, monkeypatch) -> None:
    """The trainer as `python train.py overrides` runs it (one thread, PyTorch attention, as the
    fixture was written), in this process: no interpreter start-up per run."""
    from config_testing import compose

    from flashtrain.train import run

    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(compose(overrides), run_dir)
    finally:
        torch.set_num_threads(threads)


# ATen's vectorised CPU kernels the fixture was written with (on an AVX2 machine): with AVX-512
# kernels the attention's backward sums in another order and c_attn differs in the last bits
# after two Adam steps (measured: 3e-8 on an AMD EPYC with AVX-512).
FIXTURE_CPU_KERNELS = "avx2"
# Even so, CI's hosts differ from run to run, and one of them (stop 58) trained weights that
# differ from the fixture's although the kernels were pinned. Another host's float32 rounding
# moves a few weights in the last bits (3e-8 measured on AVX-512), more where Adam divides a
# near-zero gradient by its own root mean square, but never by more than the two steps' updates
# taken the other way (2 x (1.5e-4 + 3e-4), the warm-up's lr: UPDATE_BOUND); a different
# initial draw moves every weight by ~2e-2, and different data (data.num_keys=7) or another
# update (optim.lr=3.1e-3) moves 88-100% of each tensor's weights past 1e-6 (checked). So:
# every weight within UPDATE_BOUND, and all but ROUNDING_SHARE of each tensor within
# ROUNDING_ATOL.
UPDATE_BOUND = 1e-3
ROUNDING_ATOL = 1e-6
ROUNDING_SHARE = 0.01


def _assert_trained_alike(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    off = {}
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        diff = (got[name].double() - value.double()).abs()
        share = float((diff > ROUNDING_ATOL).double().mean())
        if float(diff.max()) > UPDATE_BOUND or share > ROUNDING_SHARE:
            off[name] = f"max {float(diff.max()):.2e}, {share:.1%} past {ROUNDING_ATOL}"
    assert not off, f"weights differ from the fixture's: {off}"


def test_todays_run_writes_the_old_weights(tmp_path):
    """The fixture's own command, today (one thread, PyTorch attention, the fixture's CPU
    kernels): the meta-device build, materialised, draws the same initial weights as the old CPU
    build, and two steps of training give the same weights (bit for bit on the fixture's kind of
    host; to float32 rounding on another: _assert_trained_alike)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip(
            f"the fixture's AVX2 kernels do not run on this CPU "
            f"({torch.backends.cpu.get_cpu_capability()}): bit-for-bit needs the same kernels"
        )
    env = _tt.subprocess_env(ATEN_CPU_CAPABILITY=FIXTURE_CPU_KERNELS)
    done = run_train([*TORCH_OVERRIDES, "hydra.run.dir=new"], tmp_path, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    new = torch.load(
        tmp_path / "new" / "checkpoints" / STEP / "model_optim.pt",
        map_location="cpu",
        weights_only=True,
    )["model"]
    _assert_trained_alike(new, _saved_weights("torch", tmp_path))


@pytest.mark.slow  # two `python train.py` runs, ~25-40 s on 2 busy cores
def test_resuming_the_old_checkpoint_continues_it_exactly(tmp_path):
    """trainer.resume of the old step-2 checkpoint for one more step: the step-3 loss and
    weights of an uninterrupted 3-step run (lr warmup: steps 1-3 have the same lr either way)."""
    old = _copy("torch", tmp_path)
    three = [*TORCH_OVERRIDES, "trainer.max_steps=3", "trainer.log_interval=1"]
    resumed = run_train(
        [*three, f"trainer.resume={old / 'checkpoints'}", "trainer.allow_schedule_change=true",
         "hydra.run.dir=resumed"],
        tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"resumed from {old / 'checkpoints' / STEP} at step 2" in resumed.stdout + resumed.stderr
    fresh = run_train([*three, "hydra.run.dir=fresh"], tmp_path)
    assert fresh.returncode == 0, (fresh.stdout + fresh.stderr)[-3000:]

    got, want = (
        step_losses(tmp_path / "resumed" / "metrics.jsonl"),
        step_losses(tmp_path / "fresh" / "metrics.jsonl"),
    )
    assert sorted(got) == [3] and sorted(want) == [1, 2, 3]
    assert got[3] == want[3], (got, want)
    weights = {
        name: torch.load(
            tmp_path / name / "checkpoints" / "step_000003" / "model_optim.pt",
            map_location="cpu",
            weights_only=True,
        )["model"]
        for name in ("resumed", "fresh")
    }
    _assert_same_tensors(weights["resumed"], weights["fresh"])
    assert [p.name for p in (old / "checkpoints").iterdir() if p.name.startswith("step_")] == [
        STEP
    ]  # the resumed run wrote into its own folder


def test_resuming_the_old_checkpoint_starts_at_its_step(tmp_path, monkeypatch, caplog):
    """One run (the exact comparison with an uninterrupted run is the slow test above): it picks
    up at step 2, trains step 3 only and checkpoints it."""
    old = _copy("torch", tmp_path)
    overrides = [*TORCH_OVERRIDES, "trainer.max_steps=3", "trainer.log_interval=1",
                 f"trainer.resume={old / 'checkpoints'}", "trainer.allow_schedule_change=true"]  # fmt: skip
    with caplog.at_level("INFO", logger="flashtrain"):
        _train_in_process(overrides, tmp_path / "resumed", monkeypatch)
    assert f"resumed from {old / 'checkpoints' / STEP} at step 2" in caplog.text
    records = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert sorted({r["step"] for r in records if r.get(TRAIN_LOSS) is not None}) == [3]
    ckpt = tmp_path / "resumed" / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == "step_000003"
    model, info = load_model(ckpt)
    assert info.step == 3
    before = _saved_weights("torch", tmp_path)
    assert not torch.equal(model.state_dict()["wte.weight"], before["wte.weight"])  # trained on


@pytest.mark.parametrize(
    "fmt, ref",
    [
        ("torch", "torch"),
        ("torch", "torch/checkpoints/step_000002/model_optim.pt"),
        ("dcp", "dcp"),
        ("dcp", "dcp/checkpoints"),
    ],
    ids=["torch-run", "torch-model_optim.pt", "dcp-run", "dcp-checkpoints"],
)
def test_init_from_an_old_checkpoint_starts_from_its_weights(fmt, ref, tmp_path):
    """model.init_from=<old checkpoint> as the trainer applies it in one process: built on the
    meta device, then initial_weights."""
    meta = json.loads((FIXTURES / fmt / "checkpoints" / STEP / "meta.json").read_text())
    cfg = {**meta["model_config"], "init_from": str(FIXTURES / ref)}
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build_model(cfg, "reference")
    report = initial_weights(model, cfg["init_from"], device="cpu")
    _assert_same_tensors(model.state_dict(), _saved_weights(fmt, tmp_path))
    assert sorted(report.read) == sorted(model.state_dict()) and not report.kept_fresh


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            h = model.hidden_states(torch.tensor([ids]))[0, -1]
            logits = h @ model.output_weight().t()
            ids.append(int(logits[: model.config.vocab_size].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("fmt", ["torch", "dcp"])
def test_generate_continues_a_prompt_with_the_old_weights(fmt, tmp_path):
    from flashtrain.inference.generate_cli import main

    old = _copy(fmt, tmp_path)
    out = io.StringIO()
    argv = [str(old), "--prompt", "1 2 3", "--max-new-tokens", "4", "--temperature", "0"]
    assert main([*argv, "--device", "cpu"], out=out) == 0
    text = out.getvalue().strip()
    assert text.startswith("1 2 3")
    new = [int(t) for t in text[len("1 2 3") :].split()]
    assert new == _greedy(load_model(FIXTURES / fmt)[0], [1, 2, 3], 4)


def test_evaluate_scores_the_old_checkpoint(tmp_path, capsys):
    """scripts/evaluate.py's command on the old dcp checkpoint, at its trained length and
    beyond (positions interpolated: the checkpoint reloaded with a longer table)."""
    from flashtrain.inference.evaluate_cli import main

    old = _copy("dcp", tmp_path)
    out = tmp_path / "eval"
    argv = [str(old), "--seq-len", "16", "32", "--batches", "1", "--batch-size", "2"]
    assert main([*argv, "--out", str(out), "--no-progress", "--device", "cpu"]) == 0, (
        capsys.readouterr().err
    )
    report = json.loads((out / "eval.json").read_text())
    assert (report["step"], report["run"], report["commit"]) == (2, RUN_NAME, COMMIT)
    assert [e["seq_len"] for e in report["lengths"]] == [16, 32]
    assert all(e["tokens"] > 0 and e["loss"] == e["loss"] for e in report["lengths"])
    assert not (old / "eval").exists()  # --out honoured


def test_export_of_the_old_dcp_checkpoint_maps_back_to_its_weights(tmp_path):
    pytest.importorskip("safetensors")
    pytest.importorskip("transformers")
    from flashtrain.checkpoint.export_cli import main
    from flashtrain.hf import from_hf

    old = _copy("dcp", tmp_path)
    out = tmp_path / "hf"
    assert main([str(old / "checkpoints"), str(out), "--no-tokenizer"]) == 0
    assert (out / "model.safetensors").is_file()
    assert COMMIT in (out / "README.md").read_text()
    back = from_hf(out, attention="reference")
    _assert_same_tensors(back.state_dict(), _saved_weights("dcp", tmp_path))
