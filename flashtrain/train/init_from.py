"""model.init_from=<a trainer checkpoint folder>: a model's starting weights from a checkpoint this
trainer wrote, a step folder (step_NNNNNN/) or a checkpoints folder (its newest intact
checkpoint), in either format: "torch" (single process, DDP) or "dcp" (FSDP2's sharded
checkpoints, which have no model_optim.pt). Registered as the models' folder source on import
(flashtrain/models/init_sources.py); read by checkpoint.read_model_state, which checks every file
against its checksum first (under torchrun on rank 0, once). Only the model is read: optimizer
and schedule start afresh.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from flashtrain.models.init_sources import register_folder_source
from flashtrain.train.checkpoint import (
    CheckpointError,
    UnverifiedCheckpointError,
    read_model_state,
)

log = logging.getLogger("flashtrain")


def checkpoint_init_state(ref: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model weights of the trainer checkpoint folder `ref` (a CheckpointError naming
    model.init_from when there is none, or it is damaged)."""
    path = Path(ref).expanduser()
    try:
        # every rank builds the model: rank 0 checks the files once, all read them
        state, step_dir = read_model_state(path, collective=True)
    except UnverifiedCheckpointError as e:
        raise CheckpointError(
            f"model.init_from={ref}: the checkpoint has no checksums (an older format), so its "
            f"files cannot be checked before loading; if you trust it, name its model_optim.pt "
            f"file instead (torch format; loaded as it is, unchecked)"
        ) from e
    except CheckpointError as e:
        hint = ""
        if (path / "checkpoints").is_dir():
            hint = f" (a run folder: its checkpoints are in {path / 'checkpoints'})"
        raise CheckpointError(f"model.init_from={ref}: {e}{hint}") from e
    log.info("model.init_from: the weights of checkpoint %s", step_dir)
    return state


register_folder_source(checkpoint_init_state)
