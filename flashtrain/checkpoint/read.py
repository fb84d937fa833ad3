"""Checkpoints: what one is, finding, checking and reading it (writing one: write.py).

Layout of one checkpoint (a directory under the run's checkpoints/ folder):

    step_000200/
        meta.json      step, format, world size, strategy, parameter count, model config,
                       `tokenizer` (its name, which fingerprints its files, and id count),
                       and `files`: the size and SHA-256 of every other file (manifest.py);
                       written last, so a directory without it is not a checkpoint
        config.yaml    the resolved config of the run that wrote it
        trainer.pt     scheduler, grad scaler, step, tokens seen, per-rank RNG and data positions
        model_optim.pt model + optimizer state (format "torch": single process and DDP), or
        *.distcp, .metadata   the same, sharded, through torch.distributed.checkpoint (format
                       "dcp": FSDP2; every rank writes its own shards)
    latest             the name of the newest checkpoint
    abandoned/<when>/step_...   the checkpoints a branch (a resume from an older step) left:
                       kept whole, outside every lookup below (write.set_aside_newer_checkpoints)

Loading checks every file against the checksums first; `resume=auto` passes over a damaged
checkpoint to the newest intact one, as do the commands after training (export, generate,
evaluate, model.init_from: resolve_checkpoint) named a run or its checkpoints folder; a damaged
step folder named explicitly is refused. Model and optimizer state go through
torch.distributed.checkpoint.state_dict (parameter names as keys, wrapper prefixes removed), so
either format loads into single, DDP or FSDP2 runs.
The model's weights alone (model.init_from, load_model) are read by sources.py, a row range at
a time, from either format.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from flashtrain.checkpoint.manifest import (
    META,
    CheckpointError,
    is_verified,
    unlisted_files,
    verify_files,
)
from flashtrain.collectives import broadcast_object, gather_objects, is_main_process
from flashtrain.file_integrity import ALGORITHM
from flashtrain.models.materialize import shape_misfits

log = logging.getLogger("flashtrain.checkpoint")

CKPT_RE = re.compile(r"^step_(\d+)$")
TRAINER_STATE = "trainer.pt"
MODEL_OPTIM = "model_optim.pt"
CONFIG = "config.yaml"
FORMAT_VERSION = 2  # 2: meta.json lists every file's size and checksum; 1: no checksums


class UnverifiedCheckpointError(CheckpointError):
    """A checkpoint without checksums, and no trainer.allow_unverified_checkpoint."""


class FutureCheckpointError(CheckpointError):
    """A checkpoint in a format version newer than this code reads."""


@dataclass(frozen=True)
class StoredCheckpoint:
    step: int
    path: Path


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_step(path: Path) -> int:
    return int(CKPT_RE.match(path.name).group(1))


def find_checkpoints(root: str | os.PathLike) -> list[StoredCheckpoint]:
    """Complete checkpoints under `root` (those with a meta.json), oldest first: its top level
    only, so the lines a branch set aside (abandoned/) are never among them."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = CKPT_RE.match(entry.name)
        if m and entry.is_dir() and (entry / META).is_file():
            found.append(StoredCheckpoint(int(m.group(1)), entry))
    return sorted(found, key=lambda c: c.step)


def resolve_resume(
    resume: str | None, root: str | os.PathLike, *, allow_unverified: bool = False
) -> Path | None:
    """The checkpoint directory `trainer.resume` points at, its files checked against their
    checksums (one without checksums only with allow_unverified).

    None -> None; "auto" -> the newest intact checkpoint under `root` (a damaged newer one is
    passed over with a warning naming it), or None when there is none; a path -> that
    checkpoint, or the newest one inside it when it is a checkpoints folder, refused with a
    CheckpointError naming the damaged file when it does not verify.
    """
    if resume is None or str(resume).lower() in ("", "none", "null", "false"):
        return None
    if str(resume) == "auto":
        return _newest_intact(root, allow_unverified)
    path = Path(resume).expanduser()
    if (path / META).is_file():
        verify_checkpoint(path, allow_unverified=allow_unverified)
        return path
    if path.is_dir():
        found = find_checkpoints(path)
        if found:
            verify_checkpoint(found[-1].path, allow_unverified=allow_unverified)
            return found[-1].path
        raise _no_checkpoint_in(path, "resume from an older one instead")
    raise CheckpointError(f"trainer.resume={resume}: no such checkpoint directory")


