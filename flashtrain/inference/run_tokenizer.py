"""The text side of a loaded run: its config and its tokenizer (integers for synthetic data, the
corpus's own otherwise). The model itself comes from flashtrain.checkpoint.load_model.

    model, info = load_model(CKPT, device="cpu")
    tokenizer = run_tokenizer(run_config(info).data, checkpoint=info)  # the one it trained with
    text = decode_continuation(tokenizer, prompt_ids, new_ids)  # what generation added

Generated ids are decoded after their prompt's, never alone (decode_continuation).
"""

from __future__ import annotations

import os
from typing import Any

from flashtrain.checkpoint import CheckpointInfo
from flashtrain.checkpoint.read import CONFIG, check_tokenizer
from flashtrain.data.config import CorpusConfig, RetrievalConfig, SyntheticConfig, cache_root
from flashtrain.data.registry import data_config
from flashtrain.data.tokenization import ByteTokenizer, build_tokenizer


class IntegerTokenizer:
    """Token ids written as decimal integers ("3 11 5"): the synthetic tasks' text form."""

    name = "integers"
    eos_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        try:
            ids = [int(word) for word in text.split()]
        except ValueError:
            raise ValueError(
                f"this run's data is synthetic: a prompt is token ids separated by spaces "
                f"(0..{self.vocab_size - 1}), got {text!r}"
            ) from None
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad} are outside 0..{self.vocab_size - 1}")
        return ids

    def decode(self, ids) -> str:
        return "".join(f" {i}" for i in ids)

    @property
    def special_ids(self) -> list[int]:
        return []


class TextTokenizer:
    """A corpus tokenizer (flashtrain.data.tokenization) with encode/decode of one text."""

    def __init__(self, tokenizer):
        self.inner = tokenizer
        self.name, self.vocab_size, self.eos_id = (
            tokenizer.name,
            tokenizer.vocab_size,
            tokenizer.eos_id,
        )

    def encode(self, text: str) -> list[int]:
        return self.inner.encode_batch([text])[0]

    def decode(self, ids) -> str:
        return self.inner.decode(list(ids))

    @property
    def special_ids(self) -> list[int]:
        """Ids that stand for no text (<eos>, <pad>, ...)."""
        return self.inner.special_ids


def decode_continuation(tokenizer, prompt: list[int], new: list[int]) -> str:
    """The text that ids `new` add after ids `prompt`: decode(prompt + new) past decode(prompt).
    Decoded alone they would lose what depends on the ids before them: a SentencePiece-style
    decoder (Llama-2, Mistral: Metaspace) drops the first token's leading space, and a
    byte-level one cannot finish a character whose bytes began in the prompt."""
    return continuation(tokenizer.decode([*prompt, *new]), tokenizer.decode(prompt))


def continuation(text: str, head: str) -> str:
    """What `text` (the decoding of a prompt and more ids) adds to `head` (the prompt's): what
    follows the part both share. Usually head itself; shorter where a decoder rewrites the
    prompt's end once more ids follow (WordPiece's cleanup joins " ." to ".")."""
    return text[len(os.path.commonprefix([text, head])) :]


def run_tokenizer(data_cfg: Any, *, checkpoint: CheckpointInfo | None = None):
    """The tokenizer of a run's data config: integers for synthetic data, the corpus's own
    (bytes, GPT-2 BPE, WordPiece, a Hugging Face hf:<folder or hub id>, which encodes a prompt
    with its own special tokens, e.g. Llama's bos, and decodes without them) otherwise. checkpoint: the loaded checkpoint whose run's
    data config this is; a tokenizer rebuilt from files that are not the ones its weights were
    trained with (replaced after training) is refused with a CheckpointError."""
    cfg = data_config(data_cfg)
    if isinstance(cfg, SyntheticConfig):
        return IntegerTokenizer(cfg.vocab_size)
    if isinstance(cfg, RetrievalConfig):  # generated documents, in bytes
        return TextTokenizer(ByteTokenizer(cfg.tokenizer))
    if isinstance(cfg, CorpusConfig):
        tokenizer = build_tokenizer(cfg, cache_root(cfg))
        if checkpoint is not None and checkpoint.path is not None:
            check_tokenizer(tokenizer, checkpoint.meta, checkpoint.path, cfg.vocab_size)
        return TextTokenizer(tokenizer)
    raise ValueError(f"data loader {cfg.loader!r} has no text tokenizer to generate with")


def run_config(info: CheckpointInfo) -> Any:
    """The resolved config of the run a loaded checkpoint came from (its data, seq_len, seed),
    or a ValueError for weights without one (a transformers checkpoint, a bare torch file)."""
    if info.run_config is None:
        raise ValueError(
            f"{info.source} has no {CONFIG}: its run's config (data, tokenizer) is unknown; name "
            "a checkpoint the trainer wrote"
        )
    return info.run_config
