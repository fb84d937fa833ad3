"""What a weights reference names, opened: a trainer checkpoint, a torch file or a transformers
checkpoint, each read as the model's tensors a row range at a time (models/materialize.py's
RowSource), so a rank reads the rows of its shards and no more.

    source = open_source("runs/a")            # a run, its checkpoints folder or a step folder
    source = open_source("hf:gpt2")           # a transformers folder or hub id
    source = open_source("init.pt")           # a state dict (or a trainer's model_optim.pt)
    source.model_config()                     # the model it holds (not for a bare torch file)
    rows = source.rows_for(cfg, model)        # -> RowSource for fill_from

Trainer checkpoints are checked against their checksums first, under torchrun on rank 0 once;
their "torch" files are memory-mapped (a slice copied reads its pages), their "dcp" shards read
through torch.distributed.checkpoint into targets shaped like the rows asked for.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch.distributed.tensor import DTensor

from flashtrain.checkpoint.manifest import META, CheckpointError
from flashtrain.checkpoint.read import (
    CONFIG,
    MODEL_OPTIM,
    ROUTE_ONLY_FIELDS,
    UnverifiedCheckpointError,
    dcp_model_entries,
    model_config_misfit,
    read_meta,
    resolved_on_rank_0,
    torch_load,
)
from flashtrain.data.hf_tokenizer import HF_PREFIX
from flashtrain.hf.mapping import HFRows
from flashtrain.hf.registry import mapping_for, mapping_for_hf
from flashtrain.hf.source import open_weights, read_config, resolve_source

# What a run started from saved weights may change besides what a resume may (ROUTE_ONLY_FIELDS:
# how it computes, the context): dropout, the context extension (rope_scaling, as on the hf:
# path), the head trained on top (its tensors' shapes are checked one by one), and what only
# derives a compared field (multiple_of, ffn_dim_multiplier: d_ff) or pads rows never used.
INIT_FROM_FREE_FIELDS = ROUTE_ONLY_FIELDS | {
    "dropout",
    "attn_dropout",
    "rope_scaling",
    "head",
    "num_classes",
    "pad_vocab_multiple",
    "multiple_of",
    "ffn_dim_multiplier",
}


def open_source(ref: str | os.PathLike, *, collective: bool = False, on_note=None) -> WeightSource:
    """The weights `ref` names: "hf:PATH_OR_ID", a folder holding trainer checkpoints (a run
    directory, its checkpoints folder: the newest intact one; a step folder), or a torch file.
    collective: every rank of the process group opens it (model.init_from): rank 0 checks the
    checkpoint once. on_note(line): told of each damaged newer checkpoint passed over
    (default: a warning in the log)."""
    ref = str(ref)
    if ref.startswith(HF_PREFIX):
        return HFSource(ref[len(HF_PREFIX) :])
    path = Path(ref).expanduser()
    if path.is_dir():
        return TrainerSource(path, collective=collective, on_note=on_note)
    if path.is_file():
        return TorchFileSource(path)
    raise FileNotFoundError(
        f"{ref}: no such file or folder (a trainer checkpoint folder, a torch state-dict file, "
        f"or hf:PATH_OR_ID for a transformers checkpoint)"
    )


def check_source(ref: str | os.PathLike, cfg) -> str:
    """What a dry run checks of model.init_from without reading any weights: that the source is
    there (an hf: hub id in the cache, or its config.json downloaded; a path that exists) and,
    for a transformers checkpoint, that it fits the configured model. Returns what was found."""
    ref = str(ref)
    if ref.startswith(HF_PREFIX):
        source = HFSource(ref[len(HF_PREFIX) :], weights=False)
        source.check_model(cfg)
        return f"{source.description} ({source.folder})"
    if not Path(ref).expanduser().exists():
        open_source(ref)  # its FileNotFoundError says what model.init_from may name
    return ref


class WeightSource:
    """What every source answers; the subclasses below read one kind each."""

    description: str
    optional_prefixes: tuple[str, ...] = ()  # model tensors it may lack (they keep their init)
    longer_positions = "resize"  # a longer 1-D position table: "resize" or take the "first" rows

    def model_config(self) -> dict:
        """The model config the weights were saved with (flashtrain fields)."""
        raise ValueError(f"{self.description} records no model config: name a checkpoint folder")

    def attention_config(self) -> Any:
        """The attention config a model built from it runs with by default."""
        return "reference"

    def check_model(self, cfg) -> None:
        """Refuse, naming the field, a configured model the weights cannot mean the same in."""

    def rows_for(self, cfg, model: torch.nn.Module):
        """A RowSource over the tensors, by the model's state-dict names."""
        raise NotImplementedError

    def facts(self) -> dict:
        """What CheckpointInfo records of it (step, meta, run config, run directory)."""
        return {"source": self.description}


