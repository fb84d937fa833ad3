"""data.tokenizer=hf:<folder>: the vocabulary follows the tokenizer (data.vocab_size, and the
model's through ${data.vocab_size}) unless the config sets another, which is refused before the
model is built."""

from __future__ import annotations

import logging

import pytest
from config_testing import compose
from train_testing import TINY

import flashtrain.train.trainer as trainer_module
from flashtrain.train import main, run
from flashtrain.train.config import validate_config
from flashtrain.train.entry import EXIT_USER_ERROR
from flashtrain.typed_config import ConfigError

WORDS = ["alpha", "beta", "gamma", "delta", "line", "of", "the", "text", "."]


@pytest.fixture
def folder(tmp_path):
    """A word-level tokenizer.json of 2 specials + len(WORDS) words + [UNK]: 12 ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<s>", "</s>", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out = tmp_path / "word-tok"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return out


def _text_data(tmp_path, folder, *extra):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"alpha beta line {i % 7} of the text .\n" for i in range(400)))
    return [
        "data=text_files",
        f"data.data_files={corpus}",
        "data.sample_by=line",
        "data.val_fraction=0.05",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"data.tokenizer=hf:{folder}",
        *extra,
    ]


def test_the_vocabulary_follows_an_hf_tokenizer(tmp_path, folder, caplog):
    caplog.set_level(logging.INFO, logger="flashtrain")
    cfg = validate_config(compose(TINY + _text_data(tmp_path, folder)))
    assert (cfg.data.vocab_size, cfg.model.vocab_size) == (12, 12)
    summary = run(compose(TINY + _text_data(tmp_path, folder, "trainer.max_steps=1")), tmp_path)
    assert summary["step"] == 1 and summary["params"] > 0


def test_a_vocabulary_set_to_another_count_is_refused_before_the_model_is_built(
    tmp_path, folder, monkeypatch, caplog
):
    with pytest.raises(ConfigError) as error:
        validate_config(compose(TINY + _text_data(tmp_path, folder, "data.vocab_size=100")))
    assert f"data.vocab_size=100 but tokenizer hf:{folder} has 12 ids" in str(error.value)
    assert "set data.vocab_size=12, or leave it unset" in str(error.value)
    built = []
    monkeypatch.setattr(trainer_module.Trainer, "_build", lambda *a: built.append(1))
    with pytest.raises(SystemExit) as exit_info:
        main(compose(TINY + _text_data(tmp_path, folder, "data.vocab_size=100")))
    assert exit_info.value.code == EXIT_USER_ERROR and not built
    # The same count set by hand is no mismatch.
    same = validate_config(compose(TINY + _text_data(tmp_path, folder, "data.vocab_size=12")))
    assert same.model.vocab_size == 12
