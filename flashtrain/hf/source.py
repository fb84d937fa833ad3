"""Reading a transformers checkpoint: a local folder or a hub id, its config.json and weights.

    folder = resolve_source("openai-community/gpt2")   # or a local folder
    config, tensors = read_config(folder), open_weights(folder)   # tensors read when indexed

A hub id downloads through huggingface_hub into its cache: config.json and the weights the model
reads (model.safetensors, or the index and exactly the shards it names; pytorch_model.bin alike
when a repository has no safetensors), nothing else of the repository. HF_HUB_OFFLINE=1 forbids
that: a cached snapshot is used, and a missing one is one clear FileNotFoundError saying how to
get it. Weights: model.safetensors, its sharded form (model.safetensors.index.json), or
pytorch_model.bin (memory-mapped, weights_only). Needs safetensors for .safetensors files; never
transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from flashtrain.data import hub

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"


def resolve_source(ref: str, *, weights: bool = True) -> Path:
    """A local folder holding config.json, or the hub snapshot folder of hub id `ref`.
    weights=False: the config alone (a dry run checks that the source is there and fits the
    model; it reads no weights, and a hub id downloads config.json only)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / CONFIG).is_file():
            raise FileNotFoundError(
                f"{path} is not a Hugging Face model folder: it has no {CONFIG} "
                "(export a flashtrain checkpoint with scripts/export_hf.py)"
            )
        return path
    if not hub.looks_like_hub_id(ref):
        raise FileNotFoundError(f"no such folder {path}, and {ref!r} is not a hub model id")
    return _hub_snapshot(ref, weights)


def _hub_snapshot(repo_id: str, weights: bool) -> Path:
    offline = hub.hub_offline()
    what = f"the Hugging Face model '{repo_id}'"
    with hub.hub_errors_explained(what, repo_id, "model.init_from"):
        if weights:
            folder = _weights_snapshot(repo_id, offline)
        else:
            folder = hub.snapshot_files(repo_id, [CONFIG], offline)
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(f"{what} has no {CONFIG}")
    return folder


def _weights_snapshot(repo_id: str, offline: bool) -> Path:
    """config.json and the weights the model reads, nothing else of the repository."""
    folder = hub.snapshot_files(repo_id, [CONFIG, SAFETENSORS, SAFETENSORS_INDEX], offline)
    if not any((folder / n).is_file() for n in (SAFETENSORS, SAFETENSORS_INDEX)):
        # an older repository: PyTorch pickles only
        folder = hub.snapshot_files(repo_id, [CONFIG, TORCH_BIN, TORCH_BIN_INDEX], offline)
    for index in (SAFETENSORS_INDEX, TORCH_BIN_INDEX):
        if (folder / index).is_file():  # sharded: exactly the shards its weight_map names
            return hub.snapshot_files(
                repo_id, [CONFIG, index, *_shard_files(folder / index)], offline
            )
    return folder


def _shard_files(index: Path) -> list[str]:
    with open(index) as f:
        return sorted(set(json.load(f)["weight_map"].values()))


def read_config(folder: Path) -> dict:
    with open(Path(folder) / CONFIG) as f:
        return json.load(f)


def open_weights(folder: Path) -> dict[str, torch.Tensor | SafetensorsView]:
    """Every tensor of the folder's weights by transformers key, unread: safetensors as views
    that read only what is indexed, PyTorch pickles memory-mapped (a slice copied reads only
    its pages). A rank filling its FSDP2 shards reads its rows and nothing else."""
    folder = Path(folder)
    for index_name in (SAFETENSORS_INDEX, TORCH_BIN_INDEX):
        if (folder / index_name).is_file():
            tensors = {}
            for name in _shard_files(folder / index_name):
                tensors.update(_open_file(folder / name))
            return tensors
    for name in (SAFETENSORS, TORCH_BIN):
        if (folder / name).is_file():
            return _open_file(folder / name)
    raise FileNotFoundError(
        f"{folder} holds no weights ({SAFETENSORS}, {SAFETENSORS_INDEX} or {TORCH_BIN})"
    )


class SafetensorsView:
    """One tensor of a safetensors file, read only where indexed: view[a:b], view[:, a:b]."""

    def __init__(self, file, key: str):
        self._slice = file.get_slice(key)
        self.shape = torch.Size(self._slice.get_shape())
        self.dtype = _SAFETENSORS_DTYPES[self._slice.get_dtype()]

    def __getitem__(self, index) -> torch.Tensor:
        if self.shape and isinstance(index, slice) and index == slice(None):
            index = slice(0, self.shape[0])
        return self._slice[index]


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def _open_file(path: Path) -> dict[str, torch.Tensor | SafetensorsView]:
    """The file's tensors, unread; a file the reader cannot take (cut short by an interrupted
    download or copy, overwritten) is a ValueError naming it and what to do."""
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open
        except ImportError:
            raise ImportError(
                f"reading {path.name} needs safetensors: pip install -e '.[hf]'"
            ) from None
    try:
        if path.suffix != ".safetensors":
            return _torch_load(path)
        file = safe_open(str(path), framework="pt", device="cpu")
        return {key: SafetensorsView(file, key) for key in file.keys()}  # noqa: SIM118
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - SafetensorError, a zip or mmap error: one answer
        raise DamagedWeightsError(path, e) from e


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
        # a legacy (pre-zip) pickle, as old hub repositories hold, cannot be mapped: read whole
        return torch.load(path, map_location="cpu", weights_only=True)


class DamagedWeightsError(ValueError):
    """A weights file its reader refuses: truncated or damaged."""

    def __init__(self, path: Path, error: BaseException):
        reason = str(error).splitlines()[0] if str(error).strip() else ""
        super().__init__(
            f"{path} is truncated or damaged ({type(error).__name__}: {reason}); download it "
            "again (a hub model: `hf download REPO_ID --force-download`) or, for a folder "
            "scripts/export_hf.py wrote, export the checkpoint again"
        )
