"""data.tokenizer=hf:<folder or hub id>: a Hugging Face tokenizer folder (built here with the
`tokenizers` library, never downloaded), its fingerprint, token caches, the offline hub id, and
model.init_from=hf:'s default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from data_testing import lm_config, write_text_corpus
from hub_testing import use_hub_cache

from flashtrain.data import build_data, prepare_data
from flashtrain.data.config import LMCorpusConfig
from flashtrain.data.corpus import corpus_cache_dir
from flashtrain.data.hf_tokenizer import check_tokenizer_source
from flashtrain.data.registry import data_config
from flashtrain.data.token_cache import TokenCacheError, open_token_file, write_token_file
from flashtrain.data.tokenization import build_tokenizer
from flashtrain.typed_config import ConfigError

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "long context training of llamas and mistrals on flash attention",
    "tokenizers split text into pieces, bytes first, then merges",
]


def write_llama_like_tokenizer(folder: Path, sentences=SENTENCES) -> Path:
    """A Llama-3-like byte-level BPE (~300 ids, bos / eos specials, a post-processor putting
    bos first) as tokenizer.json + tokenizer_config.json in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(sentences * 10, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def folder(tmp_path):
    return write_llama_like_tokenizer(tmp_path / "llama-tok")


def hf_config(tmp_path, folder, **overrides) -> dict:
    return lm_config(tmp_path, tokenizer=f"hf:{folder}", **overrides)


def test_encodes_as_tokenizers_does_with_its_specials(folder, tmp_path):
    from tokenizers import Tokenizer

    own = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    texts = ["the lazy llamas", "flash attention, naïve café"]
    assert tok.encode_batch(texts) == [e.ids for e in own.encode_batch(texts)]
    assert tok.encode_batch(texts)[0][0] == tok.bos_id == own.token_to_id(BOS)  # post-processor
    assert (tok.eos_id, tok.pad_id) == (own.token_to_id(EOS), None)  # Llama has no pad
    assert tok.vocab_size == own.get_vocab_size(with_added_tokens=True)
    assert tok.name.startswith("hf:") and tok.decode(tok.encode_batch(texts)[0]) == texts[0]


def test_a_post_processor_appending_eos_leaves_it_to_the_corpus(folder, tmp_path):
    """add_eos_token-style tokenizers: the corpus appends the one <eos> (eos_policy=append)."""
    from tokenizers import Tokenizer, processors

    own = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos, eos = own.token_to_id(BOS), own.token_to_id(EOS)
    own.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, bos), (EOS, eos)]
    )
    own.save(str(folder / "tokenizer.json"))
    tok = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    assert tok.encode_batch(["the lazy dog"])[0] == own.encode("the lazy dog").ids[:-1]


def test_fingerprint_follows_the_contents_not_the_path(folder, tmp_path):
    name = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path).name
    moved = shutil.copytree(folder, tmp_path / "elsewhere")
    assert build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{moved}"), tmp_path).name == name
    write_llama_like_tokenizer(moved, SENTENCES[:2])  # another vocabulary, same path
    assert build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{moved}"), tmp_path).name != name


def test_documents_end_in_eos_and_another_tokenizer_gets_its_own_cache(folder, tmp_path):
    tok = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    texts = write_text_corpus(tmp_path / "corpus", docs=4)
    cfg = hf_config(tmp_path, folder, vocab_size=tok.vocab_size)
    prepare_data(cfg, progress=False)
    directory = corpus_cache_dir(data_config(cfg), tok, "append")
    assert ":" not in directory.name  # "hf:<fingerprint>" as hf-<fingerprint>
    docs = []
    for split in ("train", "validation"):
        f = open_token_file(directory / f"{split}.bin", tokenizer=tok.name)
        starts = f.doc_starts.tolist()
        assert all(f.tokens[b - 1] == tok.eos_id for b in starts[1:])
        docs += [f.tokens[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])]
    assert sorted(docs) == sorted(ids + [tok.eos_id] for ids in tok.encode_batch(texts))

    other_folder = write_llama_like_tokenizer(tmp_path / "other", SENTENCES[1:])
    other = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{other_folder}"), tmp_path)
    assert corpus_cache_dir(data_config(cfg), other, "append") != directory  # rebuilt apart
    with pytest.raises(TokenCacheError, match=f"made with tokenizer='{tok.name}'"):
        open_token_file(directory / "train.bin", tokenizer=other.name)


