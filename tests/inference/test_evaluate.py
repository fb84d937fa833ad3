"""scripts/evaluate.py's logic end to end on CPU, from checkpoints of short `python train.py`
runs: the loss equals the model's own loss on the same windows, sliding windows score every
token once, positions beyond the trained length are interpolated, the files name the run."""

import json
import math
import random

import pytest
import torch
import torch.nn.functional as F
from inference_testing import tiny_llama

from flashtrain.checkpoint import load_model
from flashtrain.data.registry import build_data
from flashtrain.inference.evaluate import (
    bucket_edges,
    evaluate_length,
    token_losses,
    window_starts,
    windows,
)
from flashtrain.inference.evaluate_cli import main, with_trained_masking
from flashtrain.inference.run_tokenizer import run_config, run_tokenizer
from flashtrain.lab.checkout import CONFIGS
from flashtrain.models import build_model


def _data(run):
    return run_config(load_model(run)[1]).data


def test_loss_equals_the_models_own_loss_on_the_same_windows(text_run):
    model, info = load_model(text_run)
    data = run_config(info).data
    result = evaluate_length(model, data, 32, batch_size=4, max_batches=3)
    module = build_data(data, seq_len=32, micro_batch_size=4, seed=1234, eval_batches=3)
    total = count = 0.0
    with torch.no_grad():
        for batch in module.val_batches():
            out = model(**batch)  # with the documents' fields where present
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
    model, info = load_model(text_run)
    seq_len, stride, batches = 32, 8, 10  # 40 windows starting 0, 8, ..., 312
    result = evaluate_length(model, run_config(info).data, seq_len, stride=stride,
                             batch_size=4, max_batches=batches)  # fmt: skip
    assert result.tokens == 39 * stride + seq_len  # labels 1 .. 312 + 32, each once
    # positions before seq_len - stride are scored only in the first window: once each
    for start, end, n in zip(result.bucket_edges, result.bucket_edges[1:], result.position_tokens):
        if end <= seq_len - stride:
            assert n == end - start
        elif start >= seq_len - stride:
            assert n == 40 * (end - start)


@pytest.mark.parametrize("seq_len, stride", [(32, 8), (24, 7)])
def test_sliding_windows_over_the_whole_split_score_all_but_the_first_token(
    text_run, seq_len, stride
):
    """Without a cap the windows reach the split's end: the last one scores the tail the
    strided ones leave, so the scored tokens are the split's tokens minus the first."""
    model, info = load_model(text_run)
    data = run_config(info).data
    split = build_data(data, seq_len=seq_len, micro_batch_size=4, seed=1234, eval_batches=None)
    length = len(split.splits["validation"].tokens)
    assert (length - 1 - seq_len) % stride, "a tail the strides leave"
    result = evaluate_length(model, data, seq_len, stride=stride, batch_size=16)
    assert result.tokens == length - 1
    assert result.windows == f"sliding, stride {stride}"


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory) -> dict:
    """A byte-level corpus of one-line documents of 1 to 3 short words: at most 18 tokens each
    with its <eos>, its own validation file (document masking: the config's default)."""
    root = tmp_path_factory.mktemp("documents")
    rng = random.Random(0)
    words = "alpha beta gamma delta eps zeta eta theta".split()
    for name, count in (("train", 100), ("val", 40)):
        lines = [" ".join(rng.choices(words, k=rng.randint(1, 3))) for _ in range(count)]
        (root / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return dict(loader="lm_corpus", name="documents", data_files=str(root / "train.txt"),
                val_files=str(root / "val.txt"), sample_by="line",
                cache_dir=str(root / "cache"))  # fmt: skip


def _random_decoder(arch: str):
    """A random decoder of 32 positions over the byte tokenizer's 258 ids: GPT-2 (learned
    positions) or a Llama (rotary, GQA, a sliding window and softcaps)."""
    if arch == "llama":
        return tiny_llama(vocab_size=258)
    torch.manual_seed(0)
    model = build_model(dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, max_seq_len=32,
                             vocab_size=258), "flash").eval()  # fmt: skip
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.3)  # large enough that the context moves every logit
    return model


def _loss_of_each_document_alone(model, data: dict) -> float:
    """The reference: the model run on each validation document by itself (no document tables,
    positions from 0), scoring every label of the split but the first token, as the sliding
    windows do; a document's <eos> predicts the next one's first token, as in training."""
    split = build_data(data, seq_len=32, micro_batch_size=1, seed=0, eval_batches=None)
    tokens = torch.from_numpy(split.splits["validation"].tokens.astype("int64"))
    ends = [i + 1 for i, t in enumerate(tokens[:-1].tolist()) if t == split.eos_id]
    total = 0.0
    with torch.no_grad():
        for start, end in zip([0, *ends], [*ends, len(tokens) - 1]):
            logits = model.head_logits(model.hidden_states(tokens[start:end][None]))[0]
            total += float(F.cross_entropy(logits.double(), tokens[start + 1 : end + 1],
                                           reduction="sum"))  # fmt: skip
    return total / (len(tokens) - 1)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sliding_windows_score_each_document_as_if_alone(short_documents, arch):
    """Under document masking a sliding window carries the trainer's document tables: a token
    attends only inside its document and positions restart at its start. With every document
    within seq_len - stride + 1 tokens each is then scored as if alone, at any stride; without
    the tables (document_masking=false, or before the windows had them) the loss depends on
    the stride and on the documents before."""
    model = _random_decoder(arch)
    reference = _loss_of_each_document_alone(model, short_documents)
    for stride in (5, 13):
        result = evaluate_length(model, short_documents, 32, stride=stride, batch_size=16)
        assert result.loss == pytest.approx(reference, rel=1e-6), stride
    across = dict(short_documents, document_masking=False)
    batches, _, _ = windows(across, 32, stride=13, batch_size=16, max_batches=1, seed=0)
    assert "cu_seqlens" not in next(iter(batches))  # unmasked windows as before
    attending_across = evaluate_length(model, across, 32, stride=13, batch_size=16).loss
    assert abs(attending_across - reference) > 1e-3 * reference  # the corpus shows the tables


