"""A saved stream position is refused on other data (issue 32, item 4): the data state names what
defines its stream (the corpus, seq_len, document masking, the synthetic task, ...), and a
load onto data that differs raises OtherDataError naming each field, saved and current value.
States saved before the fields existed load as before."""

from __future__ import annotations

import itertools

import pytest
import torch
from data_testing import lm_config, write_python_sources

from flashtrain.data import build_data, pysrc
from flashtrain.data.registry import data_config
from flashtrain.data.stream_identity import IDENTITY_KEY, OtherDataError


def make(cfg, seq_len=24, **run):
    return build_data(cfg, seq_len=seq_len, micro_batch_size=2, seed=0, eval_batches=1, **run)


def advanced_state(module, batches=3) -> dict:
    list(itertools.islice(module.train_batches(), batches))
    return module.state_dict()


def refused(state, module) -> str:
    with pytest.raises(OtherDataError) as error:
        module.load_state_dict(state)
    return str(error.value)


SYNTHETIC = {"loader": "synthetic", "num_keys": 16, "num_values": 16, "vocab_size": 32}


def test_synthetic_num_keys_changed_is_refused():
    state = advanced_state(make(SYNTHETIC))
    message = refused(state, make({**SYNTHETIC, "num_keys": 8}))
    assert "data.num_keys: saved 16, now 8" in message, message


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return lm_config(tmp_path_factory.mktemp("corpus"))


def test_a_shorter_seq_len_is_refused(corpus):
    message = refused(advanced_state(make(corpus, seq_len=24)), make(corpus, seq_len=12))
    assert "seq_len: saved 24, now 12" in message, message


def test_document_masking_switched_off_is_refused(corpus):
    state = advanced_state(make(corpus))
    message = refused(state, make({**corpus, "document_masking": False}))
    assert "data.document_masking: saved True, now False" in message, message


def test_another_corpus_is_refused(corpus, tmp_path):
    other = lm_config(tmp_path)  # the same kind of files, other text
    (tmp_path / "corpus" / "doc00.txt").write_text("other words " * 300)
    message = refused(advanced_state(make(corpus)), make(other))
    assert "corpus: saved " in message and "data.seq_len" not in message, message


def test_another_pysrc_corpus_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "stdlib"
    write_python_sources(root)  # a tiny stand-in for the standard library
    monkeypatch.setattr(pysrc, "stdlib_root", lambda: root)
    cfg = data_config({"loader": "lm_corpus", "name": "pysrc", "source": "pysrc",
                       "val_fraction": 0.3, "cache_dir": str(tmp_path)})  # fmt: skip
    state = advanced_state(make(cfg))
    with (root / "mod00.py").open("a") as f:  # another interpreter's library: other files
        f.write("def added():\n    return None\n")
    message = refused(state, make(cfg))
    assert "corpus: saved " in message, message


def test_streaming_with_another_shuffle_buffer_is_refused(corpus):
    stream = {**corpus, "streaming": True, "shuffle_buffer": 4}
    state = advanced_state(make(stream))
    message = refused(state, make({**stream, "shuffle_buffer": 8}))
    assert "data.shuffle_buffer: saved 4, now 8" in message, message


def test_the_same_data_resumes_exactly_and_an_old_state_as_before(corpus):
    module = make(corpus)
    state = advanced_state(module)
    expected = next(module.train_batches())["input_ids"]
    for saved in (state, {k: v for k, v in state.items() if k != IDENTITY_KEY}):
        resumed = make(corpus)
        resumed.load_state_dict(saved)
        assert torch.equal(next(resumed.train_batches())["input_ids"], expected)
    # an old state on other data: nothing to compare, so it loads (as before the check)
    make(corpus, seq_len=12).load_state_dict({k: v for k, v in state.items() if k != IDENTITY_KEY})


def test_the_identity_is_small_and_cached(corpus):
    module = make(corpus)
    assert module.state_dict()[IDENTITY_KEY] is module.state_dict()[IDENTITY_KEY]
    assert set(module.state_dict()[IDENTITY_KEY]) >= {
        "data.loader",
        "seq_len",
        "corpus",
        "data.tokenizer",
        "data.document_masking",
    }
