"""A Hugging Face tokenizer folder, for data.tokenizer=hf:<folder or hub id>: found and read.

    folder = tokenizer_folder("meta-llama/Llama-3.2-1B")   # or a local folder
    backend = read_backend(folder)        # a `tokenizers` Tokenizer (tokenizer.json)
    specials = special_tokens(folder)     # {"bos_id": "<|begin_of_text|>", "eos_id": ...}

A local folder never touches the network. A hub id is the snapshot in the Hugging Face cache
holding the tokenizer files (TOKENIZER_FILES, never weights): downloaded into the cache with
huggingface_hub, or only read from it when HF_HUB_OFFLINE=1; not there is one line naming the id,
HF_HUB_OFFLINE and a local folder. tokenizer.json is read with the `tokenizers` library (Llama-3's
BPE; Llama-2 and Mistral folders ship one too); a folder with only SentencePiece's
tokenizer.model is converted by transformers' AutoTokenizer (the `hf` extra and sentencepiece).
The Tokenizer built from them is tokenization.HFFolderTokenizer (this module imports none of
tokenization's, which builds every kind: no import circle). A tokenizer file that is there but
cannot be read (truncated, empty, not JSON, a folder, unreadable) is a one-line ConfigError naming
it and what to do (unreadable_file), never the parser's bare message.
"""

from __future__ import annotations

import json
from pathlib import Path

from flashtrain.data import hub
from flashtrain.typed_config import ConfigError

