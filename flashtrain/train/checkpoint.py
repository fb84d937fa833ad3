"""Checkpoints: atomic, resumable, the last K kept.

Layout of one checkpoint (a directory under the run's checkpoints/ folder):

    step_000200/
        meta.json      step, format, world size, strategy, parameter count, model config;
                       written last, so a directory without it is not a checkpoint
        config.yaml    the resolved config of the run that wrote it
        trainer.pt     scheduler, grad scaler, step, tokens seen, per-rank RNG and data positions
        model_optim.pt model + optimizer state (format "torch": single process and DDP), or
        *.distcp, .metadata   the same, sharded, through torch.distributed.checkpoint (format
                       "dcp": FSDP2; every rank writes its own shards)
    latest             the name of the newest checkpoint

Everything is written into `.step_000200.tmp/` and renamed into place only when complete, so a
kill at any moment leaves the previous checkpoints intact and never a half-written `latest`.
Model and optimizer state go through torch.distributed.checkpoint.state_dict (parameter names as
keys, wrapper prefixes removed), so either format loads into single, DDP or FSDP2 runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
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

CKPT_RE = re.compile(r"^step_(\d+)$")
META = "meta.json"
TRAINER_STATE = "trainer.pt"
MODEL_OPTIM = "model_optim.pt"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names it and what to do instead."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def find_checkpoints(root: str | os.PathLike) -> list[CheckpointInfo]:
    """Complete checkpoints under `root` (those with a meta.json), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = CKPT_RE.match(entry.name)
        if m and entry.is_dir() and (entry / META).is_file():
            found.append(CheckpointInfo(int(m.group(1)), entry))
    return sorted(found, key=lambda c: c.step)


def resolve_resume(resume: str | None, root: str | os.PathLike) -> Path | None:
    """The checkpoint directory `trainer.resume` points at.

    None -> None; "auto" -> the newest complete checkpoint under `root`, or None when there is
    none; a path -> that checkpoint, or the newest one inside it when it is a checkpoints folder.
    """
    if resume is None or str(resume).lower() in ("", "none", "null", "false"):
        return None
    if str(resume) == "auto":
        found = find_checkpoints(root)
        return found[-1].path if found else None
    path = Path(resume).expanduser()
    if (path / META).is_file():
        return path
    if path.is_dir():
        found = find_checkpoints(path)
        if found:
            return found[-1].path
        if any(path.glob("*.pt")) or (path / ".metadata").exists():
            raise CheckpointError(
                f"{path} is not a complete flashtrain checkpoint (it has no {META}; it was "
                f"probably cut off while being written). Resume from an older one instead."
            )
        raise CheckpointError(f"no checkpoint in {path} (expected step_NNNNNN/{META} inside)")
    raise CheckpointError(f"trainer.resume={resume}: no such checkpoint directory")


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
    return meta


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any] | None,
    meta: dict[str, Any],
    config_yaml: str = "",
    sharded: bool = False,
    keep_last: int = 0,
) -> Path:
    """Write checkpoint `step` under `root`. A collective: every rank calls it.

    trainer_state (rank 0's; other ranks may pass None) holds whatever the trainer needs beyond
    model and optimizer. sharded=True writes through torch.distributed.checkpoint (FSDP2).
    Returns the final checkpoint directory.
    """
    root = Path(root)
    name = checkpoint_name(step)
    final = root / name
    tmp = root / f".{name}.tmp"
    if _is_main():
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step_*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    _barrier()

    if sharded:
        import torch.distributed.checkpoint as dcp

        state = {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),
        }
        dcp.save(state, checkpoint_id=str(tmp))
    elif _is_main():
        state = {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),
        }
        torch.save(state, tmp / MODEL_OPTIM)
        _fsync_file(tmp / MODEL_OPTIM)
    _barrier()

    if _is_main():
        torch.save(trainer_state or {}, tmp / TRAINER_STATE)
        _fsync_file(tmp / TRAINER_STATE)
        if config_yaml:
            (tmp / "config.yaml").write_text(config_yaml)
        full_meta = dict(meta)
        full_meta.update(
            step=int(step), format="dcp" if sharded else "torch", version=FORMAT_VERSION
        )
        with open(tmp / META, "w") as f:
            json.dump(full_meta, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again: swap the new one in
            old = root / f".{name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
        _atomic_write_text(root / "latest", name + "\n")
        if keep_last > 0:
            for old in find_checkpoints(root)[:-keep_last]:
                shutil.rmtree(old.path, ignore_errors=True)
    _barrier()
    return final


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sharded: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load model and optimizer state from checkpoint `path` in place; return (trainer_state,
    meta). Every rank calls it. Raises CheckpointError, before touching the model, when the
    checkpoint is unreadable or was written for a model of another shape."""
    path = Path(path)
    meta = read_meta(path)
    fmt = meta["format"]
    current = {k: tuple(shape) for k, shape in _full_shapes(model).items()}
    if fmt == "torch":
        state = _torch_load(path / MODEL_OPTIM, weights_only=True)
        if not isinstance(state, dict) or "model" not in state or "optim" not in state:
            raise CheckpointError(f"checkpoint {path} is corrupt: {MODEL_OPTIM} lacks model/optim")
        saved = {k: tuple(v.shape) for k, v in state["model"].items() if torch.is_tensor(v)}
        _check_shapes(path, saved, current, meta)
        options = StateDictOptions(full_state_dict=True, strict=True) if sharded else None
        set_model_state_dict(model, state["model"], options=options)
        set_optimizer_state_dict(model, optimizer, state["optim"], options=options)
    elif fmt == "dcp":
        import torch.distributed.checkpoint as dcp

        try:
            metadata = dcp.FileSystemReader(str(path)).read_metadata()
        except Exception as e:  # noqa: BLE001 - any reader failure means an unusable checkpoint
            raise CheckpointError(
                f"checkpoint {path} is corrupt: cannot read its metadata ({e})"
            ) from e
        saved = {}
        for key, md in metadata.state_dict_metadata.items():
            if key.startswith("model.") and hasattr(md, "size"):
                saved[key[len("model.") :]] = tuple(md.size)
        _check_shapes(path, saved, current, meta)
        state = {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),
        }
        try:
            with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"checkpoint {path} is corrupt or incomplete: {e}") from e
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
    else:
        raise CheckpointError(f"checkpoint {path} has unknown format {fmt!r}")
    trainer_state = _torch_load(path / TRAINER_STATE, weights_only=False)
    return trainer_state, meta


def _torch_load(file: Path, *, weights_only: bool):
    try:
        return torch.load(file, map_location="cpu", weights_only=weights_only, mmap=False)
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
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    wrong = sorted(k for k in set(saved) & set(current) if tuple(saved[k]) != tuple(current[k]))
    if not (missing or unexpected or wrong):
        return
    lines = [f"checkpoint {path} does not fit this model:"]
    if missing:
        lines.append(f"  missing in the checkpoint ({len(missing)}): {', '.join(missing[:5])}")
    if unexpected:
        lines.append(f"  not in this model ({len(unexpected)}): {', '.join(unexpected[:5])}")
    for k in wrong[:5]:
        lines.append(f"  {k}: checkpoint {list(saved[k])} vs model {list(current[k])}")
    if meta.get("model_config"):
        lines.append(f"  it was saved with model config {meta['model_config']}")
    lines.append("  resume with the same model settings, or start a new run without trainer.resume")
    raise CheckpointError("\n".join(lines))


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU and the current CUDA device)."""
    import random

    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
