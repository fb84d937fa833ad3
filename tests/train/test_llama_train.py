"""Llama in the trainer: two torchrun ranks splitting each sequence (trainer.context_parallel=2,
ring attention, rotary at each rank's global positions, dynamic RoPE over the whole sequence)
give one process's losses; the llama/* presets dry-run; bad Llama configs exit 2 naming what
is wrong."""

from __future__ import annotations

import json
import re

import pytest
import torch
from config_testing import compose, group_options
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from train_testing import read_metrics, run_train

from flashtrain.checkpoint import initial_weights
from flashtrain.models import build_model
from flashtrain.train import ConfigError, run, validate_config
from flashtrain.train.metric_names import TRAIN_GRAD_NORM, TRAIN_LOSS

# A Llama small enough for a CPU step in tens of milliseconds: GQA (4 query heads over 2 K/V
# heads), rotary with dynamic NTK scaling that is active at this length (64 > 16).
TINY_LLAMA = [
    "model=llama-tiny",
    "model.n_layer=2",
    "model.n_head=4",
    "model.n_kv_head=2",
    "model.d_model=64",
    "model.d_ff=96",
    "model.rope_scaling.type=dynamic",
    "model.rope_scaling.factor=2",
    "model.rope_scaling.original_max_seq_len=16",
    "seq_len=64",
    "micro_batch_size=4",
    "global_batch_size=8",
    "trainer.eval_batches=4",
    "logger=none",
    "trainer.progress=lines",
    "trainer.log_interval=1",
]
STEPS = ["trainer.max_steps=3", "trainer.eval_interval=0"]
PRESETS = [p for p in group_options("experiment") if p.startswith("llama/")]


def _rows(path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(path) if r.get(TRAIN_LOSS) is not None}


def _in_process(args: list[str], run_dir):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(compose(args), run_dir)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process's metrics rows for TINY_LLAMA + STEPS (micro-batch 4 x 2 accumulation)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
        out = _in_process(TINY_LLAMA + STEPS, tmp_path_factory.mktemp("single") / "run")
    return _rows(out["run_dir"] + "/metrics.jsonl")


def _matches(run_dir, want):
    got = _rows(run_dir / "metrics.jsonl")
    assert got.keys() == want.keys() == {1, 2, 3}
    for step in want:
        for key in (TRAIN_LOSS, TRAIN_GRAD_NORM):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-5), (step, key)