def test_other_data_is_masked_as_the_run_was_trained():
    """--data's config has its own data.document_masking default (true): the windows follow the
    run's setting as in effect (eos_policy=none masks nothing) unless an override names it."""
    other = dict(loader="lm_corpus", document_masking=True, eos_policy="append")
    across = dict(loader="lm_corpus", document_masking=False)
    no_eos = dict(loader="lm_corpus", document_masking=True, eos_policy="none")
    recall = dict(loader="synthetic")
    for run, masks in ((across, False), (no_eos, False), (recall, False), (other, True)):
        assert with_trained_masking(other, [], run)["document_masking"] is masks
    assert with_trained_masking(other, ["document_masking=true"], across) == other
    assert with_trained_masking(recall, [], other) == recall  # a loader without the key


def test_windows_cover_each_label_once():
    for length, seq_len, stride in [(33, 32, 8), (100, 32, 8), (101, 32, 7), (64, 10, 10)]:
        scored = []
        for start, first in window_starts(length, seq_len, stride):
            assert 0 <= first < seq_len and start + seq_len < length
            scored += range(start + 1 + first, start + 1 + seq_len)  # token indices
        assert scored == list(range(1, length))
    with pytest.raises(ValueError, match="fewer than one window"):
        window_starts(32, 32, 8)


def test_bits_per_byte_leave_out_the_end_of_document_token(text_run):
    """Every line of the text run is a document ending in <eos> (id 256): bits per byte are the
    loss on byte targets alone."""
    model, info = load_model(text_run)
    data = run_config(info).data
    tokenizer = run_tokenizer(data)
    eos = tokenizer.eos_id
    result = evaluate_length(model, data, 32, batch_size=4, max_batches=3,
                             special_ids=tokenizer.special_ids)  # fmt: skip
    module = build_data(data, seq_len=32, micro_batch_size=4, seed=1234, eval_batches=3)
    text_sum = text_count = eos_count = 0
    for batch in module.val_batches():
        losses = token_losses(model, batch)
        labels = batch["labels"]
        text = (labels != -100) & (labels < 256)
        text_sum += float(losses[text].double().sum())
        text_count += int(text.sum())
        eos_count += int((labels == eos).sum())
    assert eos_count > 0 and result.text_tokens == text_count == result.tokens - eos_count
    assert result.bits_per_byte() == pytest.approx(text_sum / text_count / math.log(2), rel=1e-6)


def test_synthetic_reports_the_known_optimum(recall_run):
    model, info = load_model(recall_run)
    result = evaluate_length(model, run_config(info).data, 64, max_batches=2)
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
    assert 0 < beyond["bytes"] < beyond["tokens"]  # the lines' <eos> are no bytes
    assert [e["windows"] for e in report["lengths"]] == ["non-overlapping"] * 2
    assert "| 128 | non-overlapping |" in (out / "eval.md").read_text()
    assert (out / "loss_by_position.png").read_bytes()[:4] == b"\x89PNG"


def test_command_on_another_data_config_and_bad_requests(recall_run, capsys):
    other = ["--data", "synthetic", "num_keys=4", "num_values=4", "vocab_size=16"]
    assert main([str(recall_run), "--seq-len", "8", *other, "--batches", "1", "--no-progress"],
                configs=CONFIGS) == 0  # fmt: skip
    report = json.loads((recall_run / "eval" / "step_000006" / "eval.json").read_text())
    assert report["lengths"][0]["positions"][0]["optimal"] == pytest.approx(math.log(4))
    assert main([str(recall_run), "--seq-len", "32", "--stride", "8", "--no-progress"]) == 2
    assert "--stride needs a token corpus" in capsys.readouterr().err
    # --data needs a configs folder: the caller's (scripts/evaluate.py passes the checkout's)
    assert main([str(recall_run), "--seq-len", "8", *other, "--no-progress"]) == 2
    assert "give --configs DIR" in capsys.readouterr().err
    assert main([str(recall_run), "--seq-len", "8", *other, "--configs", str(CONFIGS),
                 "--batches", "1", "--no-progress"]) == 0  # fmt: skip


def test_command_refuses_data_of_another_tokenizer(recall_run, text_run, capsys):
    """Other ids than the run's mean other text, or index past the model's vocabulary: exit 2
    naming both tokenizers, no traceback."""
    wider = ["--data", "synthetic", "num_keys=16", "num_values=16", "vocab_size=32"]
    assert main([str(recall_run), "--seq-len", "8", *wider, "--no-progress"], configs=CONFIGS) == 2
    err = capsys.readouterr().err
    assert "'integers' (32 ids)" in err and "'integers' (16 ids)" in err
    assert main([str(text_run), "--seq-len", "8", "--data", "synthetic", "--no-progress"],
                configs=CONFIGS) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "'integers' (16 ids)" in err and "'byte-utf8' (258 ids)" in err
