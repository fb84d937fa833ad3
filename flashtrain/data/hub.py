"""Tokenizer files from the Hugging Face hub, fetched the way the ecosystem does.

    fetch_tokenizer_files("gpt2") -> folder holding vocab.json and merges.txt, or None

The files of `openai-community/gpt2` (or `google-bert/bert-base-uncased`'s vocab.txt) are taken
from the Hugging Face cache when they are there (no network), else downloaded into it with
`huggingface_hub.hf_hub_download`. HF_HUB_OFFLINE=1 forbids the download: the function then
returns None, and the caller raises its own "not found" error saying where to put the files.
A failed download raises HubDownloadError naming the repository, the file and the cause.
"""

from __future__ import annotations

import os
from pathlib import Path

# local name -> (hub repository, the files the tokenizer code reads)
HUB_TOKENIZERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpt2": ("openai-community/gpt2", ("vocab.json", "merges.txt")),
    "bert-base-uncased": ("google-bert/bert-base-uncased", ("vocab.txt",)),
}
_TRUE = ("1", "ON", "YES", "TRUE")  # huggingface_hub's spelling of a true environment flag


class HubDownloadError(FileNotFoundError):
    """A tokenizer file could not be downloaded from the hub (network, permissions, missing)."""


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, looked up now (not at import time)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home).expanduser() / "hub"


def _hub_entry(name: str) -> tuple[str, tuple[str, ...]]:
    if name not in HUB_TOKENIZERS:
        raise ValueError(f"no hub tokenizer '{name}'; known: {', '.join(HUB_TOKENIZERS)}")
    return HUB_TOKENIZERS[name]


def cached_tokenizer_files(name: str) -> Path | None:
    """The cache snapshot folder holding all of the tokenizer's files, or None (no network)."""
    from huggingface_hub import try_to_load_from_cache

    repo, files = _hub_entry(name)
    found = [try_to_load_from_cache(repo, f, cache_dir=hub_cache_dir()) for f in files]
    if not all(isinstance(p, str) for p in found):
        return None
    folder = Path(found[0]).parent
    return folder if all(Path(p).parent == folder for p in found) else None


def fetch_tokenizer_files(name: str) -> Path | None:
    """The folder holding the tokenizer's files: from the cache, else downloaded into it.
    None when they are not cached and HF_HUB_OFFLINE is set."""
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    cached = cached_tokenizer_files(name)
    if cached is not None or hub_offline():
        return cached
    repo, files = _hub_entry(name)
    paths = []
    for filename in files:
        try:
            paths.append(huggingface_hub.hf_hub_download(repo, filename, cache_dir=hub_cache_dir()))
        except (HfHubHTTPError, OSError, ValueError) as e:
            raise HubDownloadError(
                f"could not download {filename} of the Hugging Face model '{repo}' into "
                f"{hub_cache_dir()}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                "\nWith no network, set HF_HUB_OFFLINE=1 and put the files in a folder named by "
                "data.tokenizer_path."
            ) from e
    folders = {Path(p).parent for p in paths}
    if len(folders) != 1:
        raise HubDownloadError(
            f"the files of '{repo}' came from different revisions ({sorted(map(str, folders))}): "
            "the repository changed during the download; run again"
        )
    return folders.pop()