@pytest.mark.slow  # ~18 s; GPT-2's twin, tests/train/test_context_parallel.py, stays in the suite
def test_two_ranks_splitting_each_sequence_match_one_process(tmp_path, single):
    res = run_train(TINY_LLAMA + STEPS + ["trainer.context_parallel=2"], cwd=tmp_path, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "each sequence split over 2 ranks (ring attention, layout zigzag)" in res.stdout
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    _matches(run_dir, single)


@pytest.fixture(scope="module")
def initial(tmp_path_factory):
    """model.init_from=<a state-dict file of TINY_LLAMA's weights as one process draws them
    afresh from the run's seed (so `single` starts from them too)>: FSDP2 over several ranks
    draws each rank's shards from a stream of its own, so its fresh init is not one process's."""
    cfg = validate_config(compose(TINY_LLAMA + STEPS))
    torch.manual_seed(cfg.seed)
    path = tmp_path_factory.mktemp("initial") / "weights.pt"
    torch.save(build_model(cfg.model, cfg.attention).state_dict(), path)
    return [f"model.init_from={path}"]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, initial):
    """Two torchrun ranks training TINY_LLAMA + STEPS under FSDP2 from the weights `initial`
    names: (the process, its run folder)."""
    cwd = tmp_path_factory.mktemp("fsdp")
    res = run_train(TINY_LLAMA + STEPS + initial + ["trainer.strategy=fsdp"], cwd=cwd, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (cwd / "outputs").glob("*/*")
    return res, run_dir


def test_fsdp2_on_two_ranks_matches_one_process(fsdp_run, single):
    """Per-block FSDP2 sharding of the Llama blocks, the tied head in the root's shard: from the
    same initial weights (model.init_from), the losses and gradient norms of one process."""
    res, run_dir = fsdp_run
    assert "strategy: fsdp" in res.stdout
    _matches(run_dir, single)


def test_init_from_an_fsdp2_checkpoint_at_a_longer_context(fsdp_run, tmp_path, monkeypatch):
    """The documented context extension from an FSDP2 run (sharded DCP checkpoint, no
    model_optim.pt): model.init_from=<its checkpoints folder> at twice the context with a
    longer dynamic RoPE gives the weights the two ranks saved (read back by torch's own
    dcp_to_torch_save), and a run starts from them."""
    _, run_dir = fsdp_run
    (step_dir,) = (run_dir / "checkpoints").glob("step_*")
    assert json.loads((step_dir / "meta.json").read_text())["format"] == "dcp"
    assert not (step_dir / "model_optim.pt").exists()
    dcp_to_torch_save(step_dir, tmp_path / "saved.pt")
    saved = torch.load(tmp_path / "saved.pt", weights_only=True)["model"]
    longer = [
        *(a for a in TINY_LLAMA if not a.startswith(("seq_len", "model.rope_scaling.factor"))),
        "seq_len=128",
        "model.rope_scaling.factor=4",
        f"model.init_from={run_dir / 'checkpoints'}",
    ]
    cfg = validate_config(compose(longer))
    with torch.device("meta"):  # as the trainer builds it
        model = build_model(cfg.model, cfg.attention)
    initial_weights(
        model, cfg.model.init_from, device="cpu", position_mode=cfg.model.init_positions
    )
    got = model.state_dict()
    assert got.keys() == saved.keys()
    for name, value in saved.items():
        assert torch.equal(got[name], value), name
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    out = _in_process(longer + ["trainer.max_steps=1", "trainer.eval_interval=0"], tmp_path / "r")
    assert out["step"] == 1


def test_init_from_a_shorter_context_checkpoint(tmp_path, monkeypatch):
    """A run at seq_len 32 checkpoints; a run at 64 starts from it with linear RoPE scaling
    (model.init_from, the documented way to extend context) and starts lower than afresh."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    base = [a for a in TINY_LLAMA if "rope_scaling" not in a and not a.startswith("seq_len")]
    short = _in_process(
        base + ["seq_len=32", "trainer.max_steps=30", "trainer.eval_interval=0"],
        tmp_path / "short",
    )
    ckpt = tmp_path / "short" / "checkpoints"  # its newest checkpoint
    longer = base + ["seq_len=64", "trainer.max_steps=1", "trainer.eval_interval=0"]
    scaling = ["model.rope_scaling.type=linear", "model.rope_scaling.factor=2"]
    extended = _in_process(longer + scaling + [f"model.init_from={ckpt}"], tmp_path / "ext")
    fresh = _in_process(longer + scaling, tmp_path / "fresh")
    assert short["losses"][-1][1] < short["losses"][0][1] - 0.3  # the short run learned
    assert extended["losses"][0][1] < fresh["losses"][0][1] - 0.3


@pytest.mark.slow
def test_compiled_llama_blocks_train_like_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    eager = _in_process(TINY_LLAMA + STEPS, tmp_path / "eager")
    compiled = _in_process(TINY_LLAMA + STEPS + ["trainer.compile=true"], tmp_path / "c")
    for (_, a), (_, b) in zip(eager["losses"], compiled["losses"]):
        assert abs(a - b) < 1e-4 * abs(a), (eager["losses"], compiled["losses"])


@pytest.mark.slow  # ~8 s on 2 idle cores: left out of the normal suite (10 minutes)
def test_every_llama_preset_dry_runs(tmp_path, caplog):
    """Each preset, unmodified, composes, validates and prints its model, parameter count, FLOPs
    per token, batch plan and per-GPU memory without data. One process here: a preset whose
    context parallelism needs more is planned for the smallest world it runs on, saying so."""
    assert {"llama/125m-16k", "llama/1b-32k", "llama/1b-128k", "llama/8b-128k"} <= set(PRESETS)
    caplog.set_level("INFO", logger="flashtrain")
    for preset in PRESETS:
        cfg = compose([f"experiment={preset}", "trainer.max_steps=0", "logger=none"])
        assert cfg.seq_len >= 16384 and cfg.model.arch == "llama", preset
        cp = cfg.trainer.context_parallel
        assert cfg.seq_len % (2 * cp) == 0, preset  # zigzag splits
        caplog.clear()
        out = run(cfg, tmp_path / preset.replace("/", "-"))
        with torch.device("meta"):
            model = build_model(cfg.model, cfg.attention)
        assert out["step"] == 0 and out["params"] == model.num_parameters(), preset
        assert out["world_size"] == cp, preset  # 1 for the presets without context parallelism
        text = caplog.text
        assert f"\nparams: {out['params']}\n" in text, preset
        assert "flops/token: " in text and "(blocks): " in text, preset
        planned = f"dry run: planned for a world of {cp} processes, not this run's 1"
        assert (planned in text) == (cp > 1), preset
        if cp > 1:
            assert f"each sequence split over {cp} ranks" in text, preset
            assert f"micro 1 x 1 data-parallel groups of {cp} ranks" in text, preset
        memory = out["memory_per_gpu"]
        assert f"memory per GPU (estimate: {cp} GPUs, " in text, preset
        assert (
            f"time per step on the planned GPUs (prediction, not a measurement: 40% MFU of {cp} x H100"
            in text
        ), preset
        shards = cp if cfg.trainer.strategy == "fsdp" else 1
        assert memory["states"] == 16 * out["params"] / shards, preset
        assert 0 < memory["activations"] and memory["states"] + memory["activations"] < 80e9


def test_the_8b_128k_estimate_by_hand(tmp_path):
    """llama/8b-128k on its 8 GPUs: FSDP2 over 8, bf16 weights in the blocks (FSDP2's
    param_dtype), 16,384 tokens per GPU, ring attention, every block recomputed. Per token a
    block keeps 2 x 4096 B of input, 2 B x (3 x 4096 + 2 x 1024) in attention, and in its MLP
    half 2 x 4096 B of input and 2 B x (4096 + 4 x 14336) = 167,936 B; recomputed, each of the
    32 keeps its 2 x 4096 B input. The peak is the last block's MLP backward: its 167,936 B, the
    residual gradient in and out (2 x 2 x 4096 B) and two 14336-wide gradients (2 x 2 x 14336)."""
    cfg = compose(["experiment=llama/8b-128k", "trainer.max_steps=0", "logger=none"])
    memory = run(cfg, tmp_path / "run")["memory_per_gpu"]
    assert memory["states"] == 16 * 7_391_678_464 / 8
    mlp_backward = 167_936 + 2 * 2 * 4096 + 2 * 2 * 14336
    assert memory["activations"] == 16_384 * (32 * 2 * 4096 + mlp_backward)
    assert memory["terms"]["backward of a block's MLP"] == 16_384 * mlp_backward
    block = 218_112_000  # one block's weights: 4096 x (2 x 4096 + 2 x 1024 + 3 x 14336) + norms
    assert memory["gathered"] == 218_112_000 * (2 * 2 + 4) == block * 8
    assert memory["host_per_rank"] == 0


def test_the_4m_preset_plans_at_most_70_gib_per_gpu_and_states_its_host_memory(tmp_path, caplog):
    """llama/8b-4m: 4,194,304 tokens on 8 GPUs (Ulysses 8, offload, MLP tiles), planned within
    an H100's 80 GB with room to spare, and the host memory its offload needs, per node."""
    caplog.set_level("INFO", logger="flashtrain")
    cfg = compose(["experiment=llama/8b-4m", "trainer.max_steps=0", "logger=none"])
    assert cfg.seq_len == 4 * 2**20 and cfg.trainer.context_parallel == 8
    memory = run(cfg, tmp_path / "run")["memory_per_gpu"]
    total = memory["states"] + memory["activations"] + memory["gathered"]
    assert total <= 70 * 2**30, total / 2**30
    per_token = 31 * 2 * 4096  # 31 of the 32 blocks' bf16 inputs, in pinned host memory
    assert memory["host_per_rank"] == 524_288 * per_token
    assert "host memory for offloaded block inputs: 124.0 GiB per GPU, 992.0 GiB per node" in (
        caplog.text
    )
    assert "each sequence split over 8 ranks (Ulysses" in caplog.text


def test_a_real_run_still_needs_the_world(tmp_path):
    """Only a dry run plans for another world: a real run is refused (exit 2 in train.py)."""
    cfg = compose(["experiment=llama/8b-128k", "trainer.max_steps=1", "logger=none"])
    with pytest.raises(ConfigError, match="context_parallel=8 does not divide the world size 1"):
        run(cfg, tmp_path / "run")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.n_kv_head=3"], "model.n_kv_head=3 does not divide model.n_head=4"),
        (["model.d_model=36"], "head_dim = d_model / n_head must be even, got 9"),
        (["model.rope_scaling.type=ntk"], "model.rope_scaling.type='ntk'; allowed: none, linear"),
        (
            ["model.rope_scaling.type=yarn", "model.rope_scaling.factor=4"],
            "type=yarn needs model.rope_scaling.original_max_seq_len",
        ),
    ],
)
def test_bad_llama_configs_are_user_errors(overrides, message):
    """ConfigError: what train.py reports in one line with exit code 2 (errors.py)."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(compose(["model=llama-tiny", *overrides]))


@pytest.mark.slow  # ~8 s on 2 idle cores: left out of the normal suite (10 minutes)
def test_a_bad_llama_config_exits_2(tmp_path):
    res = run_train(["model=llama-tiny", "logger=none", "model.n_kv_head=3"], cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out[-2000:]
    assert "model.n_kv_head=3 does not divide model.n_head=4" in out, out[-2000:]


@pytest.mark.slow
def test_sliding_window_with_context_parallelism_exits_2(tmp_path):
    res = run_train(
        TINY_LLAMA + ["model.sliding_window=8", "trainer.context_parallel=2"],
        cwd=tmp_path,
        nproc=2,
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "context parallelism (ring attention) has no sliding window" in out, out[-2000:]
    assert "exitcode  : 2" in out or "exitcode: 2" in out, out[-2000:]
