"""Context parallelism in the trainer: torchrun with 2 gloo processes and
trainer.context_parallel=2 (each sequence split over both ranks, ring attention) gives the losses,
gradient norms and evaluation of one process at the same global batch; the batch plan, the
per-rank shards and what cannot be split, checked without processes."""

from __future__ import annotations

import json

import pytest
import torch
from config_testing import compose
from train_testing import TINY, read_metrics, run_train, step_losses

from flashtrain.attention.ring_sharding import rank_chunks, take_cp_shard
from flashtrain.data.packing import document_fields
from flashtrain.train import run
from flashtrain.train.config import ConfigError, batch_plan, validate_config
from flashtrain.train.context_parallel import ContextParallel, check_supported
from flashtrain.train.metric_names import TRAIN_GRAD_NORM, TRAIN_LOSS

STEPS = ["trainer.max_steps=3", "trainer.eval_interval=0"]
TINY_LLAMA_CP = [
    "model=llama-tiny", "model.n_layer=2", "model.n_head=4", "model.n_kv_head=2",
    "model.d_model=64", "model.d_ff=96", "seq_len=64", "micro_batch_size=4",
    "global_batch_size=8", "trainer.eval_batches=4", "logger=none", "trainer.progress=lines",
    "trainer.log_interval=1",
]  # fmt: skip


def _rows(path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(path) if r.get(TRAIN_LOSS) is not None}


@pytest.mark.slow  # ~16 s on 2 idle cores: left out of the normal suite (10 minutes)
def test_two_ranks_splitting_each_sequence_match_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = run(compose(TINY + STEPS), tmp_path / "single")
    finally:
        torch.set_num_threads(threads)

    res = run_train(TINY + STEPS + ["trainer.context_parallel=2"], cwd=tmp_path, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 data-parallel groups of 2 ranks x 2 accumulation" in res.stdout
    assert "each sequence split over 2 ranks (ring attention, layout zigzag)" in res.stdout
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    got = _rows(run_dir / "metrics.jsonl")
    want = _rows(single["run_dir"] + "/metrics.jsonl")
    assert got.keys() == want.keys() == {1, 2, 3}
    for step in want:
        for key in (TRAIN_LOSS, TRAIN_GRAD_NORM):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-5), (step, key)
    assert step_losses(run_dir / "metrics.jsonl") != {}  # and the ranks logged the same steps
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/loss" in r][-1]
    assert evals["eval/loss"] == pytest.approx(single["evals"][-1][1]["eval/loss"], rel=1e-5)
    meta = json.loads((run_dir / "checkpoints" / "step_000003" / "meta.json").read_text())
    assert meta["context_parallel"] == 2 and meta["world_size"] == 2


def test_the_batch_is_split_over_data_parallel_groups_only():
    cfg = compose(TINY)  # micro-batch 4, global batch 8
    plan = batch_plan(cfg, world_size=4, context_parallel=2)
    assert (plan.data_parallel, plan.grad_accum, plan.tokens_per_step) == (2, 1, 8 * 64)
    assert plan.split() == "micro 4 x 2 data-parallel groups of 2 ranks x 1 accumulation"
    with pytest.raises(ConfigError, match=r"context_parallel=3 does not divide .* 1, 2, 4"):
        batch_plan(cfg, world_size=4, context_parallel=3)


def test_each_rank_keeps_its_chunks_and_their_global_positions():
    ids = torch.arange(2 * 16).view(2, 16)
    batch = {"input_ids": ids, "labels": ids + 100, "attention_mask": torch.ones(2, 16)}
    for rank in range(2):
        cp = ContextParallel(size=2, layout="zigzag", rank=rank)
        shard = cp.shard_batch(batch)
        assert set(shard) == {"input_ids", "labels", "position_ids"}
        positions = torch.cat(
            [torch.arange(c * 4, c * 4 + 4) for c in rank_chunks("zigzag", rank, 2)]
        )
        assert torch.equal(shard["position_ids"], positions.expand(2, -1))
        assert torch.equal(shard["input_ids"], ids[:, positions])
        assert torch.equal(shard["labels"], ids[:, positions] + 100)
    padded = dict(batch, attention_mask=torch.tensor([[1] * 16, [1] * 15 + [0]]))
    with pytest.raises(ValueError, match="no key-padding mask"):
        ContextParallel(size=2, rank=0).shard_batch(padded)
    with pytest.raises(ValueError, match="cannot split the batch key 'segments'"):
        ContextParallel(size=2, rank=0).shard_batch(dict(batch, segments=torch.zeros(3)))


