"""Tokenizer files from the Hugging Face hub, fetched the way the ecosystem does.

    fetch_tokenizer_files("gpt2") -> folder holding vocab.json and merges.txt, or None

The files of `openai-community/gpt2` (or `google-bert/bert-base-uncased`'s vocab.txt) are taken
from the Hugging Face cache when they are there (no network), else downloaded into it with
`huggingface_hub.hf_hub_download`. HF_HUB_OFFLINE=1 forbids the download: the function then
returns None, and the caller raises its own "not found" error saying where to put the files.
A failed download raises HubDownloadError naming the repository, the file and the cause.

`hf:` references (model.init_from, data.tokenizer) are told apart and fetched here too, one way
for both: looks_like_hub_id(ref) for a reference that is not a local folder, and
snapshot_files(repo_id, names, offline) for the cache snapshot holding exactly those files.
"""

from __future__ import annotations

import contextlib
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
    """The Hugging Face hub cache as huggingface_hub itself resolves it (HF_HUB_CACHE, else the
    older HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub): its constants.HF_HUB_CACHE, read at each call. The library
    computes that from the environment once, when it is first imported; so does every tool built
    on it (hf download, transformers' from_pretrained), and this follows it rather than the
    environment, so that all of them in one process look in one cache."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def looks_like_hub_id(ref: str) -> bool:
    """Whether `ref` (not a local folder) can be a hub repository id: "name" or "owner/name"."""
    parts = ref.split("/")
    return (
        len(parts) <= 2
        and all(parts)
        and not ref.startswith((".", "~"))
        and all(p.replace("-", "").replace("_", "").replace(".", "").isalnum() for p in parts)
    )


def snapshot_files(repo_id: str, names: list[str], offline: bool) -> Path:
    """The snapshot folder holding those of `names` the repository has at its top level (exact
    names, no wildcards: nothing else of the repository is fetched); from the cache only when
    offline (huggingface_hub's LocalEntryNotFoundError when it is not there)."""
    from huggingface_hub import snapshot_download

    folder = snapshot_download(
        repo_id, allow_patterns=names, cache_dir=hub_cache_dir(), local_files_only=offline
    )
    return Path(folder)


def not_cached_error(
    what: str, repo_id: str, files: tuple[str, ...], key: str
) -> FileNotFoundError:
    """`what` (e.g. "the Hugging Face model 'x'") is not in the cache and HF_HUB_OFFLINE=1 forbids
    downloading it: one line saying how to fill the cache, or which local folder to name."""
    return _missing(what, repo_id, files, key, "HF_HUB_OFFLINE=1 forbids downloading it")


def _missing(what: str, repo_id: str, files: tuple[str, ...], key: str, why: str):
    names = "".join(f" {name}" for name in files)
    return FileNotFoundError(
        f"{what} is not in the cache {hub_cache_dir()} and {why}; download it where there is "
        f"network (`hf download {repo_id}{names}`; `huggingface-cli download` with "
        f"huggingface_hub < 0.34; the same HF_HOME / HF_HUB_CACHE), then run with "
        f"HF_HUB_OFFLINE=1, or pass a local folder: {key}=hf:/path/to/folder"
    )


@contextlib.contextmanager
def hub_errors_explained(what: str, repo_id: str, key: str, files: tuple[str, ...] = ()):
    """Around snapshot_files calls fetching `what` of hub repository `repo_id`: huggingface_hub's
    errors as one FileNotFoundError line. Not cached, and offline or the hub unreachable: how to
    fill the cache (`files`: the names to download, all when empty) or the local folder to name
    instead (`key`=hf:/path/to/folder); any other failure: its first line."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        yield
    except LocalEntryNotFoundError:
        if hub_offline():
            raise not_cached_error(what, repo_id, files, key) from None
        raise _missing(
            what, repo_id, files, key, "the hub cannot be reached (no network?)"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise FileNotFoundError(
            f"could not download {what} into {hub_cache_dir()}: {type(e).__name__}: {first}; "
            f"or pass a local folder: {key}=hf:/path/to/folder"
        ) from e


def cached_folders(repo_ids: list[str], filenames: tuple[str, ...]) -> list[Path]:
    """The cache folders (each repository's snapshot of its main revision) holding any of
    `filenames`, in order, found with huggingface_hub's own lookup (try_to_load_from_cache):
    files a user fetched with the hub's tools, wherever its environment put the cache."""
    from huggingface_hub import try_to_load_from_cache

    folders: list[Path] = []
    for repo in repo_ids:
        for name in filenames:
            found = try_to_load_from_cache(repo, name, cache_dir=hub_cache_dir())
            if isinstance(found, str) and Path(found).parent not in folders:
                folders.append(Path(found).parent)
    return folders


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
