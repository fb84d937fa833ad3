"""The run's tokenizer, for an exported folder: Hugging Face tokenizer files, or a note.

GPT-2 BPE and WordPiece runs used a `tokenizers` tokenizer: its tokenizer.json and
tokenizer_config.json are written (AutoTokenizer.from_pretrained loads them). Byte-level runs
(UTF-8 bytes + special ids) and data that comes as ids (synthetic tasks, Pathfinder pixels) have
no tokenizer files: the folder's README says how their ids are made instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from flashtrain.data.tokenization import BYTE_VOCABS, ByteTokenizer, build_tokenizer

FILE_TOKENIZERS = ("gpt2", "wordpiece")


@dataclass
class TokenizerInfo:
    kind: str | None  # data.tokenizer, or None for data without one
    token_ids: dict = field(default_factory=dict)  # bos/eos/pad token ids for config.json
    readme: str = ""  # what the folder's README says about tokens


def _special_ids(tok) -> dict:
    ids = {}
    if tok.eos_id is not None:
        ids.update(bos_token_id=tok.eos_id, eos_token_id=tok.eos_id)
    if tok.pad_id is not None:
        ids["pad_token_id"] = tok.pad_id
    return ids


def load_run_tokenizer(run_config: dict):
    """(kind, flashtrain Tokenizer or None) of the run's data config."""
    data = run_config.get("data") or {}
    kind = data.get("tokenizer")
    if kind is None:
        return None, None
    if kind in BYTE_VOCABS:
        return kind, ByteTokenizer(kind)
    from flashtrain.data.config import cache_root

    cfg = OmegaConf.create(data)
    return kind, build_tokenizer(cfg, cache_root(cfg))


def write_tokenizer(
    run_config: dict, folder: Path, max_len: int, loaded: tuple | None = None
) -> TokenizerInfo:
    """Write the run's tokenizer files into `folder` (when it has any); say what was done.
    loaded: load_run_tokenizer(run_config), already loaded (and checked) by the caller."""
    data = run_config.get("data") or {}
    kind, tok = loaded if loaded is not None else load_run_tokenizer(run_config)
    if tok is None:
        name = data.get("name", "?")
        return TokenizerInfo(
            None,
            readme=f"The run's data (`{name}`) comes as token ids, with no tokenizer: feed the "
            f"model ids in [0, {data.get('vocab_size', '?')}) as the data module makes them.",
        )
    if kind in BYTE_VOCABS:
        specials = ", ".join(
            f"{a[:-3]} = {getattr(tok, a)}" for a in ("eos_id", "pad_id", "cls_id", "sep_id", "mask_id")
            if getattr(tok, a) is not None
        )  # fmt: skip
        return TokenizerInfo(
            kind,
            _special_ids(tok),
            readme=f"Byte-level run (tokenizer `{kind}`): no tokenizer files. Token ids 0..255 are "
            f"the text's UTF-8 bytes (`list(text.encode('utf-8'))`), then the special ids: "
            f"{specials} ({tok.vocab_size} ids). Decode with "
            "`bytes(i for i in ids if i < 256).decode('utf-8', errors='replace')`.",
        )
    from transformers import PreTrainedTokenizerFast

    raw = getattr(tok.backend, "_tokenizer", tok.backend)  # BertWordPieceTokenizer wraps one
    if kind == "gpt2":
        specials = dict(
            bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
        )
    else:
        specials = dict(
            unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
        )  # fmt: skip
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, model_max_length=max_len, **specials)
    fast.save_pretrained(folder)
    return TokenizerInfo(
        kind,
        _special_ids(tok),
        readme=f"Tokenizer: the run's `{kind}` tokenizer ({tok.name}, {tok.vocab_size} ids), as "
        "tokenizer.json: `AutoTokenizer.from_pretrained(this_folder)`.",
    )