def resolve_checkpoint(path: str | os.PathLike, *, on_skip=None) -> Path:
    """The checkpoint a command after training names (export, generate, evaluate,
    model.init_from), its files checked: a step_NNNNNN folder (refused when damaged, saying what
    to name instead), or a checkpoints folder or run directory: its newest intact checkpoint,
    each damaged newer one passed over with a line to on_skip (default: a warning in the log)
    naming it and why."""
    path = Path(path).expanduser()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise CheckpointError(
            f"checkpoint {path} {what}; name a step_NNNNNN folder, a run's checkpoints folder "
            "or the run directory"
        )
    if (path / "checkpoints").is_dir() and not (path / META).exists():
        path = path / "checkpoints"  # a run directory
    if (path / META).is_file():
        return _checked_as_named(path)
    if not find_checkpoints(path):
        raise _no_checkpoint_in(path, _named_instead(path))
    return _newest_intact(
        path, False, what="", on_skip=on_skip, fix="restore one from a copy, or name another run"
    )


def _checked_as_named(step_dir: Path) -> Path:
    """A step folder a command names, its files checked; a damaged one is refused saying what
    to name instead (an older checkpoint is never taken in its place unasked)."""
    try:
        verify_checkpoint(step_dir)
    except (UnverifiedCheckpointError, FutureCheckpointError):
        raise  # not damaged: another checkpoint would not do instead
    except CheckpointError as e:
        # e.problem: without verify_files' advice to a resume
        raise CheckpointError(f"{e.problem.rstrip('.')}; {_named_instead(step_dir)}") from e
    return step_dir


def _named_instead(step_dir: Path) -> str:
    """What a command after training may name instead of step folder `step_dir`."""
    folder = step_dir.parent
    run = folder.parent if folder.name == "checkpoints" else folder
    return f"name {run} to take its newest intact checkpoint, or another step folder"


def _no_checkpoint_in(path: Path, instead: str) -> CheckpointError:
    """A folder holding no checkpoint: a checkpoint's files without its meta.json (a copy or a
    prune cut short), or nothing of one."""
    if any(path.glob("*.pt")) or (path / ".metadata").exists():
        return CheckpointError(
            f"{path} is not a complete flashtrain checkpoint (it has no {META}; it was "
            f"probably cut off while being written); {instead}"
        )
    return CheckpointError(f"no checkpoint in {path} (expected step_NNNNNN/{META} inside)")


def _newest_intact(
    root: str | os.PathLike,
    allow_unverified: bool,
    *,
    what: str = "trainer.resume=auto",
    on_skip=None,
    fix: str = "delete them to start afresh, or resume from a copy",
) -> Path | None:
    """The newest checkpoint under root that verifies; each damaged newer one is passed over
    with a line (to on_skip, default the log's warnings) naming it and what is wrong."""
    found = find_checkpoints(root)
    prefix = f"{what}: " if what else ""
    for info in reversed(found):
        try:
            verify_checkpoint(info.path, allow_unverified=allow_unverified)
            return info.path
        except (UnverifiedCheckpointError, FutureCheckpointError):
            raise  # intact as far as can be told: going back past it would lose its steps
        except CheckpointError as e:
            line = f"{prefix}passing over checkpoint {info.path}: {e.problem}"
            if on_skip is None:
                log.warning("%s", line)
            else:
                on_skip(line)
    if found:
        raise CheckpointError(
            f"{prefix}none of the {len(found)} checkpoint(s) in {root} is intact (each is "
            f"named above); {fix}"
        )
    return None