def test_a_cache_file_of_another_tokenizer_is_refused(folder, tmp_path):
    tok = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    path = write_token_file(tmp_path / "t.bin", [(np.arange(5), np.array([5]))], num_tokens=5,
                            num_docs=1, tokenizer="hf:0123456789", vocab_size=tok.vocab_size,
                            eos_policy="append", eos_id=tok.eos_id)  # fmt: skip
    with pytest.raises(TokenCacheError, match="tokenizer='hf:0123456789'.*asks for 'hf:"):
        open_token_file(path, tokenizer=tok.name)


def test_vocab_size_mismatch_names_the_tokenizers_count(folder, tmp_path):
    ids = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path).vocab_size
    write_text_corpus(tmp_path / "corpus", docs=2)
    with pytest.raises(ValueError, match=f"data.vocab_size=258 but .* has {ids} ids; set data.vocab_size={ids}"):  # fmt: skip
        build_data(hf_config(tmp_path, folder), seq_len=8, micro_batch_size=1, seed=0)


def test_offline_uncached_hub_id_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    use_hub_cache(monkeypatch, tmp_path / "empty" / "hub")
    cfg = LMCorpusConfig(tokenizer="hf:some-org/some-llama")
    for check in (lambda: build_tokenizer(cfg, tmp_path), lambda: check_tokenizer_source(cfg)):
        with pytest.raises(FileNotFoundError) as err:
            check()
        message = str(err.value)
        assert "\n" not in message and "'some-org/some-llama' is not in the cache" in message
        assert "HF_HUB_OFFLINE=1" in message and "or pass a local folder" in message
    assert check_tokenizer_source(LMCorpusConfig()) is None  # bytes: nothing to resolve


def test_a_cached_hub_tokenizer_loads_offline(folder, tmp_path, monkeypatch):
    """The Hugging Face cache's layout (refs/main -> snapshots/<commit>/), as hf download
    leaves it; a snapshot holding only the weights (model.init_from's) is 'not in the cache'."""
    repo = tmp_path / "hub" / "models--org--tiny-llama"
    shutil.copytree(folder, repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    use_hub_cache(monkeypatch, tmp_path / "hub")
    local = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    cached = build_tokenizer(LMCorpusConfig(tokenizer="hf:org/tiny-llama"), tmp_path)
    assert cached.name == local.name
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (repo / "snapshots" / ("a" * 40) / name).unlink()
    with pytest.raises(FileNotFoundError, match="'org/tiny-llama' is not in the cache"):
        check_tokenizer_source(LMCorpusConfig(tokenizer="hf:org/tiny-llama"))


def test_sentencepiece_only_folder_without_sentencepiece_says_what_to_install(tmp_path):
    if _has("sentencepiece") and _has("transformers"):
        pytest.skip("sentencepiece installed: test_sentencepiece_only_folder covers the path")
    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "tokenizer.model").write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r'only a SentencePiece tokenizer.model .*pip install -e "\.\[hf\]" sentencepiece'):  # fmt: skip
        build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{tmp_path / 'spm'}"), tmp_path)


def test_sentencepiece_only_folder(tmp_path):
    """A Llama-2-style folder (tokenizer.model + tokenizer_config.json) converted by
    transformers' AutoTokenizer: encodes as AutoTokenizer does, <s> first."""
    spm = pytest.importorskip("sentencepiece")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "spm"
    folder.mkdir()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 20), model_prefix=str(folder / "tokenizer"),
        vocab_size=320, model_type="bpe", bos_id=1, eos_id=2, unk_id=0, byte_fallback=True,
        minloglevel=2,
    )  # fmt: skip
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = "the lazy llamas train"
    assert tok.encode_batch([text])[0] == auto(text)["input_ids"]
    assert (tok.bos_id, tok.eos_id, tok.unk_id) == (1, 2, 0)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---- model.init_from=hf: makes the source's tokenizer the default ---------------------------


def test_init_from_hf_folder_sets_its_tokenizer(folder, tmp_path):
    from config_testing import compose

    from flashtrain.train.config import validate_config

    ids = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path).vocab_size
    base = ["model=llama-tiny", "data=text_files", f"data.data_files={tmp_path}/*.txt"]
    cfg = validate_config(compose([*base, f"model.init_from=hf:{folder}"]))
    assert (cfg.data.tokenizer, cfg.data.vocab_size) == (f"hf:{folder}", ids)
    assert cfg.model.vocab_size == ids  # ${data.vocab_size}
    chosen = validate_config(
        compose([*base, f"model.init_from=hf:{folder}", "data.tokenizer=gpt2"])
    )
    assert chosen.data.tokenizer == "gpt2"  # a tokenizer the run names stays
    no_files = tmp_path / "byte-export"
    no_files.mkdir()
    byte = validate_config(compose([*base, f"model.init_from=hf:{no_files}"]))
    assert (byte.data.tokenizer, byte.data.vocab_size) == ("byte", 258)  # a byte-level export
