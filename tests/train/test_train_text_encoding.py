"""train.py on a text corpus with a file that is not UTF-8: one line naming it, exit code 2
(tests/data/test_data_text_encoding.py checks the message itself)."""

from __future__ import annotations

import logging

import pytest
from config_testing import compose
from train_testing import TINY

from flashtrain.train import main
from flashtrain.train.entry import EXIT_USER_ERROR


def test_the_trainer_exits_2_with_one_line(tmp_path, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "good.txt").write_text("".join(f"line {i} of a tiny corpus.\n\n" for i in range(200)))
    bad = corpus / "zz_bad.txt"
    bad.write_bytes("a caf\u00e9 in Latin-1".encode("latin-1"))
    over = [f"data.data_files={corpus}/*.txt", f"data.cache_dir={tmp_path / 'cache'}"]
    cfg = compose(TINY + ["data=text_files", "trainer.max_steps=1", *over])
    with pytest.raises(SystemExit) as exit_info:
        main(cfg)
    assert exit_info.value.code == EXIT_USER_ERROR
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"{bad} is not UTF-8" in errors[0].getMessage(), caplog.text
