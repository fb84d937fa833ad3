"""Tokenizer files a user hands in that cannot be read (truncated, empty, not JSON, a folder in
the file's place, unreadable): a one-line ConfigError naming the file and what to do, exit 2 in
train.py, never the parser's bare message or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from config_testing import REPO, train_testing
from data_testing import write_text_corpus
from test_data_hf_tokenizer import SENTENCES, write_llama_like_tokenizer

from flashtrain.data.config import LMCorpusConfig
from flashtrain.data.tokenization import build_tokenizer, load_gpt2, load_wordpiece
from flashtrain.typed_config import ConfigError

DAMAGED = "it is truncated or damaged; fix it, or copy or download the tokenizer's files again"


def _truncate(path: Path) -> None:
    text = path.read_bytes()
    path.write_bytes(text[: len(text) // 2])


def _folder_in_place(path: Path) -> None:
    path.unlink()
    path.mkdir()


BREAKAGES = {  # id: (file, how it is broken, what the message says)
    "truncated tokenizer.json": ("tokenizer.json", _truncate, "cannot be read (EOF while parsing"),
    "empty tokenizer.json": ("tokenizer.json", lambda p: p.write_text(""), "(it is empty)"),
    "folder tokenizer.json": ("tokenizer.json", _folder_in_place, "is a folder: put the file"),
    "invalid tokenizer_config.json": (
        "tokenizer_config.json", lambda p: p.write_text('{"bos_token": '), "(not JSON: Expecting"
    ),
    "latin-1 tokenizer_config.json": (
        "tokenizer_config.json", lambda p: p.write_bytes(b'{"bos_token": "\xe9"}'), "not UTF-8"
    ),
    "folder tokenizer_config.json": (
        "tokenizer_config.json", _folder_in_place, "is a folder: put the file"
    ),
    "list special_tokens_map.json": (
        "special_tokens_map.json", lambda p: p.write_text('["<s>"]'), "(a JSON list, not an"
    ),
    "empty special_tokens_map.json": (
        "special_tokens_map.json", lambda p: p.write_text(" \n"), "(it is empty)"
    ),
}  # fmt: skip


def _one_line_naming(error: BaseException, path: Path, says: str) -> None:
    message = str(error)
    assert "\n" not in message and f"tokenizer file {path} " in message, message
    assert says in message, message
    assert "put the file itself there" in message or DAMAGED in message, message


def _broken_folder(tmp_path: Path, breakage: str) -> tuple[Path, Path, str]:
    """A Llama-like tokenizer folder (with a special_tokens_map.json) with one file broken:
    (folder, the broken file, what the message says of it)."""
    folder = write_llama_like_tokenizer(tmp_path / "tok")
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    name, breaks, says = BREAKAGES[breakage]
    breaks(folder / name)
    return folder, folder / name, says


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_hf_folders_unreadable_file_is_named(tmp_path, breakage):
    folder, path, says = _broken_folder(tmp_path, breakage)
    with pytest.raises(ConfigError) as err:
        build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    _one_line_naming(err.value, path, says)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_tokenizer_file_says_to_make_it_readable(tmp_path):
    folder = write_llama_like_tokenizer(tmp_path / "tok")
    (folder / "tokenizer_config.json").chmod(0)
    with pytest.raises(ConfigError, match=r"tokenizer_config.json cannot be read \(permission denied\): make it readable"):  # fmt: skip
        build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)


def test_a_damaged_sentencepiece_model_is_named(tmp_path):
    """transformers would try tiktoken on it and ask for tiktoken to be installed."""
    spm = pytest.importorskip("sentencepiece")
    pytest.importorskip("transformers")
    folder = tmp_path / "spm"
    folder.mkdir()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 20), model_prefix=str(folder / "tokenizer"),
        vocab_size=200, model_type="bpe", minloglevel=2,
    )  # fmt: skip
    (folder / "tokenizer.vocab").unlink()
    _truncate(folder / "tokenizer.model")
    with pytest.raises(ConfigError) as err:
        build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    _one_line_naming(err.value, folder / "tokenizer.model", "could not parse ModelProto")


def test_gpt2_and_wordpiece_files_that_cannot_be_read_are_named(tmp_path):
    """data.tokenizer_path's vocab.json + merges.txt, tokenizer.json, vocab.txt."""
    from tokenizers import Tokenizer

    tokenizer_json = write_llama_like_tokenizer(tmp_path / "tok") / "tokenizer.json"
    model = json.loads(tokenizer_json.read_text())
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    vocab = {**model["model"]["vocab"], "<|endoftext|>": len(model["model"]["vocab"])}
    (gpt2 / "vocab.json").write_text(json.dumps(vocab))
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["model"]["merges"]]
    (gpt2 / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    assert load_gpt2(str(gpt2), tmp_path).vocab_size == len(vocab)
    (gpt2 / "merges.txt").write_text("#version: 0.2\nĠt\n")  # a pair cut in half
    with pytest.raises(ConfigError) as err:
        load_gpt2(str(gpt2), tmp_path)
    _one_line_naming(err.value, gpt2 / "merges.txt", "Merges text file invalid")
    _truncate(gpt2 / "vocab.json")
    with pytest.raises(ConfigError) as err:
        load_gpt2(str(gpt2), tmp_path)
    _one_line_naming(err.value, gpt2 / "vocab.json", "(not JSON: ")

    assert Tokenizer.from_file(str(tokenizer_json))  # a whole one reads; a cut one is named
    _truncate(tokenizer_json)
    with pytest.raises(ConfigError) as err:
        load_gpt2(str(tokenizer_json), tmp_path)
    _one_line_naming(err.value, tokenizer_json, "EOF while parsing")

    vocab = tmp_path / "bert" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_text("")
    with pytest.raises(ConfigError) as err:
        load_wordpiece(str(vocab.parent), tmp_path)
    _one_line_naming(err.value, vocab, "(it is empty)")
    vocab.write_text("[PAD]\nthe\n")  # cut before BERT's [SEP] / [CLS]
    with pytest.raises(ConfigError) as err:
        load_wordpiece(str(vocab.parent), tmp_path)
    _one_line_naming(err.value, vocab, "not found in the vocabulary")


# ---- train.py: exit 2 and the one line, no traceback ----------------------------------------


@pytest.mark.parametrize("breakage", ["truncated tokenizer.json", "invalid tokenizer_config.json"])
def test_train_exits_2_naming_the_file(tmp_path, breakage):
    """Before: a truncated tokenizer.json was a traceback and exit 1 ("EOF while parsing a
    value"), a bad tokenizer_config.json exit 2 with json's message alone."""
    folder, path, says = _broken_folder(tmp_path, breakage)
    write_text_corpus(tmp_path / "corpus", docs=2)
    env = dict(os.environ, FLASHTRAIN_CPU_ATTENTION="torch", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO), WANDB_MODE="disabled")  # fmt: skip
    args = ["model=gpt2-tiny", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
            "seq_len=32", "micro_batch_size=2", "global_batch_size=2", "trainer.max_steps=1",
            "logger=none", "data=text_files", f"data.data_files={tmp_path}/corpus/*.txt",
            f"data.tokenizer=hf:{folder}", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    res = subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True,
                         timeout=train_testing().HANG_GUARD_S)  # fmt: skip
    assert res.returncode == 2, res.stderr[-3000:]
    output = res.stdout + res.stderr  # the log line goes to the console
    assert "Traceback" not in output, output[-3000:]
    line = next(line for line in output.splitlines() if "ConfigError" in line)
    assert f"tokenizer file {path} cannot be read" in line and says in line, line
    assert DAMAGED in line, line


def test_a_special_token_the_vocabulary_lacks_names_the_files(tmp_path):
    """A tokenizer_config.json of another tokenizer: was "tokenizer 'hf:…' has no <s> token
    (needed as bos_id)", naming no file."""
    folder = write_llama_like_tokenizer(tmp_path / "tok")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ValueError) as err:
        build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    message = str(err.value)
    assert "\n" not in message and "has no <s> token (needed as bos_id)" in message
    assert f"{folder / 'tokenizer.json'}, {folder / 'tokenizer_config.json'}" in message
    assert "copy or download its files again" in message
