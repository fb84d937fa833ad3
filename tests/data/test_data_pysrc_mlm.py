"""data=pysrc_mlm: byte-level BERT batches from a small stand-in for the standard library, and a
few trainer steps on them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from config_testing import compose
from data_testing import write_python_sources

from flashtrain.data import build_data, pysrc
from flashtrain.data.registry import data_config
from flashtrain.train import run

PAD, CLS, SEP, MASK = 256, 257, 258, 259
BYTES = 256


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """{path: text} of .py files that pysrc reads as the standard library."""
    root = tmp_path / "stdlib"
    texts = write_python_sources(root)
    monkeypatch.setattr(pysrc, "stdlib_root", lambda: root)
    return texts


def pysrc_mlm(tmp_path, *overrides: str) -> list[str]:
    # pkg/mod07.py is the one validation file at these fractions (split by path hash).
    return [
        "data=pysrc_mlm",
        "data.val_fraction=0.25",
        "data.test_fraction=0.0",
        f"data.cache_dir={tmp_path / 'cache'}",
        *overrides,
    ]


def make(tmp_path, seed=0, *overrides: str):
    data = compose(pysrc_mlm(tmp_path, *overrides)).data
    return build_data(data, seq_len=64, micro_batch_size=8, seed=seed, eval_batches=2)


def test_batches_are_masked_byte_pairs_with_specials_where_they_belong(tmp_path, sources):
    module = make(tmp_path)
    assert (module.task, module.vocab_size, module.tokenizer.name) == ("mlm", 260, "byte-utf8-mlm")
    files = [text.encode() for text in sources.values()]
    for batch in itertools.islice(module.train_batches(), 6):
        for key in ("input_ids", "token_type_ids", "attention_mask", "labels"):
            assert batch[key].shape == (8, 64) and batch[key].dtype == torch.int64, key
        keys = ("input_ids", "token_type_ids", "attention_mask", "labels")
        for ids, types, attention, labels in zip(*(batch[k].numpy() for k in keys)):
            length = attention.sum()
            assert (attention[:length] == 1).all() and (attention[length:] == 0).all()
            assert (ids[length:] == PAD).all() and (types[length:] == 0).all()
            original = np.where(labels != -100, labels, ids)[:length]
            seps = np.flatnonzero(original == SEP)
            assert original[0] == CLS and len(seps) == 2 and seps[1] == length - 1
            assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1 : length] == 1).all()
            # Predictions only on real bytes: never [CLS], [SEP] or padding.
            chosen = labels != -100
            assert chosen.any() and (labels[chosen] < BYTES).all()
            assert not chosen[0] and not chosen[seps].any() and not chosen[length:].any()
            assert not (ids == MASK)[~chosen].any()  # [MASK] only where a byte is predicted
            # A then B is one stretch of one source file.
            text = np.concatenate([original[1 : seps[0]], original[seps[0] + 1 : -1]])
            text = text.astype(np.uint8).tobytes()
            assert any(text in f for f in files)


def test_random_replacements_draw_only_real_bytes(tmp_path, sources):
    module = make(tmp_path)
    assert np.array_equal(module.random_ids, np.arange(BYTES))
    replaced = []
    for batch in itertools.islice(module.train_batches(), 60):
        ids, labels = batch["input_ids"], batch["labels"]
        swapped = (labels != -100) & (ids != MASK) & (ids != labels)
        replaced.append(ids[swapped])
    replaced = torch.cat(replaced)
    assert len(replaced) > 100  # ~10% of ~9 predictions per row, 480 rows
    assert int(replaced.max()) < BYTES


def test_batches_are_deterministic_for_a_seed(tmp_path, sources):
    def first(module, n=3):
        return [b for b in itertools.islice(module.train_batches(), n)]

    a, b, other = make(tmp_path, 0), make(tmp_path, 0), make(tmp_path, 1)
    for x, y in zip(first(a), first(b)):
        assert all(torch.equal(x[k], y[k]) for k in x)
    # Another seed masks the same pieces differently (not only in another order).
    pieces, epochs = np.arange(8), np.zeros(8, dtype=np.int64)
    same = [m.batch("train", epochs, pieces, shorten=True, purpose=0) for m in (a, b, other)]
    assert torch.equal(same[0]["labels"], same[1]["labels"])
    assert not torch.equal(same[0]["labels"], same[2]["labels"])
    evals = [list(make(tmp_path, seed).val_batches()) for seed in (0, 0)]
    assert len(evals[0]) == 2
    for x, y in zip(*evals):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_unknown_keys_and_a_tokenizer_without_berts_specials_are_refused(tmp_path, sources):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose(pysrc_mlm(tmp_path, "data.mask_prb=0.2"))
    with pytest.raises(ValueError, match=r"unknown key 'data.mask_prb'.*mask_prob"):
        data_config(compose(pysrc_mlm(tmp_path, "+data.mask_prb=0.2")).data)
    with pytest.raises(ValueError, match=r"\[CLS\]/\[SEP\]/\[MASK\]/\[PAD\].*byte_mlm"):
        make(tmp_path, 0, "data.tokenizer=byte", "data.vocab_size=258")


def test_a_bert_trains_on_it_through_the_trainer(tmp_path, sources, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")  # the trainer, not the kernels
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    overrides = [
        "model=bert-base",
        "model.n_layer=1",
        "model.n_head=2",
        "model.d_model=32",
        "model.d_ff=64",
        "model.pad_vocab_multiple=64",  # 260 ids in 320 rows; the loss ignores the padding
        "seq_len=64",
        "micro_batch_size=4",
        "global_batch_size=8",
        "logger=none",
        "trainer.progress=lines",
        "trainer.log_interval=1",
        "trainer.max_steps=12",
        "trainer.eval_interval=12",
        "trainer.eval_batches=2",
        "optim.lr=1e-2",
        "optim.warmup_steps=2",
    ]
    summary = run(compose(pysrc_mlm(tmp_path, *overrides)), tmp_path / "run")
    losses = [loss for _, loss in summary["losses"]]
    assert len(losses) == 12 and all(np.isfinite(losses))
    assert abs(losses[0] - np.log(260)) < 0.5  # a new model: about uniform over the 260 ids
    assert np.mean(losses[-3:]) < losses[0] - 1.0, losses  # it learns the bytes
    ((step, metrics),) = summary["evals"]
    assert step == 12 and set(metrics) == {"eval/loss", "eval/ppl", "eval/accuracy"}
    assert 0.0 <= metrics["eval/accuracy"] <= 1.0
