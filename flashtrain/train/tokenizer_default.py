"""The tokenizer a run trains with by default and the vocabulary that follows from it: a run
starting from a Hugging Face checkpoint takes the checkpoint's own tokenizer (model.init_from=hf:X
on text data left on bytes), and an hf: tokenizer's id count is the data's vocab_size unless the
config sets another (then refused here, before anything is built), as is one with no EOS to end
its documents with."""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from flashtrain.data.hf_tokenizer import HF_PREFIX, find_tokenizer_folder, is_hf_tokenizer
from flashtrain.data.hub import looks_like_hub_id
from flashtrain.data.registry import DATA_CONFIGS
from flashtrain.data.tokenization import load_hf_tokenizer, no_eos_error
from flashtrain.train.errors import from_config
from flashtrain.typed_config import ConfigError


def tokenizer_from_init(cfg: DictConfig) -> DictConfig:
    """model.init_from=hf:X on text data left on its byte default (data.tokenizer=byte, an
    lm_corpus loader): when X has tokenizer files, the data is tokenized with them,
    data.tokenizer=hf:X data.vocab_size=<its ids> (the model's vocab_size follows
    ${data.vocab_size}); set in a copy of the config (the run's config.yaml shows it) and
    logged. X without tokenizer files (a byte-level run's export) keeps bytes; X not found is
    left to init_from's own error; a hub id neither downloadable nor cached is a ConfigError."""
    init = OmegaConf.select(cfg, "model.init_from", default=None)
    data = OmegaConf.select(cfg, "data", default=None)
    if not (isinstance(init, str) and init.startswith(HF_PREFIX)) or data is None:
        return cfg
    if data.get("loader") != "lm_corpus" or data.get("tokenizer") != "byte":
        return cfg
    ref = init[len(HF_PREFIX) :]
    if not Path(ref).expanduser().is_dir() and not looks_like_hub_id(ref):
        return cfg  # init_from names the missing folder itself
    try:
        folder = find_tokenizer_folder(ref)
    except FileNotFoundError as e:
        raise ConfigError(
            f"model.init_from={init} (its tokenizer is the data's default): {e}"
        ) from None
    if folder is None:
        return cfg
    tokenizer = load_hf_tokenizer(init)
    cfg = copy.deepcopy(cfg)
    cfg.data.tokenizer, cfg.data.vocab_size = init, tokenizer.vocab_size
    _log_once(
        f"model.init_from={init}: the text is tokenized with its tokenizer ({tokenizer.name}): "
        f"data.tokenizer={init} data.vocab_size={tokenizer.vocab_size} (another data.tokenizer, "
        "e.g. gpt2 or hf:<folder>, is kept)"
    )
    return cfg


def vocabulary_from_tokenizer(cfg: DictConfig) -> DictConfig:
    """data.tokenizer=hf:X: data.vocab_size is X's id count (the model's vocab_size follows
    ${data.vocab_size}). Left at the loader's default it is set so, in a copy of the config,
    and logged; set to another count it is a ConfigError now, before the model is built (the
    token ids must fit the embedding exactly: model.vocab_size pads it)."""
    data = OmegaConf.select(cfg, "data", default=None)
    if data is None or not is_hf_tokenizer(data.get("tokenizer")):
        return cfg
    schema = DATA_CONFIGS.get(data.get("loader"))
    fields = {f.name: f for f in dataclasses.fields(schema)} if schema else {}
    if "vocab_size" not in fields:
        return cfg
    with from_config(f"data.tokenizer={data.tokenizer}"):
        tokenizer = load_hf_tokenizer(data.tokenizer, data.get("eos_token"))
    check_eos(data, fields, tokenizer)
    ids, configured = tokenizer.vocab_size, data.get("vocab_size")
    if configured == ids:
        return cfg
    if configured != fields["vocab_size"].default:
        raise ConfigError(
            f"data.vocab_size={configured} but tokenizer {data.tokenizer} has {ids} ids; set "
            f"data.vocab_size={ids}, or leave it unset: it follows an hf: tokenizer (to round "
            f"the embedding up for speed, set model.pad_vocab_multiple)"
        )
    cfg = copy.deepcopy(cfg)
    cfg.data.vocab_size = ids
    _log_once(f"data.vocab_size={ids}: the id count of tokenizer {data.tokenizer}")
    return cfg


def check_eos(data: DictConfig, fields: dict, tokenizer) -> None:
    """A language-model corpus whose documents end in EOS (data.eos_policy=append, or streamed)
    with an hf: tokenizer that has none: a ConfigError now, naming its folder and how to name
    the token (data.eos_token), not once the model is built and the cache is being made."""
    if "eos_policy" not in fields or tokenizer.eos_id is not None:
        return
    policy = data.get("eos_policy", fields["eos_policy"].default)
    if data.get("streaming"):
        raise ConfigError(str(no_eos_error(tokenizer, "streamed documents are joined with it")))
    if policy == "append":
        raise ConfigError(str(no_eos_error(tokenizer, "or set data.eos_policy=none")))


@functools.cache
def _log_once(line: str) -> None:
    """Once per process: the entry point and the trainer both validate the config."""
    logging.getLogger("flashtrain").info("%s", line)