def read_meta(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        with open(path / META) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a flashtrain checkpoint (no {META})") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: cannot read {META} ({e})") from e
    if not isinstance(meta, dict) or "step" not in meta or "format" not in meta:
        raise CheckpointError(f"checkpoint {path} is corrupt: {META} lacks step/format")
    version = meta.get("version", 1)
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(f"checkpoint {path} is corrupt: its format version is {version!r}")
    if version > FORMAT_VERSION:
        raise FutureCheckpointError(
            f"checkpoint {path} has format version {version}, newer than this flashtrain reads "
            f"(up to {FORMAT_VERSION}): it was written by a newer flashtrain; update flashtrain "
            f"to read it"
        )
    name = CKPT_RE.match(path.name)
    if name and (not isinstance(meta["step"], int) or int(name.group(1)) != meta["step"]):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its {META} says step {meta['step']!r}, its name "
            f"step {int(name.group(1))}"
        )
    files = meta.get("files")
    if files is not None and not _is_manifest(files):
        raise CheckpointError(f"checkpoint {path} is corrupt: the file list in its {META} is bad")
    return meta


def _is_manifest(files) -> bool:
    return isinstance(files, dict) and all(
        isinstance(name, str)
        and name == Path(name).name  # a plain file name inside the checkpoint
        and isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get(ALGORITHM), str)
        for name, entry in files.items()
    )


def verify_checkpoint(path: str | os.PathLike, *, allow_unverified: bool = False) -> dict:
    """Check every file of checkpoint `path` against the sizes and checksums in its meta.json
    (one process; load_checkpoint does the same spread over the ranks). Returns the meta;
    raises CheckpointError naming the first damaged or missing file. A checkpoint without
    checksums (format version 1, or its file list removed) passes unchecked only with
    allow_unverified; otherwise UnverifiedCheckpointError."""
    path = Path(path)
    meta = read_meta(path)
    if meta.get("files") is not None:
        verify_files(path, meta["files"])
    else:
        _allow_unverified(path, meta, allow_unverified)
    return meta