def check_saved_model_config(description: str, saved: dict | None, cfg) -> None:
    """Refuse weights whose saved model config differs from `cfg` (a model config dataclass)
    in a field that changes what they compute, naming each and both values: n_head over the
    same tensor shapes would reinterpret every weight. saved: None when not recorded (a bare
    state dict), which only the tensor shapes can be checked against."""
    misfit = model_config_misfit(saved, dataclasses.asdict(cfg), INIT_FROM_FREE_FIELDS)
    if misfit:
        changes, settings = misfit
        raise ValueError(
            f"{description} does not fit this model: {changes}; its weights mean something "
            f"else under these settings. To start from it, set {settings}"
        )


class TrainerSource(WeightSource):
    """A checkpoint this trainer wrote (checkpoint/write.py), in either format."""

    def __init__(self, path: Path, *, collective: bool, on_note=None):
        try:
            step_dir = resolved_on_rank_0(path, collective=collective, on_skip=on_note)
        except UnverifiedCheckpointError as e:
            raise CheckpointError(
                f"{path}: the checkpoint has no checksums (an older format), so its files "
                f"cannot be checked before loading; if you trust it, name its {MODEL_OPTIM} "
                f"file instead (torch format; loaded as it is, unchecked)"
            ) from e
        self.path = step_dir
        self.meta = read_meta(step_dir)
        self.description = f"checkpoint {step_dir}"
        config = step_dir / CONFIG
        self.run_config = OmegaConf.load(config) if config.is_file() else None

    def model_config(self) -> dict:
        if self.meta.get("model_config"):
            return dict(self.meta["model_config"])
        if self.run_config is not None and "model" in self.run_config:
            return OmegaConf.to_container(self.run_config.model, resolve=True)
        raise CheckpointError(f"checkpoint {self.path} records no model_config in its meta.json")

    def check_model(self, cfg) -> None:
        saved = self.meta.get("model_config")
        if not saved and self.run_config is not None and "model" in self.run_config:
            saved = OmegaConf.to_container(self.run_config.model, resolve=True)
        check_saved_model_config(self.description, saved, cfg)

    def attention_config(self) -> Any:
        if self.run_config is not None and "attention" in self.run_config:
            return OmegaConf.to_container(self.run_config.attention, resolve=True)
        return "reference"

    def rows_for(self, cfg, model):
        fmt = self.meta["format"]
        if fmt == "torch":
            state = torch_load(self.path / MODEL_OPTIM, weights_only=True, mmap=True)
            if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
                raise CheckpointError(
                    f"checkpoint {self.path} is corrupt: {MODEL_OPTIM} lacks model"
                )
            return TensorRows(self.description, state["model"])
        if fmt == "dcp":
            return DCPRows(self.description, self.path)
        raise CheckpointError(f"checkpoint {self.path} has unknown format {fmt!r}")

    def facts(self) -> dict:
        return {
            "source": self.description,
            "path": self.path,
            "step": int(self.meta["step"]),
            "meta": self.meta,
            "run_config": self.run_config,
        }


class TorchFileSource(WeightSource):
    """A torch file holding a state dict, or a trainer's model_optim.pt (read unchecked; its
    step folder's meta.json, when there, says the model config it was saved with)."""

    def __init__(self, path: Path):
        self.path = path
        self.description = f"torch file {path}"

    def check_model(self, cfg) -> None:
        check_saved_model_config(self.description, self._saved_model_config(), cfg)

    def _saved_model_config(self) -> dict | None:
        if self.path.name != MODEL_OPTIM or not (self.path.parent / META).is_file():
            return None  # a bare state dict records no config
        try:
            return read_meta(self.path.parent).get("model_config")
        except CheckpointError:
            return None  # read unchecked, as the file itself is

    def rows_for(self, cfg, model):
        try:
            try:
                state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                # a legacy (pre-zip) file cannot be mapped: read it whole
                state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - not a torch file, a bad pickle
            raise ValueError(f"{self.path} is not a torch state-dict file: {e}") from e
        if isinstance(state, dict) and isinstance(state.get("model"), dict):
            state = state["model"]  # a trainer checkpoint's model_optim.pt
        if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
            raise ValueError(f"{self.path} holds no state dict (name -> tensor)")
        return TensorRows(self.description, state)


