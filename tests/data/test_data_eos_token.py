"""The EOS of an hf: tokenizer folder holding only tokenizer.json (a BPE trained with the
`tokenizers` library, no tokenizer_config.json): its one end-of-text special token is taken,
data.eos_token names another (or the one of an ambiguous folder), and a folder with none is
refused at start, in the dry run too, naming the folder and data.eos_token (issue 56, item 13).
The expected ids are the `tokenizers` library's own (token_to_id of the saved file)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from config_testing import compose
from data_testing import lm_config, write_text_corpus

from flashtrain.data import prepare_data
from flashtrain.data.config import LMCorpusConfig
from flashtrain.data.corpus import corpus_cache_dir
from flashtrain.data.registry import data_config
from flashtrain.data.token_cache import open_token_file
from flashtrain.data.tokenization import build_tokenizer
from flashtrain.typed_config import ConfigError


def write_bare_bpe(folder: Path, specials: list[str]) -> Path:
    """tokenizer.json alone: a byte-level BPE trained on a few lines, `specials` added first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(["the quick brown fox", "jumps over the lazy dog"] * 5, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def token_id(folder: Path, token: str) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(token)


def tokenizer(folder: Path, **settings):
    return build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}", **settings), folder)


def test_the_one_end_of_text_special_token_is_the_eos_and_ends_every_document(tmp_path):
    folder = write_bare_bpe(tmp_path / "tok", ["<pad>", "<|endoftext|>"])
    eos = token_id(folder, "<|endoftext|>")
    tok = tokenizer(folder)
    assert tok.eos_id == eos and "-eos" not in tok.name  # the folder's own: its files' name
    write_text_corpus(tmp_path / "corpus", docs=4)
    cfg = lm_config(tmp_path, tokenizer=f"hf:{folder}", vocab_size=tok.vocab_size)
    prepare_data(cfg, progress=False)
    cache = open_token_file(corpus_cache_dir(data_config(cfg), tok, "append") / "train.bin")
    ends = cache.tokens[cache.doc_starts[1:] - 1]
    assert len(ends) == cache.num_docs and (ends == eos).all()


def test_data_eos_token_names_it_and_a_token_not_there_is_refused(tmp_path):
    folder = write_bare_bpe(tmp_path / "tok", ["</s>", "<|endoftext|>", "<sep>"])
    assert tokenizer(folder).eos_id is None  # two end-of-text tokens: not guessed
    chosen = tokenizer(folder, eos_token="</s>")
    assert chosen.eos_id == token_id(folder, "</s>") and chosen.name.endswith(f"-eos{chosen.eos_id}")  # fmt: skip
    other = tokenizer(folder, eos_token="<sep>")
    assert other.eos_id == token_id(folder, "<sep>") and other.name != chosen.name  # own caches
    with pytest.raises(ConfigError) as error:
        tokenizer(folder, eos_token="<|end|>")
    message = str(error.value)
    assert f"data.eos_token='<|end|>' is not a token of tokenizer hf:{folder}" in message
    assert "</s>, <|endoftext|>, <sep>" in message
    with pytest.raises(ValueError, match="data.eos_token='</s>' names the EOS of an hf: tokenizer"):
        LMCorpusConfig(tokenizer="gpt2", eos_token="</s>")


@pytest.mark.parametrize(
    ("specials", "why"),
    [
        (["<pad>", "<mask>"], "none of its special tokens is one of <|endoftext|>, </s>"),
        (["</s>", "<|endoftext|>"], "</s> and <|endoftext|> are all end-of-text tokens"),
    ],
    ids=["none", "two"],
)
def test_a_folder_without_an_eos_is_refused_at_start_and_in_the_dry_run(tmp_path, specials, why):
    from flashtrain.train import run
    from flashtrain.train.config import validate_config

    folder = write_bare_bpe(tmp_path / "tok", specials)
    base = ["model=llama-tiny", "data=text_files", f"data.tokenizer=hf:{folder}", "logger=none"]
    for check in (
        lambda: validate_config(compose(base)),  # the first thing a run does
        lambda: run(compose([*base, "trainer.max_steps=0"]), tmp_path / "run"),
    ):
        with pytest.raises(ConfigError) as error:
            check()
        message = str(error.value)
        assert f"tokenizer hf:{folder} ({folder}) has no EOS token" in message, message
        assert why in message and "data.eos_token" in message and "data.eos_policy=none" in message  # fmt: skip
    named = validate_config(compose([*base, f"data.eos_token='{specials[0]}'"]))  # quoted for Hydra
    assert named.data.vocab_size == tokenizer(folder).vocab_size  # accepted, vocabulary set
    validate_config(compose([*base, "data.eos_policy=none"]))  # no EOS needed


def test_an_export_names_the_eos_training_used(tmp_path):
    """The copied folder's tokenizer_config.json names it: AutoTokenizer ends text in it."""
    from transformers import AutoTokenizer

    from flashtrain.hf.tokenizer_files import write_tokenizer

    folder = write_bare_bpe(tmp_path / "tok", ["<pad>", "<|endoftext|>"])
    for settings, eos in (({}, "<|endoftext|>"), ({"eos_token": "<pad>"}, "<pad>")):
        out = tmp_path / f"export-{eos.strip('<|>')}"
        out.mkdir()
        data = dataclasses.asdict(LMCorpusConfig(tokenizer=f"hf:{folder}", **settings))
        info = write_tokenizer({"data": data}, out, max_len=64)
        assert info.token_ids["eos_token_id"] == token_id(folder, eos)
        assert AutoTokenizer.from_pretrained(str(out)).eos_token == eos