def _allow_unverified(path: Path, meta: dict, allowed: bool) -> None:
    if not allowed:
        raise UnverifiedCheckpointError(
            f"checkpoint {path} has no checksums (its {META} lists no files; format version "
            f"{meta.get('version', 1)}), so its files cannot be checked before loading. If you "
            f"trust it, pass trainer.allow_unverified_checkpoint=true"
        )


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sharded: bool = False,
    allow_unverified: bool = False,
    model_config: dict | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load model and optimizer state from checkpoint `path` in place; return (trainer_state,
    meta). Every rank calls it. Raises CheckpointError, before touching the model, when a file
    does not match its checksum (the ranks share the hashing) or is unreadable, when it has no
    checksums and not allow_unverified, when meta.json and trainer.pt disagree on the step, or
    when the checkpoint was written for another model: one whose saved config differs from
    `model_config` (when given) in a field that changes what the model computes, or of another
    shape."""
    path = Path(path)
    meta = read_meta(path)
    _verify_on_every_rank(path, meta, allow_unverified)
    if model_config is not None:
        check_model_config(path, meta.get("model_config"), model_config)
    # the step check, before the model is touched (trainer.pt is small)
    trainer_state = torch_load(path / TRAINER_STATE, weights_only=False)
    if isinstance(trainer_state, dict) and trainer_state.get("step", meta["step"]) != meta["step"]:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its {META} says step {meta['step']}, its "
            f"{TRAINER_STATE} step {trainer_state['step']}"
        )
    fmt = meta["format"]
    current = {k: tuple(shape) for k, shape in _full_shapes(model).items()}
    if fmt == "torch":
        state = torch_load(path / MODEL_OPTIM, weights_only=True)
        if not isinstance(state, dict) or "model" not in state or "optim" not in state:
            raise CheckpointError(f"checkpoint {path} is corrupt: {MODEL_OPTIM} lacks model/optim")
        saved = {k: tuple(v.shape) for k, v in state["model"].items() if torch.is_tensor(v)}
        _check_shapes(path, saved, current, meta)
        options = StateDictOptions(full_state_dict=True, strict=True) if sharded else None
        set_model_state_dict(model, state["model"], options=options)
        set_optimizer_state_dict(model, optimizer, state["optim"], options=options)
    elif fmt == "dcp":
        saved = {name: tuple(md.size) for name, md in dcp_model_entries(path).items()}
        _check_shapes(path, saved, current, meta)
        state = {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),
        }
        _dcp_load(path, state, no_dist=not dist.is_initialized())
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
    else:
        raise CheckpointError(f"checkpoint {path} has unknown format {fmt!r}")
    return trainer_state, meta


def resolved_on_rank_0(path: str | os.PathLike, *, collective: bool, on_skip=None) -> Path:
    """resolve_checkpoint(path, on_skip=on_skip), its files checked. collective: every rank of
    the process group calls this; rank 0 resolves and hashes once (and alone tells on_skip)
    and broadcasts the answer or the error."""
    if not collective:
        return resolve_checkpoint(path, on_skip=on_skip)
    found = error = None
    if is_main_process():
        try:
            found = resolve_checkpoint(path, on_skip=on_skip)
        except CheckpointError as e:
            error = e
    error, found = broadcast_object((error, str(found) if found else None))
    if error is not None:
        raise error
    return Path(found)


def dcp_model_entries(path: Path) -> dict:
    """{parameter name: its TensorStorageMetadata (global size, dtype)} of a DCP checkpoint's
    model, from its .metadata alone."""
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # noqa: BLE001 - any reader failure means an unusable checkpoint
        raise CheckpointError(
            f"checkpoint {path} is corrupt: cannot read its metadata ({e})"
        ) from e
    return {
        key[len("model.") :]: md
        for key, md in metadata.state_dict_metadata.items()
        if key.startswith("model.") and hasattr(md, "size")
    }


def _dcp_load(path: Path, state: dict, *, no_dist: bool) -> None:
    """dcp.load of `state`'s entries from checkpoint `path`, in place (no_dist: in this process
    alone, with or without a process group)."""
    import torch.distributed.checkpoint as dcp

    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(path), no_dist=no_dist)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"checkpoint {path} is corrupt or incomplete: {e}") from e


# Model settings that do not change what a loaded model computes: how it is computed (memory
# for speed, a kernel for another) and how fresh weights start (the checkpoint's replace them).
# A resume may change them; every other field must match the checkpoint's.
ROUTE_ONLY_FIELDS = frozenset(
    {
        "recompute",
        "recompute_every",
        "tile_tokens",  # how the MLP is computed (in tiles), not what
        "loss_impl",
        "loss_chunk_size",
        "init_from",
        "init_positions",
        "init_std",
        "max_seq_len",  # only bounds the context: a changed table shape is refused by shape
    }
)


def model_config_misfit(
    saved: dict | None, current: dict, free_fields: frozenset = ROUTE_ONLY_FIELDS
) -> tuple[str, str] | None:
    """Where a saved model config differs from `current` outside `free_fields`, in a field
    that changes the function (n_head over the same tensor shapes reinterprets every weight):
    (the changes, the settings that match the checkpoint), or None when it fits. saved: None
    or empty when not recorded (written before the config was saved, a bare state dict): only
    the tensor shapes can be checked then."""
    if not saved:
        return None
    if saved.get("arch", current.get("arch")) != current.get("arch"):
        differ = ["arch"]  # the other fields differ because of it
    else:
        differ = [
            key
            for key in sorted(set(saved) & set(current))
            if key not in free_fields and saved[key] != current[key]
        ]
    if not differ:
        return None
    changes = ", ".join(f"model.{k}={current[k]!r} (checkpoint: {saved[k]!r})" for k in differ)
    return changes, " ".join(f"model.{k}={saved[k]}" for k in differ)


def check_model_config(path: Path, saved: dict | None, current: dict) -> None:
    """Refuse a resume from a checkpoint whose model config does not fit this run's."""
    misfit = model_config_misfit(saved, current)
    if misfit:
        changes, settings = misfit
        raise CheckpointError(
            f"checkpoint {path} does not fit this model: {changes}; its weights mean something "
            f"else under these settings. Resume with {settings}, or start a new run"
        )


