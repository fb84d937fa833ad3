"""The run's tokenizer, for an exported folder: Hugging Face tokenizer files, or a note.

GPT-2 BPE and WordPiece runs used a `tokenizers` tokenizer: its tokenizer.json and
tokenizer_config.json are written (AutoTokenizer.from_pretrained loads them). A Hugging Face
tokenizer (data.tokenizer=hf:<folder or hub id>) ships its own files as they are (tokenizer.json,
tokenizer_config.json, special_tokens_map.json, tokenizer.model), plus a tokenizer.json converted
from a SentencePiece-only folder so that loading it needs no sentencepiece. Byte-level runs
(UTF-8 bytes + special ids) and data that comes as ids (synthetic tasks, Pathfinder pixels) have
no tokenizer files: the folder's README says how their ids are made instead.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from flashtrain.data.hf_tokenizer import (
    TOKENIZER_JSON,
    is_hf_tokenizer,
    read_json_object,
    special_tokens,
)
from flashtrain.data.tokenization import BYTE_VOCABS, ByteTokenizer, build_tokenizer

FILE_TOKENIZERS = ("gpt2", "wordpiece")


@dataclass
class TokenizerInfo:
    kind: str | None  # data.tokenizer, or None for data without one
    token_ids: dict = field(default_factory=dict)  # bos/eos/pad token ids for config.json
    readme: str = ""  # what the folder's README says about tokens


def _special_ids(tok) -> dict:
    ids = {}
    if tok.eos_id is not None:  # GPT-2's <|endoftext|> is its bos too
        ids.update(bos_token_id=tok.eos_id, eos_token_id=tok.eos_id)
    if tok.bos_id is not None:
        ids["bos_token_id"] = tok.bos_id
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
    if is_hf_tokenizer(kind):
        return _copy_hf_tokenizer(kind, tok, folder)
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


def _copy_hf_tokenizer(kind: str, tok, folder: Path) -> TokenizerInfo:
    """The hf: tokenizer's own files, copied as they are (the ones its fingerprint covers)."""
    for path in tok.files:
        shutil.copyfile(path, folder / path.name)
    if not (folder / TOKENIZER_JSON).is_file():  # converted from tokenizer.model
        tok.backend.save(str(folder / TOKENIZER_JSON))
    _name_eos(tok, folder)
    return TokenizerInfo(
        kind,
        _special_ids(tok),
        # its name, not data.tokenizer: that may be a folder of the training machine
        readme=f"Tokenizer: the run's Hugging Face tokenizer `{tok.name}` ({tok.vocab_size} "
        "ids), its own files: `AutoTokenizer.from_pretrained(this_folder)`. "
        "Training encoded each document as `tokenizer(text)` does (its special tokens, e.g. "
        f"bos, included) and, with data.eos_policy=append, ended it in eos (id {tok.eos_id}).",
    )


def _name_eos(tok, folder: Path) -> None:
    """An EOS the run chose (data.eos_token, or the one end-of-text token of a folder whose
    files name none) written into the copy's tokenizer_config.json, so that AutoTokenizer
    ends text in the token training ended documents in."""
    own = special_tokens(tok.folder).get("eos_id")
    if tok.eos_token is None or tok.eos_token == own:
        return
    path = folder / "tokenizer_config.json"
    config = read_json_object(path) if path.exists() else {}
    path.write_text(json.dumps(config | {"eos_token": tok.eos_token}, indent=2) + "\n")