class HFSource(WeightSource):
    """A transformers checkpoint: a local folder or a hub id (hf/source.py), its weights
    mapped by the architecture's rules (hf/mapping.py) a row range at a time."""

    longer_positions = "first"  # a shorter context runs the first positions, as transformers does

    def __init__(self, ref: str, *, weights: bool = True):
        self.ref = ref
        self.description = f"hf:{ref}"
        self.folder = resolve_source(ref, weights=weights)  # weights=False: config.json alone
        self.hf_config = read_config(self.folder)

    def model_config(self) -> dict:
        mapping = mapping_for_hf(self.hf_config, self.description)
        return mapping.config_from_hf(self.hf_config)

    def attention_config(self) -> Any:
        return "flash"

    def check_model(self, cfg) -> None:
        mapping = mapping_for(cfg)
        if self.hf_config.get("model_type") not in mapping.model_types:
            raise ValueError(
                f"model.arch={cfg.arch} but the Hugging Face checkpoint {self.description} has "
                f"model_type={self.hf_config.get('model_type')!r} (model.arch={cfg.arch} loads "
                f"model_type {' or '.join(repr(t) for t in mapping.model_types)})"
            )
        mapping.check_architecture(self.hf_config, cfg, self.description)

    def rows_for(self, cfg, model):
        mapping = mapping_for(cfg)
        self.optional_prefixes = mapping.optional(cfg)
        tensors = open_weights(self.folder)
        return HFRows(
            self.description, mapping.import_plan(tensors.keys(), cfg, self.description), tensors
        )


class TensorRows:
    """RowSource over a dict of tensors (memory-mapped ones read only the rows copied)."""

    def __init__(self, description: str, tensors: dict[str, torch.Tensor]):
        self.description, self.tensors = description, tensors

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.tensors.items() if torch.is_tensor(v)}

    def rows(self, name: str, start: int, stop: int, placed=None) -> torch.Tensor:
        return self.tensors[name][start:stop]

    def check_rows(self, held) -> None:
        pass


class DCPRows:
    """RowSource over a "dcp" checkpoint's model entries (FSDP2's sharded format). A rank's
    rows of a sharded parameter are read into a DTensor target placed like it, so
    torch.distributed.checkpoint reads those chunks only; no collective (each rank alone)."""

    def __init__(self, description: str, path: Path):
        self.description, self.path = description, path
        self.entries = dcp_model_entries(path)
        self.reader = None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(md.size) for name, md in self.entries.items()}

    def rows(self, name: str, start: int, stop: int, placed=None) -> torch.Tensor:
        md = self.entries[name]
        dtype = md.properties.dtype
        full = (start, stop) == (0, md.size[0] if len(md.size) else 1)
        if full or not isinstance(placed, DTensor) or tuple(placed.shape) != tuple(md.size):
            target = torch.empty(tuple(md.size), dtype=dtype)
            self._load({name: target})
            return target[start:stop]
        # on the parameter's device: DTensor.from_local moves a tensor to its mesh's device
        # type, and the tensor read into must be the one returned
        held = placed.to_local()
        local = torch.empty(held.shape, dtype=dtype, device=held.device)
        target = DTensor.from_local(
            local, placed.device_mesh, placed.placements, run_check=False,
            shape=placed.shape, stride=placed.stride(),
        )  # fmt: skip
        self._load({name: target})
        return target.to_local()

    def _load(self, model_state: dict) -> None:
        import torch.distributed.checkpoint as dcp

        if self.reader is None:  # one reader for every tensor: its metadata read once
            self.reader = dcp.FileSystemReader(str(self.path))
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load({"model": model_state}, storage_reader=self.reader, no_dist=True)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"checkpoint {self.path} is corrupt or incomplete: {e}") from e

    def check_rows(self, held) -> None:
        pass