def _verify_on_every_rank(path: Path, meta: dict, allow_unverified: bool) -> None:
    """verify_checkpoint spread over the ranks (rank r hashes files r, r + world, ...); skipped
    when this process (rank 0) checked the same files already, e.g. in resolve_resume."""
    manifest = meta.get("files")
    if manifest is None:
        _allow_unverified(path, meta, allow_unverified)
        if is_main_process():
            log.warning(
                "checkpoint %s has no checksums (format version %s): loading it unverified",
                path,
                meta.get("version", 1),
            )
        return
    if not broadcast_object(is_verified(path, manifest) if is_main_process() else None):
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        error = None
        try:
            verify_files(path, manifest, sorted(manifest)[rank::world])
        except CheckpointError as e:
            error = str(e)
        errors = [e for e in gather_objects(error) if e]
        if errors:
            raise CheckpointError(errors[0])
    if is_main_process() and (extra := unlisted_files(path, manifest)):
        log.warning(
            "checkpoint %s holds files its %s does not list (ignored, never read): %s",
            path,
            META,
            ", ".join(extra[:5]),
        )


def torch_load(file: Path, *, weights_only: bool, mmap: bool = False):
    """torch.load on CPU, a missing or unreadable file a CheckpointError naming it. mmap: the
    tensors stay in the file until read (a slice copied reads only its pages)."""
    try:
        return torch.load(file, map_location="cpu", weights_only=weights_only, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(
            f"checkpoint {file.parent} is incomplete: {file.name} is missing"
        ) from None
    except Exception as e:  # noqa: BLE001 - truncated zip, bad pickle, ...
        raise CheckpointError(
            f"checkpoint {file.parent} is corrupt: cannot read {file.name} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e


def _full_shapes(model: torch.nn.Module) -> dict[str, torch.Size]:
    """Unsharded shapes of the model's state, by the names get_model_state_dict uses."""
    out = {}
    for key, value in get_model_state_dict(model).items():
        if torch.is_tensor(value):
            shape = value.shape  # a DTensor reports its global shape
            out[key] = shape
    return out


def _check_shapes(path: Path, saved: dict, current: dict, meta: dict) -> None:
    misfits = shape_misfits(current, saved)
    if not misfits:
        return
    lines = [f"checkpoint {path} does not fit this model:", *misfits]
    if meta.get("model_config"):
        lines.append(f"  it was saved with model config {meta['model_config']}")
    lines.append("  resume with the same model settings, or start a new run without trainer.resume")
    raise CheckpointError("\n".join(lines))


# ---- the tokenizer a checkpoint's weights were trained with --------------------------------

TOKENIZER = "tokenizer"  # meta.json: {"name": kind + fingerprint of its files, "vocab_size"}
_NOT_THOSE = (
    "these are not the vocabulary files its weights were trained with (replaced since, or a "
    "hub id's tokenizer updated on the hub?), and their ids would mean other text; put the "
    "original files back where the run found them"
)


def tokenizer_record(data) -> dict | None:
    """What meta.json records of the tokenizer the run's data module trained with (its name
    carries a fingerprint of its vocabulary files), or None for data that comes as ids."""
    tok = data.tokenizer
    return None if tok is None else {"name": tok.name, "vocab_size": tok.vocab_size}


def check_tokenizer(tok, meta: dict, checkpoint: Path, data_vocab_size: int | None) -> None:
    """Refuse a tokenizer rebuilt from the run's config (data.tokenizer_path, the caches) that
    is not the one the checkpoint's weights were trained with: another name or id count than
    its meta.json records, or, for a checkpoint written before the record, another id count
    than the run's data.vocab_size (ids past the embedding table)."""
    files = ", ".join(str(f) for f in getattr(tok, "files", ())) or "no files"
    now = f"{tok.name} ({tok.vocab_size} ids, from {files})"
    recorded = meta.get(TOKENIZER)
    if isinstance(recorded, dict):
        if (tok.name, tok.vocab_size) != (recorded.get("name"), recorded.get("vocab_size")):
            raise CheckpointError(
                f"checkpoint {checkpoint} was trained with tokenizer {recorded.get('name')} "
                f"({recorded.get('vocab_size')} ids) but the run's tokenizer is now {now}: "
                f"{_NOT_THOSE}"
            )
    elif data_vocab_size is not None and tok.vocab_size != data_vocab_size:
        raise CheckpointError(
            f"checkpoint {checkpoint} was trained with data.vocab_size={data_vocab_size} but "
            f"the run's tokenizer is now {now}: {_NOT_THOSE}"
        )
