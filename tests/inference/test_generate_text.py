"""The text scripts/generate.py prints is the new ids decoded after their prompt's, streamed or
batched: a SentencePiece-style tokenizer (Metaspace: Llama-2, Mistral) keeps the first new word's
space, a byte-level one (GPT-2, Llama-3) prints a character split over tokens once, whole.
The model's tokens are scripted (generate_cli.generate replaced): the text is what is tested."""

from __future__ import annotations

import io

import pytest
from tokenizer_testing import (
    EOS,
    hf_data,
    saved_text_run,
    write_byte_level_tokenizer,
    write_metaspace_tokenizer,
)

from flashtrain.inference import generate_cli
from flashtrain.inference.run_tokenizer import continuation


def _saved_run(tmp_path_factory, write_tokenizer):
    """(run directory, its tokenizers.Tokenizer) of a run tokenized by write_tokenizer's."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp(write_tokenizer.__name__)
    folder = write_tokenizer(root / "tok")
    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return saved_text_run(root / "run", hf_data(folder)), backend


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory):
    return _saved_run(tmp_path_factory, write_metaspace_tokenizer)


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    return _saved_run(tmp_path_factory, write_byte_level_tokenizer)


def _ids(tok, *tokens: str) -> list[int]:
    ids = [tok.token_to_id(t) for t in tokens]
    assert None not in ids, tokens
    return ids


def _run(monkeypatch, run, prompts: list[str], new: list[list[int]]) -> tuple[str, list[str]]:
    """(stdout, stdout after each step) of scripts/generate.py on `prompts` when the model's
    new tokens are `new` (one list per prompt, as generate returns them)."""
    printed: list[str] = []
    out = io.StringIO()

    def scripted(model, prompt_ids, max_new_tokens, sampling, *, seed, stop_id, on_step):
        assert len(prompt_ids) == len(new)
        for step in range(max(map(len, new))):
            if on_step is not None:
                on_step([ids[step] if step < len(ids) else None for ids in new])
            printed.append(out.getvalue())
        return new

    monkeypatch.setattr(generate_cli, "generate", scripted)
    argv = [run, "--temperature", "0", "--device", "cpu"]
    assert generate_cli.main([*argv, *(a for p in prompts for a in ("--prompt", p))], out=out) == 0
    return out.getvalue(), printed


def test_streamed_text_keeps_the_first_new_words_space(metaspace, monkeypatch):
    run, tok = metaspace
    out, printed = _run(monkeypatch, run, ["alpha beta"], [_ids(tok, "▁alpha", "▁gamma")])
    assert out == "alpha beta alpha gamma\n"  # was "alpha betaalpha gamma"
    assert printed == ["alpha beta alpha", "alpha beta alpha gamma"]


def test_batched_text_keeps_the_first_new_words_space(metaspace, monkeypatch):
    """Prompts of different lengths, one ending mid-word, one whose sequence ends in <eos>
    while the others go on (<eos> is no text)."""
    run, tok = metaspace
    new = [_ids(tok, "▁alpha", "▁gamma"), _ids(tok, "▁delta", EOS), _ids(tok, "a", "▁gamma")]
    out, _ = _run(monkeypatch, run, ["alpha beta", "gamma", "alpha bet"], new)
    assert out.splitlines() == ["alpha beta alpha gamma", "gamma delta", "alpha beta gamma"]


def test_streamed_text_after_an_empty_prompt_and_up_to_eos(metaspace, monkeypatch):
    """An empty prompt is Llama's <s> alone: the text starts without a space, as decoding the
    ids alone would; <eos> ends it and prints nothing."""
    run, tok = metaspace
    out, _ = _run(monkeypatch, run, [""], [_ids(tok, "▁alpha", "▁beta", EOS)])
    assert out == "alpha beta\n"
    out, _ = _run(monkeypatch, run, ["gamma"], [_ids(tok, "▁delta", EOS)])
    assert out == "gamma delta\n"


def test_byte_level_characters_split_over_tokens_print_once_whole(byte_level, monkeypatch):
    """é, ï and 🙂 are 2, 2 and 4 byte tokens: streamed, each is printed once complete, never
    as U+FFFD; batched, the same text."""
    run, tok = byte_level
    new = tok.encode(" café naïve 🙂 ok", add_special_tokens=False).ids
    assert len(new) > len(" café naïve 🙂 ok")  # characters split over tokens
    out, printed = _run(monkeypatch, run, ["the fox"], [new])
    assert out == "the fox café naïve 🙂 ok\n"
    assert all("\ufffd" not in p and out.startswith(p) for p in printed)
    at = printed.index("the fox caf")  # é's first byte held back, then é whole
    assert printed[at : at + 3] == ["the fox caf", "the fox caf", "the fox café"]
    out, _ = _run(monkeypatch, run, ["the fox", "alpha"], [new, new[:6]])
    assert out.splitlines() == ["the fox café naïve 🙂 ok", "alpha café"]


def test_wordpiece_text_joins_a_continued_word_and_keeps_the_space(tmp_path, monkeypatch):
    """WordPiece alone decodes a first "##ing" as "##ing" and drops a first word's space."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "play", "##ing",
                                "the", "game", "."]) + "\n")  # fmt: skip
    data = dict(loader="lm_corpus", tokenizer="wordpiece", tokenizer_path=str(vocab),
                vocab_size=10)  # fmt: skip
    run = saved_text_run(tmp_path / "run", data)
    out, _ = _run(monkeypatch, run, ["play"], [[6, 7, 8, 9]])  # ##ing the game .
    assert out == "playing the game.\n"  # was "play##ing the game."
    out, _ = _run(monkeypatch, run, ["play", "the"], [[6], [8]])
    assert out.splitlines() == ["playing", "the game"]  # was "play##ing", "thegame"


def test_a_decoder_that_rewrites_the_prompts_end_gives_what_follows_the_shared_part():
    assert continuation("alpha beta gamma", "alpha beta") == " gamma"
    assert continuation("hello. world", "hello .") == ". world"  # WordPiece cleanup of " ."


def test_an_empty_prompt_without_a_bos_says_to_give_it_text(tmp_path, capsys):
    """Bytes encode "" as no token at all (Llama's <s> makes it one: see above)."""
    run = saved_text_run(tmp_path / "run", dict(loader="lm_corpus", tokenizer="byte",
                                                 vocab_size=258))  # fmt: skip
    out = io.StringIO()
    assert generate_cli.main([run, "--prompt", "ab", "--prompt", ""], out=out) == 2
    err = capsys.readouterr().err
    assert out.getvalue() == "" and len(err.splitlines()) == 1
    assert "prompt 2 has none (its text is empty" in err and "give it some text" in err