def test_documents_keep_their_whole_table_on_the_host_and_each_rank_its_positions():
    """Document masking under context parallelism: the table (cu_seqlens) stays whole, as host
    ints (no device sync to plan attention), max_seqlen too; position_ids (restarting in every
    document) are split like the tokens, here over a hybrid 2 x 2 split."""
    ids = torch.tensor([[5, 6, 0, 7, 8, 9, 0, 4]])
    batch = {"input_ids": ids, "labels": ids + 1, **document_fields(ids, eos_id=0)}
    held = []
    for rank in range(4):
        cp = ContextParallel(size=4, mode="hybrid", ring_size=2, ulysses_size=2, rank=rank)
        shard = cp.shard_batch(batch)
        assert shard["cu_seqlens"] == (0, 3, 7, 8) and shard["max_seqlen"] == 4
        assert torch.equal(shard["input_ids"], take_cp_shard(ids, 1, rank, 2, 2, "zigzag"))
        held.append(shard["position_ids"])
    # ring shard 0 holds chunks 0 and 3 (tokens 0, 1 and 6, 7), split in two pieces of 2
    assert [p.tolist() for p in held] == [[[0, 1]], [[3, 0]], [[2, 0]], [[1, 2]]]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.context_parallel_mode=hybrid"], "needs trainer.ulysses_size, .* allowed: none"),
        (["trainer.context_parallel=4", "trainer.context_parallel_mode=hybrid"],
         r"allowed: one of \[2\]"),
        (["trainer.ulysses_size=2"], "applies to trainer.context_parallel_mode=hybrid only"),
        (["trainer.context_parallel_mode=sideways"], "context_parallel_mode"),
    ],
)  # fmt: skip
def test_context_parallel_modes_are_checked_with_the_config(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(compose(TINY + ["trainer.context_parallel=2", *overrides]))


def test_ulysses_refuses_heads_it_cannot_share_out():
    cfg = compose(TINY_LLAMA_CP)  # 4 query heads, 2 K/V heads
    cp = ContextParallel(size=8, mode="ulysses", ulysses_size=8, rank=0)
    with pytest.raises(ConfigError, match="model.n_head=4 must be a multiple of 8"):
        cp.build_model(cfg.model, cfg.attention)
    cp = ContextParallel(size=4, mode="ulysses", ulysses_size=4, rank=0)
    assert cp.build_model(cfg.model, cfg.attention).attn_op.size == 4  # K/V heads repeated


@pytest.mark.slow  # ~25 s on 2 idle cores: left out of the normal suite (10 minutes)
@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_two_ranks_with_document_masking_match_one_process(tmp_path, mode):
    """Llama on packed documents (pysrc files, <eos> after each; the varlen tables kept whole,
    positions restarting per document split with the tokens; dynamic RoPE reading the longest
    document), split over 2 ranks by each mode, with offload and MLP tiles: the losses and
    gradient norms of one process."""
    documents = ["data=pysrc", "data.pysrc_under=json", "data.val_fraction=0.3",
                 "data.document_masking=true", f"data.cache_dir={tmp_path / 'cache'}",
                 "model.rope_scaling.type=dynamic", "model.rope_scaling.factor=2",
                 "model.rope_scaling.original_max_seq_len=16"]  # fmt: skip
    args = TINY_LLAMA_CP + STEPS + documents
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = run(compose(args), tmp_path / "single")
    finally:
        torch.set_num_threads(threads)
    split = ["trainer.context_parallel=2", f"trainer.context_parallel_mode={mode}",
             "model.recompute=offload", "model.tile_tokens=24"]  # fmt: skip
    res = run_train(args + split, cwd=tmp_path, nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    got, want = _rows(run_dir / "metrics.jsonl"), _rows(single["run_dir"] + "/metrics.jsonl")
    assert got.keys() == want.keys() == {1, 2, 3}
    for step in want:
        for key in (TRAIN_LOSS, TRAIN_GRAD_NORM):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-5), (step, key)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["seq_len=62"], "seq_len"),  # zigzag: 2 x 2 chunks of equal length
        (["data=bert_mlm"], "pads short sequences"),
    ],
)
def test_what_cannot_be_split_is_refused_naming_it(overrides, message):
    cfg = compose(TINY + ["trainer.context_parallel=2", *overrides])
    with pytest.raises(ConfigError, match=message):
        check_supported(cfg)


def test_ring_attention_refuses_other_backends_by_name():
    from flashtrain.models import RingAttention

    for impl in ("sdpa", "reference", "blocksparse"):
        cfg = {"impl": impl, "pattern": "local"} if impl == "blocksparse" else impl
        with pytest.raises(ValueError, match=f"attention impl '{impl}' cannot be split over ranks"):
            RingAttention(cfg, group=None)