HF_PREFIX = "hf:"
TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_MODEL = "tokenizer.model"
# The files a tokenizer folder is read from, in the order its fingerprint hashes them; an
# export ships the same ones.
TOKENIZER_FILES = (
    TOKENIZER_JSON,
    SENTENCEPIECE_MODEL,
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# Tokenizer attribute -> transformers' name of the special token in the config files.
SPECIAL_KEYS = {"bos_id": "bos_token", "eos_id": "eos_token", "pad_id": "pad_token", "unk_id": "unk_token"}  # fmt: skip


def is_hf_tokenizer(kind: str | None) -> bool:
    """Whether a data.tokenizer value names a Hugging Face tokenizer (hf:<folder or hub id>)."""
    return isinstance(kind, str) and kind.startswith(HF_PREFIX)


def hf_reference(kind: str) -> str:
    """The folder or hub id of `hf:<folder or hub id>`; a bare `hf:` is refused."""
    ref = kind[len(HF_PREFIX) :].strip()
    if not ref:
        raise ValueError(
            "data.tokenizer=hf: names no tokenizer; pass hf:<folder> (holding tokenizer.json "
            "or tokenizer.model) or hf:<hub id>, e.g. hf:meta-llama/Llama-3.2-1B"
        )
    return ref


def tokenizer_folder(ref: str) -> Path:
    """The folder holding tokenizer `ref`'s files: a local folder as it is, or a hub id's
    snapshot in the Hugging Face cache (its tokenizer files downloaded unless HF_HUB_OFFLINE).
    A folder or hub model without tokenizer files is a FileNotFoundError."""
    folder = find_tokenizer_folder(ref)
    if folder is None:
        raise FileNotFoundError(
            f"data.tokenizer=hf:{ref}: it has no {TOKENIZER_JSON} or {SENTENCEPIECE_MODEL}"
        )
    return folder


def find_tokenizer_folder(ref: str) -> Path | None:
    """tokenizer_folder(ref), or None when `ref` is a folder or hub model without tokenizer
    files (a byte-level run's export). A missing folder, and a hub id neither downloadable nor
    cached, are one-line FileNotFoundErrors."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path if has_tokenizer(path) else None
    if not hub.looks_like_hub_id(ref):
        raise FileNotFoundError(
            f"data.tokenizer=hf:{ref}: no such folder {path}, and {ref!r} is not a hub id"
        )
    return _hub_tokenizer(ref)


def has_tokenizer(folder: Path) -> bool:
    # exists, not is_file: a folder named tokenizer.json is refused when read, not taken for
    # a folder without a tokenizer (which model.init_from=hf: would silently train on bytes)
    return any((folder / name).exists() for name in (TOKENIZER_JSON, SENTENCEPIECE_MODEL))


def _not_cached(repo_id: str) -> FileNotFoundError:
    what = f"the tokenizer of the Hugging Face model '{repo_id}'"
    return hub.not_cached_error(what, repo_id, TOKENIZER_FILES, "data.tokenizer")


def _hub_tokenizer(repo_id: str) -> Path | None:
    offline = hub.hub_offline()
    what = f"the tokenizer of the Hugging Face model '{repo_id}'"
    with hub.hub_errors_explained(what, repo_id, "data.tokenizer", TOKENIZER_FILES):
        folder = hub.snapshot_files(repo_id, list(TOKENIZER_FILES), offline)
    if has_tokenizer(folder):
        return folder
    if offline:  # a snapshot cached for the weights alone (model.init_from): not downloaded yet
        raise _not_cached(repo_id)
    return None  # the repository has no tokenizer files


def check_tokenizer_source(data_cfg) -> Path | None:
    """For a dry run: data.tokenizer=hf:<hub id> resolved from the cache (offline) or fetched
    (tokenizer files only), hf:<folder> checked to hold a tokenizer; raises the one-line
    FileNotFoundError a run would. None for the other kinds (nothing to check without building)."""
    kind = getattr(data_cfg, "tokenizer", None)
    if not is_hf_tokenizer(kind):
        return None
    return tokenizer_folder(hf_reference(kind))


def tokenizer_files(folder: Path) -> tuple[Path, ...]:
    """The folder's TOKENIZER_FILES that exist, in TOKENIZER_FILES order; one that is not a
    file (a folder of that name) is refused, not left out of what the tokenizer is read from."""
    present = tuple(folder / name for name in TOKENIZER_FILES if (folder / name).exists())
    for path in present:
        if not path.is_file():
            raise unreadable_file(path, None)
    return present


def unreadable_file(path: Path, error: BaseException | str | None) -> ConfigError:
    """The one-line error of a tokenizer file that is there but cannot be read: its path, why
    (error: the reader's exception or a reason) and what to do. A ConfigError: the user's to
    fix, exit 2 in train.py, generate and evaluate."""
    if path.exists() and not path.is_file():
        what = "a folder" if path.is_dir() else "not a regular file"
        return ConfigError(f"tokenizer file {path} is {what}: put the file itself there")
    if isinstance(error, PermissionError):
        return ConfigError(
            f"tokenizer file {path} cannot be read (permission denied): make it readable "
            f"(chmod a+r {path})"
        )
    if isinstance(error, BaseException):
        lines = str(error).strip().splitlines()
        error = lines[0] if lines else type(error).__name__
    reason = f" ({error})" if error else ""
    return ConfigError(
        f"tokenizer file {path} cannot be read{reason}: it is truncated or damaged; fix it, "
        "or copy or download the tokenizer's files again"
    )


def read_text_file(path: Path) -> str:
    """A tokenizer file's UTF-8 text; unreadable, not UTF-8 or empty is unreadable_file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise unreadable_file(path, f"not UTF-8 text: byte {e.start}") from None
    except OSError as e:
        raise unreadable_file(path, e) from None
    if not text.strip():
        raise unreadable_file(path, "it is empty")
    return text


def read_json_object(path: Path) -> dict:
    """A tokenizer file holding one JSON object (tokenizer_config.json, vocab.json, ...)."""
    try:
        config = json.loads(read_text_file(path))
    except json.JSONDecodeError as e:
        raise unreadable_file(path, f"not JSON: {e}") from None
    if not isinstance(config, dict):
        raise unreadable_file(path, f"a JSON {type(config).__name__}, not an object")
    return config


def read_tokenizer_json(path: Path):
    """A tokenizer.json as a `tokenizers` Tokenizer (whose own error names no file)."""
    from tokenizers import Tokenizer as Backend

    text = read_text_file(path)
    try:
        backend = Backend.from_str(text)
    except Exception as e:  # the Rust parser raises a bare Exception
        raise unreadable_file(path, e) from None
    if not backend.get_vocab(with_added_tokens=True):
        raise unreadable_file(path, "it holds no tokens")
    return backend


def read_backend(folder: Path):
    """The folder's tokenizer as a `tokenizers` Tokenizer: tokenizer.json as it is, else
    tokenizer.model converted by transformers' AutoTokenizer (as from_pretrained would)."""
    model = folder / SENTENCEPIECE_MODEL
    if (folder / TOKENIZER_JSON).exists():
        return read_tokenizer_json(folder / TOKENIZER_JSON)
    if not model.exists():
        raise FileNotFoundError(f"{folder} has no {TOKENIZER_JSON} or {SENTENCEPIECE_MODEL}")
    missing = _missing_for_sentencepiece()
    if missing:
        raise ConfigError(  # a config this installation cannot run: a user error, exit 2
            f"{folder} has only a SentencePiece {SENTENCEPIECE_MODEL} (no {TOKENIZER_JSON}); "
            f'reading it needs {" and ".join(missing)}: pip install -e ".[hf]" sentencepiece'
        )
    from transformers import AutoTokenizer

    special_tokens(folder)  # its files checked first: transformers' errors name none of them
    _check_sentencepiece_model(model)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True).backend_tokenizer


def _check_sentencepiece_model(model: Path) -> None:
    """A damaged tokenizer.model is unreadable_file (transformers would try tiktoken on it and
    ask for tiktoken to be installed)."""
    import sentencepiece

    if model.is_file() and not model.stat().st_size:
        raise unreadable_file(model, "it is empty")
    try:
        sentencepiece.SentencePieceProcessor(model_file=str(model))
    except (OSError, RuntimeError) as e:  # RuntimeError: "could not parse ModelProto"
        raise unreadable_file(model, e) from None


def backend_vocab_size(backend) -> int:
    """A `tokenizers` Tokenizer's id count: its highest id + 1, added tokens included (ids
    need not be dense; get_vocab_size may miss added tokens past the model's vocabulary)."""
    return max(backend.get_vocab(with_added_tokens=True).values()) + 1


def _missing_for_sentencepiece() -> list[str]:
    try:
        from transformers.utils import is_sentencepiece_available
    except ImportError:
        return ["transformers", "sentencepiece"]
    return [] if is_sentencepiece_available() else ["sentencepiece"]


# The end-of-text tokens of the common tokenizer families (GPT-2's, and BPEs trained with the
# `tokenizers` library's examples; Llama-2, Mistral and T5's; Llama-3's; Gemma's). A folder whose
# config files name no eos_token (a bare tokenizer.json) ends documents in the one of these among
# its special tokens; with none, or more than one, it is data.eos_token's to say (not guessed).
END_OF_TEXT_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


def special_added_tokens(backend) -> list[str]:
    """The tokens a `tokenizers` Tokenizer holds as special added tokens, in id order."""
    added = backend.get_added_tokens_decoder()
    return [added[i].content for i in sorted(added) if added[i].special]


def recognised_eos(backend) -> str | None:
    """The one END_OF_TEXT_TOKENS entry among the backend's special tokens, else None."""
    found = [t for t in special_added_tokens(backend) if t in END_OF_TEXT_TOKENS]
    return found[0] if len(found) == 1 else None


def no_eos_reason(kind: str, folder: Path, backend) -> str:
    """Why the tokenizer of `folder` (data.tokenizer=`kind`) has no EOS token, and how to name
    one: the start of the one-line error of a run that ends documents in it."""
    specials = special_added_tokens(backend)
    known = [t for t in specials if t in END_OF_TEXT_TOKENS]
    why = (
        f"{' and '.join(known)} are all end-of-text tokens"
        if known
        else f"none of its special tokens is one of {', '.join(END_OF_TEXT_TOKENS)}"
    )
    listed = ", ".join(specials[:12]) + (", ..." if len(specials) > 12 else "") or "none"
    return (
        f"tokenizer {kind} ({folder}) has no EOS token: no tokenizer_config.json or "
        f"special_tokens_map.json names an eos_token, and {why}; name the token that ends a "
        f"document with data.eos_token (its special tokens: {listed})"
    )


def eos_not_in_vocabulary(kind: str, folder: Path, token: str, backend) -> ConfigError:
    """data.eos_token names a token the tokenizer does not have."""
    specials = ", ".join(special_added_tokens(backend)[:12]) or "none"
    return ConfigError(
        f"data.eos_token={token!r} is not a token of tokenizer {kind} ({folder}); name one of "
        f"its tokens, e.g. one of its special tokens: {specials}"
    )


def special_tokens(folder: Path) -> dict[str, str]:
    """{Tokenizer attribute: token} of bos / eos / pad / unk as the folder's
    tokenizer_config.json names them (transformers' precedence), else its
    special_tokens_map.json; a token neither names is absent (Llama has no pad)."""
    found: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if not path.exists():
            continue
        config = read_json_object(path)
        for attribute, key in SPECIAL_KEYS.items():
            token = config.get(key)
            if isinstance(token, dict):  # a serialised AddedToken
                token = token.get("content")
            if isinstance(token, str) and token and attribute not in found:
                found[attribute] = token
    return found
