"""scripts/evaluate.py's logic end to end on CPU, from checkpoints of short `python train.py`
runs: the loss equals the model's own loss on the same windows, sliding windows score every
token once, positions beyond the trained length are interpolated, the files name the run."""

import json
import math

import pytest
import torch
from inference_testing import tiny_llama

from flashtrain.data.registry import build_data
from flashtrain.inference.checkpoint import load_for_inference
from flashtrain.inference.evaluate import bucket_edges, evaluate_length
from flashtrain.inference.evaluate_cli import main


def _data(run):
    return load_for_inference(run).config.data


def test_loss_equals_the_models_own_loss_on_the_same_windows(text_run):
    loaded = load_for_inference(text_run)
    data = loaded.config.data
    result = evaluate_length(loaded.model, data, 32, batch_size=4, max_batches=3)
    module = build_data(data, seq_len=32, micro_batch_size=4, seed=1234, eval_batches=3)
    total = count = 0.0
    with torch.no_grad():
        for batch in module.val_batches():
            out = loaded.model(**batch)  # with the documents' fields where present
            total += float(out.loss) * int(out.num_targets)
            count += int(out.num_targets)
    assert result.tokens == count
    assert result.loss == pytest.approx(total / count, rel=1e-5)
    weighted = sum(l * n for l, n in zip(result.position_loss, result.position_tokens) if n)
    assert weighted / result.tokens == pytest.approx(result.loss, rel=1e-9)


def test_loss_is_the_models_own_with_a_final_logit_softcap():
    """A Llama whose head is soft-capped (Gemma 2's final_logit_softcap): the evaluation scores
    the capped logits, as the model's loss does (the raw head product gives another number)."""
    model = tiny_llama(vocab_size=16)  # final_logit_softcap 1.0
    data = dict(loader="synthetic", num_keys=8, num_values=8, vocab_size=16)
    result = evaluate_length(model, data, 32, batch_size=4, max_batches=2)
    module = build_data(data, seq_len=32, micro_batch_size=4, seed=1234, eval_batches=2)
    total = count = 0.0
    with torch.no_grad():
        for batch in module.val_batches():
            out = model(**batch)
            total += float(out.loss) * int(out.num_targets)
            count += int(out.num_targets)
    assert result.tokens == count
    assert result.loss == pytest.approx(total / count, rel=1e-5)


def test_sliding_windows_score_every_token_once(text_run):
    loaded = load_for_inference(text_run)
    seq_len, stride, batches = 32, 8, 10  # 40 windows starting 0, 8, ..., 312
    result = evaluate_length(loaded.model, loaded.config.data, seq_len, stride=stride,
                             batch_size=4, max_batches=batches)  # fmt: skip
    assert result.tokens == 39 * stride + seq_len  # labels 1 .. 312 + 32, each once
    # positions before seq_len - stride are scored only in the first window: once each
    for start, end, n in zip(result.bucket_edges, result.bucket_edges[1:], result.position_tokens):
        if end <= seq_len - stride:
            assert n == end - start
        elif start >= seq_len - stride:
            assert n == 40 * (end - start)


def test_synthetic_reports_the_known_optimum(recall_run):
    loaded = load_for_inference(recall_run)
    result = evaluate_length(loaded.model, loaded.config.data, 64, max_batches=2)
    assert result.position_optimal[0] == pytest.approx(math.log(8))  # position 0: key never seen
    assert result.optimal_loss < result.loss < math.log(16)  # 6 steps: better than uniform


def test_bucket_edges_cover_every_position_once():
    for seq_len in (2, 17, 128, 5000):
        edges = bucket_edges(seq_len, 16)
        assert edges[0] == 0 and edges[-1] == seq_len and edges == sorted(set(edges))


def test_command_writes_json_markdown_and_plot_beyond_the_trained_length(text_run, tmp_path):
    out = tmp_path / "eval"
    assert main([str(text_run), "--seq-len", "16", "128", "--tokens", "2048", "--out", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    report = json.loads((out / "eval.json").read_text())
    assert report["step"] == 6 and report["run"] and report["commit"]
    assert [e["seq_len"] for e in report["lengths"]] == [16, 128]
    assert report["lengths"][0]["tokens"] == report["lengths"][1]["tokens"]  # the same span
    beyond = report["lengths"][1]
    assert beyond["notes"] == ["learned positions interpolated from 64"]
    assert beyond["bits_per_byte"] == pytest.approx(beyond["loss"] / math.log(2))
    assert "| 128 |" in (out / "eval.md").read_text()
    assert (out / "loss_by_position.png").read_bytes()[:4] == b"\x89PNG"


def test_command_on_another_data_config_and_bad_requests(recall_run, capsys):
    assert main([str(recall_run), "--seq-len", "8", "--data", "synthetic", "num_keys=4",
                 "num_values=4", "vocab_size=16", "--batches", "1", "--no-progress"]) == 0  # fmt: skip
    report = json.loads((recall_run / "eval" / "step_000006" / "eval.json").read_text())
    assert report["lengths"][0]["positions"][0]["optimal"] == pytest.approx(math.log(4))
    assert main([str(recall_run), "--seq-len", "32", "--stride", "8", "--no-progress"]) == 2
    assert "--stride needs a token corpus" in capsys.readouterr().err
