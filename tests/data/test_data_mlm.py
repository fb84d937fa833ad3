"""BERT masking statistics and MLM batches built from a WordPiece token cache."""

import itertools

import numpy as np
import pytest
import torch
from data_testing import lm_config, write_wordpiece_vocab

from flashtrain.data import build_data
from flashtrain.data.mlm_corruption import mask_tokens

MASK_ID = 4


def test_masking_statistics_follow_bert():
    rng = np.random.default_rng(0)
    batch, length = 256, 128
    ids = rng.integers(10, 1000, size=(batch, length))
    real = rng.integers(20, length + 1, size=batch)  # rows padded after `real` tokens
    maskable = np.arange(length)[None, :] < real[:, None]
    maskable[:, 0] = False  # e.g. [CLS]
    random_ids = np.arange(10, 1000)
    corrupted, labels = mask_tokens(ids, maskable, rng, mask_id=MASK_ID, random_ids=random_ids)

    chosen = labels != -100
    n = maskable.sum(axis=1)
    assert (chosen.sum(axis=1) == np.maximum(1, np.rint(0.15 * n))).all()  # exactly as BERT
    assert not (chosen & ~maskable).any()  # padding and specials never chosen
    assert (labels[chosen] == ids[chosen]).all()
    assert (corrupted[~chosen] == ids[~chosen]).all()

    total = chosen.sum()
    masked = (corrupted[chosen] == MASK_ID).mean()
    kept = (corrupted[chosen] == ids[chosen]).mean()
    replaced = 1 - masked - kept
    tolerance = 4 * np.sqrt(0.25 / total)  # 4 standard deviations of a proportion
    # A random replacement can draw the original id (1 in 990), counted as kept.
    assert abs(masked - 0.8) < tolerance
    assert abs(kept - 0.1) < tolerance
    assert abs(replaced - 0.1) < tolerance


def test_max_predictions_caps_the_count():
    rng = np.random.default_rng(1)
    ids = rng.integers(10, 100, size=(8, 512))
    _, labels = mask_tokens(
        ids,
        np.ones_like(ids, dtype=bool),
        rng,
        mask_id=MASK_ID,
        random_ids=np.arange(10, 100),
        max_predictions=76,
    )
    assert ((labels != -100).sum(axis=1) == 76).all()  # round(0.15 * 512) = 77 capped at 76


@pytest.fixture(scope="module")
def mlm_cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm")
    vocab = write_wordpiece_vocab(root / "vocab.txt")
    return lm_config(
        root,
        loader="mlm",
        name="bert_mlm",
        tokenizer="wordpiece",
        tokenizer_path=str(root / "vocab.txt"),
        vocab_size=len(vocab),
    )


def make(cfg, **kw):
    return build_data(cfg, seq_len=kw.pop("seq_len", 48), micro_batch_size=4, seed=0, **kw)


def test_mlm_batches_are_masked_sentence_pairs(mlm_cfg):
    module = make(mlm_cfg)
    tokens = np.asarray(module.splits["train"].tokens, dtype=np.int64)
    tok = module.tokenizer
    assert (module.task, module.vocab_size) == ("mlm", 24)  # the vocab.txt lines
    for batch in itertools.islice(module.train_batches(), 5):
        for key in ("input_ids", "token_type_ids", "attention_mask", "labels"):
            assert batch[key].shape == (4, 48) and batch[key].dtype == torch.int64
        keys = ("input_ids", "token_type_ids", "attention_mask", "labels")
        for ids, types, attention, labels in zip(*(batch[k].numpy() for k in keys)):
            length = attention.sum()
            assert (attention[:length] == 1).all() and (attention[length:] == 0).all()
            assert (ids[length:] == tok.pad_id).all() and (labels[length:] == -100).all()
            original = np.where(labels != -100, labels, ids)[:length]
            seps = np.flatnonzero(original == tok.sep_id)
            assert original[0] == tok.cls_id and len(seps) == 2 and seps[1] == length - 1
            assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1 : length] == 1).all()
            assert labels[0] == labels[seps[0]] == labels[seps[1]] == -100  # specials never masked
            # A then B is one contiguous stretch of a document.
            text = np.concatenate([original[1 : seps[0]], original[seps[0] + 1 : seps[1]]])
            windows = np.lib.stride_tricks.sliding_window_view(tokens, len(text))
            assert (windows == text).all(axis=1).any()
            assert 1 <= (labels != -100).sum() <= max(1, round(0.15 * (length - 3)))


def test_dynamic_masking_changes_with_the_epoch_static_does_not(mlm_cfg):
    for dynamic in (True, False):
        module = make({**mlm_cfg, "dynamic_masking": dynamic})
        piece = np.array([0, 1, 2, 3])
        epoch0 = module.batch("train", np.zeros(4, dtype=np.int64), piece, shorten=True, purpose=0)
        epoch1 = module.batch("train", np.ones(4, dtype=np.int64), piece, shorten=True, purpose=0)
        same = torch.equal(epoch0["labels"], epoch1["labels"])
        assert same != dynamic


def test_mlm_resume_and_validation(mlm_cfg):
    module = make(mlm_cfg)
    stream = module.train_batches()
    next(stream)
    state = module.state_dict()
    expected = next(stream)
    resumed = make(mlm_cfg)
    resumed.load_state_dict(state)
    assert torch.equal(next(resumed.train_batches())["input_ids"], expected["input_ids"])
    first = [b["labels"] for b in module.val_batches()]
    assert first and all(torch.equal(a, b["labels"]) for a, b in zip(first, module.val_batches()))


def test_mlperf_preset_requires_seq_len_512(mlm_cfg):
    with pytest.raises(ValueError, match="seq_len=512"):
        make({**mlm_cfg, "preset": "mlperf"}, seq_len=128)
    module = make({**mlm_cfg, "preset": "mlperf"}, seq_len=512)
    assert module.max_predictions == 76 and module.dynamic is False
