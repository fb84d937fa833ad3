"""A flashtrain model back from a trainer checkpoint, single-process or sharded, in one process.

    model, info = load_checkpoint_model("outputs/2026-01-01/12-00-00")   # a run directory,
    # its checkpoints/ folder, or one step_NNNNNN folder

The checkpoint is verified against its checksums first (flashtrain.train.checkpoint); the model
is rebuilt from the config recorded in its meta.json (without its init_from, which the saved
weights replace) and filled from the weights checkpoint.read_model_state reads: model_optim.pt
("torch" format: single process, DDP) or every DCP shard of the model and none of the optimizer
("dcp" format: FSDP2; read without a process group).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from flashtrain.models import TransformerModel, build_model, model_config
from flashtrain.train.checkpoint import (
    CONFIG,
    CheckpointError,
    read_meta,
    read_model_state,
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
    directory: its newest intact checkpoint), on CPU in eval mode, in the dtype the model is built
    in (float32, as the trainer keeps its weights; saved tensors of another dtype are converted)."""
    step_dir = resolve_checkpoint(path)
    meta = read_meta(step_dir)
    if not meta.get("model_config"):
        raise CheckpointError(f"checkpoint {step_dir} records no model_config in its meta.json")
    cfg = model_config({**meta["model_config"], "init_from": None})
    state, _ = read_model_state(step_dir)
    with torch.device("meta"):
        model = build_model(cfg, attention)
    model.load_state_dict_extended(state, assign=True)  # the tensors read: no second copy
    run_config = {}
    if (step_dir / CONFIG).is_file():
        run_config = OmegaConf.to_container(OmegaConf.load(step_dir / CONFIG), resolve=False)
    run_info = read_run_info(step_dir.parent.parent)  # RUN/checkpoints/step_NNNNNN
    return model.eval(), CheckpointInfo(step_dir, int(meta["step"]), meta, run_config, run_info)
