"""A NaN or inf in a float config value is a user error: train.py reports the key in one line
and exits 2 at start-up, before any data is prepared (it used to train and stop with exit 3,
"non-finite loss", or crash at the first forward). The rule itself:
tests/test_typed_config_finite.py."""

from __future__ import annotations

import logging

import pytest
from config_testing import compose
from train_testing import TINY

from flashtrain.train import main
from flashtrain.train.entry import EXIT_USER_ERROR


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model=llama-tiny", "model.rope_theta=inf"], "model.rope_theta"),
        (["trainer.grad_clip=nan"], "trainer.grad_clip"),
    ],
    ids=["rope_theta", "grad_clip"],
)
def test_train_exits_2_before_preparing_any_data(overrides, key, tmp_path, caplog):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a tiny corpus.\n\n" for i in range(200)))
    cache = tmp_path / "cache"
    data = ["data=text_files", f"data.data_files={corpus}", "data.sample_by=paragraph",
            f"data.cache_dir={cache}"]  # fmt: skip
    cfg = compose([*TINY, "trainer.max_steps=1", *data, *overrides])
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_USER_ERROR
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "must be a finite number" in errors[0], caplog.text
    assert key in errors[0]
    assert not cache.exists()  # refused before the corpus was tokenized
