"""A run trained with data.tokenizer=hf:<folder>: the export ships the folder's own tokenizer
files (AutoTokenizer encodes as training did), refuses files replaced since training, and
generate / evaluate (run_tokenizer) encode and decode with it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hf_testing import transformers
from omegaconf import OmegaConf

from flashtrain.checkpoint import load_model
from flashtrain.checkpoint.export_hf import export_checkpoint
from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.data.config import LMCorpusConfig
from flashtrain.data.tokenization import build_tokenizer
from flashtrain.inference.run_tokenizer import run_config, run_tokenizer
from flashtrain.models import build_model

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def write_mistral_like_tokenizer(folder: Path, sentences: list[str]) -> Path:
    """A Llama-2 / Mistral-like BPE over "▁"-marked words (<unk> <s> </s> first, <s> put first
    by the post-processor), its specials in special_tokens_map.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(sentences * 10, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIALS))
    return folder


SENTENCES = ["the lazy llamas train on long context", "mistral winds blow over the fox"]


@pytest.fixture
def trained(tmp_path):
    """A tiny Llama checkpoint of a run whose data.tokenizer was hf:<folder>, its meta.json
    recording the tokenizer as the trainer does; (checkpoint, tokenizer folder, tokenizer)."""
    folder = write_mistral_like_tokenizer(tmp_path / "tok", SENTENCES)
    tok = build_tokenizer(LMCorpusConfig(tokenizer=f"hf:{folder}"), tmp_path)
    data = dict(loader="lm_corpus", name="text_files", tokenizer=f"hf:{folder}",
                vocab_size=tok.vocab_size, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    model = build_model(dict(arch="llama", n_layer=1, n_head=2, n_kv_head=1, d_model=32, d_ff=64,
                             max_seq_len=32, vocab_size=tok.vocab_size), {"impl": "reference"})  # fmt: skip
    meta = {"tokenizer": {"name": tok.name, "vocab_size": tok.vocab_size}, "run_name": "test",
            "model_config": dataclasses.asdict(model.config)}  # fmt: skip
    ckpt = save_checkpoint(tmp_path / "ckpt", 1, model=model,
                           optimizer=torch.optim.AdamW(model.parameters()), trainer_state={},
                           meta=meta, config_yaml=OmegaConf.to_yaml({"data": data}))  # fmt: skip
    return ckpt, folder, tok


def test_export_ships_the_folders_tokenizer(trained, tmp_path):
    ckpt, folder, tok = trained
    out = export_checkpoint(ckpt, tmp_path / "out")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).read_bytes() == (folder / name).read_bytes()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "the lazy fox trains"
    assert hf_tok(text)["input_ids"] == tok.encode_batch([text])[0]  # <s> first, as trained
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id) == (tok.bos_id, tok.eos_id)
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (tok.bos_id, tok.eos_id)
    assert "pad_token_id" not in config or config["pad_token_id"] is None  # it has none
    readme = (out / "README.md").read_text()
    assert f"Hugging Face tokenizer `{tok.name}`" in readme and str(folder) not in readme


def test_files_replaced_since_training_are_refused(trained, tmp_path):
    ckpt, folder, tok = trained
    write_mistral_like_tokenizer(folder, [*SENTENCES, "another corpus, another vocabulary"])
    with pytest.raises(CheckpointError, match=f"trained with tokenizer {tok.name} .* now hf:"):
        export_checkpoint(ckpt, tmp_path / "out")


def test_generate_encodes_and_decodes_with_it(trained):
    ckpt, _, tok = trained
    _, info = load_model(ckpt, attention="reference")
    text_tok = run_tokenizer(run_config(info).data, checkpoint=info)
    ids = text_tok.encode("the lazy llamas")
    assert ids[0] == tok.bos_id and text_tok.decode(ids) == "the lazy llamas"
