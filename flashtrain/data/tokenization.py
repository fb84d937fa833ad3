"""Tokenizers: UTF-8 bytes (no files; `byte` for LMs, `byte_mlm` with BERT's special tokens),
GPT-2 byte-level BPE and BERT WordPiece (local files), and any Hugging Face tokenizer folder or
hub id (`hf:<folder or hub id>`: Llama-3's BPE, Llama-2's and Mistral's SentencePiece; found and
read by hf_tokenizer.py).

Every tokenizer has a `name` that pins down exactly what produced a token cache (kind plus a
fingerprint of its vocabulary files); caches record it and refuse to load under another.
The BPE / WordPiece files are looked for in the configured path, in $FLASHTRAIN_TOKENIZERS/<name>/,
in <cache_dir>/tokenizers/<name>/, and in the Hugging Face and tiktoken caches; when absent, GPT-2's
(and bert-base-uncased's) are downloaded into the Hugging Face cache (flashtrain/data/hub.py)
unless HF_HUB_OFFLINE=1, and then the error says what to download and where to put it. A file
found that cannot be read (truncated, empty, a folder) is a one-line ConfigError naming it
(hf_tokenizer.unreadable_file).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from flashtrain.data import hf_tokenizer, hub

# Special tokens as {attribute: token}: a vocabulary file's ids are looked up by the token
# (HFTokenizer); a byte vocabulary appends them after the 256 bytes, in this order (ByteTokenizer).
_GPT2_SPECIALS = {"eos_id": "<|endoftext|>"}
_BERT_SPECIALS = {"pad_id": "[PAD]", "cls_id": "[CLS]", "sep_id": "[SEP]", "mask_id": "[MASK]"}

# byte tokenizer kind -> (name, special tokens): language models need <eos> (documents end in
# it) and <pad>; masked-LM pairs need BERT's four (pieces are cut at a document's end: no <eos>).
BYTE_VOCABS = {
    "byte": ("byte-utf8", {"eos_id": "<eos>", "pad_id": "<pad>"}),
    "byte_mlm": ("byte-utf8-mlm", _BERT_SPECIALS),
}
TOKENIZER_KINDS = (*BYTE_VOCABS, "gpt2", "wordpiece")
TOKENIZER_CHOICES = (*TOKENIZER_KINDS, "hf:<folder or hub id>")  # what data.tokenizer may be

# The files tiktoken caches for its "gpt2" encoding are named by the SHA-1 of their URL.
_TIKTOKEN_GPT2 = {
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
}


class Tokenizer:
    """name, vocab_size, special ids (None when absent) and encode_batch(texts) -> id lists."""

    name: str
    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    mask_id: int | None = None
    unk_id: int | None = None
    files: tuple[Path, ...] = ()  # the vocabulary files it was read from (none for bytes)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    @property
    def special_ids(self) -> list[int]:
        ids = (
            self.bos_id,
            self.eos_id,
            self.pad_id,
            self.cls_id,
            self.sep_id,
            self.mask_id,
            self.unk_id,
        )
        return sorted({i for i in ids if i is not None})


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, then the kind's special tokens (BYTE_VOCABS): kind "byte"
    <eos> = 256, <pad> = 257 (258 ids); kind "byte_mlm" [PAD] [CLS] [SEP] [MASK] = 256..259
    (260 ids)."""

    def __init__(self, kind: str = "byte"):
        self.name, specials = BYTE_VOCABS[kind]
        self.vocab_size = 256 + len(specials)
        for offset, attribute in enumerate(specials):
            setattr(self, attribute, 256 + offset)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _fingerprint(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(path.read_bytes())
        except OSError as e:  # unreadable (permissions): one line naming the file
            raise hf_tokenizer.unreadable_file(path, e) from None
    return digest.hexdigest()[:10]


class HFTokenizer(Tokenizer):
    """A `tokenizers` (Rust) tokenizer with the special ids looked up by their token strings."""

    def __init__(self, backend, name: str, specials: dict[str, str], files: tuple[Path, ...] = ()):
        self.backend = backend
        self.name = name
        self.files = files  # the vocabulary files its name's fingerprint covers
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        for attribute, token in specials.items():
            token_id = backend.token_to_id(token)
            if token_id is None:  # e.g. a tokenizer_config.json of another tokenizer
                read_from = ", ".join(str(f) for f in files) or "no files"
                raise ValueError(
                    f"tokenizer '{name}' (read from {read_from}) has no {token} token (needed "
                    f"as {attribute}): they are not all this tokenizer's own files; copy or "
                    "download its files again"
                )
            setattr(self, attribute, token_id)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.backend.decode(list(ids))


class HFFolderTokenizer(HFTokenizer):
    """data.tokenizer=hf:<folder or hub id>: a Hugging Face tokenizer folder's tokenizer, as
    from_pretrained encodes: with its own special tokens (Llama's post-processor puts
    <|begin_of_text|> / <s> first; GPT-2's adds none). name = "hf:" + a fingerprint of the
    folder's tokenizer files' contents (not their path); vocab_size = highest id + 1, added
    tokens included. Special ids: bos / eos / pad / unk as its tokenizer_config.json names them
    (None when it names none: Llama has no pad, and none is needed: LM windows are packed).
    The EOS: `eos_token` (data.eos_token) when given, else the config's, else the one
    end-of-text special token it holds (hf_tokenizer.recognised_eos); an EOS other than the
    folder's own is in the name ("-eos<id>"), as it changes the token caches."""

    def __init__(self, ref: str, eos_token: str | None = None):
        folder = hf_tokenizer.tokenizer_folder(ref)
        files = hf_tokenizer.tokenizer_files(folder)
        backend = hf_tokenizer.read_backend(folder)
        specials = hf_tokenizer.special_tokens(folder)
        own_eos = specials.get("eos_id") or hf_tokenizer.recognised_eos(backend)
        name = f"hf:{_fingerprint(list(files))}"
        if eos_token is not None:
            if backend.token_to_id(eos_token) is None:
                raise hf_tokenizer.eos_not_in_vocabulary(f"hf:{ref}", folder, eos_token, backend)
            if eos_token != own_eos:
                name += f"-eos{backend.token_to_id(eos_token)}"
        eos = eos_token or own_eos
        if eos is not None:
            specials["eos_id"] = eos
        super().__init__(backend, name, specials, files)
        self.vocab_size = hf_tokenizer.backend_vocab_size(backend)
        self.folder = folder
        self.eos_token = eos
        # what a run that needs an EOS is refused with (no_eos_error)
        self.no_eos = None if eos else hf_tokenizer.no_eos_reason(f"hf:{ref}", folder, backend)
        # Documents get their <eos> from the corpus (eos_policy=append), as with gpt2; a
        # post-processor that appends it too (add_eos_token) would end them in two.
        probe = backend.encode("a", add_special_tokens=True).ids
        self._drops_last = self.eos_id is not None and probe[-1:] == [self.eos_id]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encoded = self.backend.encode_batch(list(texts), add_special_tokens=True)
        return [e.ids[:-1] if self._drops_last else e.ids for e in encoded]


def load_hf_tokenizer(kind: str, eos_token: str | None = None) -> HFFolderTokenizer:
    """The tokenizer data.tokenizer=hf:<folder or hub id> names (hf_tokenizer.py finds it);
    eos_token: data.eos_token."""
    return HFFolderTokenizer(hf_tokenizer.hf_reference(kind), eos_token)


def no_eos_error(tokenizer: Tokenizer, alternative: str = "") -> ValueError:
    """The error of a run that ends documents in EOS with a tokenizer that has none: what is
    missing and how to name it (an hf: folder's special tokens), then `alternative`."""
    reason = getattr(tokenizer, "no_eos", None) or f"tokenizer '{tokenizer.name}' has no EOS token"
    return ValueError(f"{reason}{'; ' if alternative else ''}{alternative}")


def _search_dirs(
    explicit: str | None,
    local_name: str,
    cache_root: Path,
    hub_repos: list[str],
    hub_files: tuple[str, ...],
):
    """Where a vocabulary is looked for, in order; last the Hugging Face cache's snapshots of
    `hub_repos` holding any of `hub_files` (hub.cached_folders)."""
    dirs = []
    if explicit:
        dirs.append(Path(explicit).expanduser())
    if os.environ.get("FLASHTRAIN_TOKENIZERS"):
        dirs.append(Path(os.environ["FLASHTRAIN_TOKENIZERS"]) / local_name)
    dirs.append(Path(cache_root) / "tokenizers" / local_name)
    return dirs + hub.cached_folders(hub_repos, hub_files)


def _gpt2_from_tokenizer_json(path: Path) -> HFTokenizer:
    backend = hf_tokenizer.read_tokenizer_json(path)
    return HFTokenizer(backend, f"gpt2-bpe-{_fingerprint([path])}", _GPT2_SPECIALS, (path,))


def _bpe_model(vocab: Path, merges: Path):
    """The BPE of a vocab.json + merges.txt pair; a file that cannot be read is named."""
    from tokenizers import models

    hf_tokenizer.read_json_object(vocab)  # the library's error would name neither file
    hf_tokenizer.read_text_file(merges)
    try:
        return models.BPE.from_file(str(vocab), str(merges))
    except Exception as e:  # the Rust reader raises a bare Exception
        raise hf_tokenizer.unreadable_file(merges, e) from None


def _gpt2_from_bpe_files(vocab: Path, merges: Path) -> HFTokenizer:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, pre_tokenizers

    backend = Backend(_bpe_model(vocab, merges))
    # GPT-2 splits text with its regex, on raw bytes mapped to printable characters.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    name = f"gpt2-bpe-{_fingerprint([vocab, merges])}"
    return HFTokenizer(backend, name, _GPT2_SPECIALS, (vocab, merges))


def load_gpt2(
    explicit_path: str | None = None, cache_root: Path = Path("data_cache")
) -> HFTokenizer:
    """GPT-2 byte-level BPE (50257 ids, <|endoftext|> = 50256) from local files: tokenizer.json,
    or vocab.json + merges.txt, or tiktoken's cached encoder.json + vocab.bpe."""
    repos, files = ["openai-community/gpt2", "gpt2"], ("vocab.json", "merges.txt", "tokenizer.json")
    dirs = _search_dirs(explicit_path, "gpt2", cache_root, repos, files)
    for d in dirs:
        if d.is_file() and d.suffix == ".json":  # an explicit tokenizer.json
            return _gpt2_from_tokenizer_json(d)
        for vocab, merges in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
            if (d / vocab).is_file() and (d / merges).is_file():
                return _gpt2_from_bpe_files(d / vocab, d / merges)
        if (d / "tokenizer.json").is_file():
            return _gpt2_from_tokenizer_json(d / "tokenizer.json")

    gym = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    tiktoken_dir = Path(gym) if gym else Path(tempfile.gettempdir()) / "data-gym-cache"
    encoder, bpe = (
        tiktoken_dir / hashlib.sha1(u.encode()).hexdigest() for u in _TIKTOKEN_GPT2.values()
    )
    if encoder.is_file() and bpe.is_file():
        return _gpt2_from_bpe_files(encoder, bpe)
    folder = hub.fetch_tokenizer_files("gpt2")  # downloads unless HF_HUB_OFFLINE is set
    if folder is not None:
        return _gpt2_from_bpe_files(folder / "vocab.json", folder / "merges.txt")

    looked = "\n  ".join(str(d) for d in dirs + [tiktoken_dir])
    raise FileNotFoundError(
        "GPT-2 BPE files not found (and HF_HUB_OFFLINE is set, so none were downloaded). Looked in:\n  "
        f"{looked}\nDownload vocab.json and merges.txt (or tokenizer.json) of the Hugging Face model "
        f"'openai-community/gpt2' into {Path(cache_root) / 'tokenizers' / 'gpt2'}/ "
        "(or any folder named by data.tokenizer_path or $FLASHTRAIN_TOKENIZERS/gpt2/)."
    )


def load_wordpiece(
    explicit_path: str | None = None,
    cache_root: Path = Path("data_cache"),
    local_name: str = "bert-base-uncased",
    lowercase: bool = True,
) -> HFTokenizer:
    """BERT WordPiece from a local vocab.txt (a file path or a folder holding one)."""
    repos = [f"google-bert/{local_name}", local_name]
    dirs = _search_dirs(explicit_path, local_name, cache_root, repos, ("vocab.txt",))
    candidates = [d if d.is_file() else d / "vocab.txt" for d in dirs]
    if local_name in hub.HUB_TOKENIZERS and not any(p.is_file() for p in candidates):
        folder = hub.fetch_tokenizer_files(local_name)  # downloads unless HF_HUB_OFFLINE is set
        candidates += [folder / "vocab.txt"] if folder is not None else []
    for path in candidates:
        if path.is_file():
            backend = _wordpiece(path, lowercase)
            case = "uncased" if lowercase else "cased"
            specials = _BERT_SPECIALS | {"unk_id": "[UNK]"}
            name = f"wordpiece-{case}-{_fingerprint([path])}"
            return HFTokenizer(backend, name, specials, (path,))
    looked = "\n  ".join(str(d) for d in dirs)
    raise FileNotFoundError(
        "WordPiece vocab.txt not found (and none was downloaded: HF_HUB_OFFLINE=1 or not a hub model). Looked in:\n  "
        f"{looked}\nDownload vocab.txt of the Hugging Face model 'google-bert/{local_name}' into "
        f"{Path(cache_root) / 'tokenizers' / local_name}/ (or set data.tokenizer_path)."
    )


def _wordpiece(vocab: Path, lowercase: bool):
    """BERT's WordPiece of a vocab.txt; a file that cannot be read is named."""
    from tokenizers import BertWordPieceTokenizer

    hf_tokenizer.read_text_file(vocab)  # empty, not UTF-8, unreadable: the library names no file
    try:
        return BertWordPieceTokenizer(str(vocab), lowercase=lowercase)
    except Exception as e:  # no [SEP] / [CLS] token: not a BERT vocabulary
        raise hf_tokenizer.unreadable_file(vocab, e) from None


def build_tokenizer(cfg, cache_root: Path) -> Tokenizer:
    """The tokenizer a corpus config (data.config.CorpusConfig) names: TOKENIZER_KINDS or
    hf:<folder or hub id>."""
    if hf_tokenizer.is_hf_tokenizer(cfg.tokenizer):
        return load_hf_tokenizer(cfg.tokenizer, getattr(cfg, "eos_token", None))
    if cfg.tokenizer in BYTE_VOCABS:
        return ByteTokenizer(cfg.tokenizer)
    if cfg.tokenizer == "gpt2":
        return load_gpt2(cfg.tokenizer_path, cache_root)
    if cfg.tokenizer == "wordpiece":
        return load_wordpiece(cfg.tokenizer_path, cache_root, cfg.tokenizer_name, cfg.lowercase)
    raise ValueError(
        f"unknown tokenizer '{cfg.tokenizer}'; allowed: {', '.join(TOKENIZER_CHOICES)}"
    )
