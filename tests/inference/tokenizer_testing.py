"""Tokenizers the inference tests build for themselves (the `tokenizers` library, trained on a
few words, never downloaded), and a saved run whose data is tokenized by one."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from inference_testing import tiny_llama
from omegaconf import OmegaConf

from flashtrain.checkpoint.write import save_checkpoint

BOS, EOS = "<s>", "</s>"
WORDS = "alpha beta gamma delta the quick brown fox café naïve".split()


def _save(tok, folder: Path) -> Path:
    """tok with Llama's post-processor (bos first) as tokenizer.json + tokenizer_config.json."""
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def write_metaspace_tokenizer(folder: Path) -> Path:
    """A SentencePiece-style BPE (Llama-2's, Mistral's): words start with "▁", which the
    Metaspace decoder turns back into a space, dropping the first token's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", BOS, EOS])
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    return _save(tok, folder)


def write_byte_level_tokenizer(folder: Path) -> Path:
    """A GPT-2 / Llama-3-style byte-level BPE trained on ASCII words only: a non-ASCII
    character is several tokens, one per UTF-8 byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(["alpha beta gamma delta the quick brown fox"] * 20, trainer)
    return _save(tok, folder)


def hf_data(tokenizer_folder: Path) -> dict:
    """A text run's data config tokenized by hf:<tokenizer_folder>."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    return dict(loader="lm_corpus", tokenizer=f"hf:{tokenizer_folder}", vocab_size=vocab_size)


def saved_text_run(run_dir: Path, data: dict) -> str:
    """A run directory holding one checkpoint (step 1) of a random tiny Llama whose run's data
    config is `data` (its vocab_size the model's): what generate and evaluate load."""
    model = tiny_llama(vocab_size=data["vocab_size"])
    return saved_run(run_dir, model, dict(data, cache_dir=str(run_dir / "cache")))


def saved_run(run_dir: Path, model, data: dict) -> str:
    """A run directory holding one checkpoint (step 1) of `model` (its weights as they are)
    trained, says its config, on `data`: what generate and evaluate load, without training."""
    model_cfg = {k: v for k, v in vars(model.config).items() if not k.startswith("_")}
    config = {"model": model_cfg, "attention": {"impl": "flash"}, "data": data,
              "seq_len": model.config.max_seq_len, "seed": 0}  # fmt: skip
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        save_checkpoint(
            run_dir / "checkpoints", 1, model=model, optimizer=torch.optim.SGD(model.parameters()),
            trainer_state={"step": 1}, meta={"run_name": run_dir.name},
            config_yaml=OmegaConf.to_yaml(config),
        )  # fmt: skip
    return str(run_dir)
