"""A flashtrain model back from a trainer checkpoint, single-process or sharded, in one process.

    model, info = load_checkpoint_model("outputs/2026-01-01/12-00-00")   # a run directory,
    # its checkpoints/ folder, or one step_NNNNNN folder

The checkpoint is verified against its checksums first (flashtrain.train.checkpoint); the model
is rebuilt from the config recorded in its meta.json (without its init_from, which the saved
weights replace) and filled from model_optim.pt ("torch" format: single process, DDP) or from
the DCP shards ("dcp" format: FSDP2; read here without a process group, every shard of the
model and none of the optimizer).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from flashtrain.models import TransformerModel, build_model, model_config
from flashtrain.train.checkpoint import (
    CONFIG,
    MODEL_OPTIM,
    CheckpointError,
    read_meta,
    resolve_checkpoint,
)
from flashtrain.train.run_info import read_run_info


@dataclass
class CheckpointInfo:
    path: Path  # the step_NNNNNN folder
    step: int
    meta: dict
    run_config: dict  # the run's resolved config (config.yaml), {} when absent
    run_info: dict  # the run directory's run.json (commits, device), {} when absent


def load_checkpoint_model(
    path: str | Path, attention="reference"
) -> tuple[TransformerModel, CheckpointInfo]:
    """The model saved in checkpoint `path` (a step folder, a checkpoints folder or a run
    directory: its newest intact checkpoint), on CPU in the dtype it was saved in, in eval mode."""
    step_dir = resolve_checkpoint(path)
    meta = read_meta(step_dir)
    if not meta.get("model_config"):
        raise CheckpointError(f"checkpoint {step_dir} records no model_config in its meta.json")
    cfg = model_config({**meta["model_config"], "init_from": None})
    with torch.device("meta"):
        model = build_model(cfg, attention)
    model.to_empty(device="cpu")
    state = model.state_dict()
    if meta["format"] == "torch":
        saved = torch.load(step_dir / MODEL_OPTIM, map_location="cpu", weights_only=True)["model"]
        model.load_state_dict(saved, strict=True)
    elif meta["format"] == "dcp":
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": state}, checkpoint_id=str(step_dir), no_dist=True)
        model.load_state_dict(state, strict=True)
    else:
        raise CheckpointError(f"checkpoint {step_dir} has unknown format {meta['format']!r}")
    run_config = {}
    if (step_dir / CONFIG).is_file():
        run_config = OmegaConf.to_container(OmegaConf.load(step_dir / CONFIG), resolve=False)
    run_info = read_run_info(step_dir.parent.parent)  # RUN/checkpoints/step_NNNNNN
    return model.eval(), CheckpointInfo(step_dir, int(meta["step"]), meta, run_config, run_info)
