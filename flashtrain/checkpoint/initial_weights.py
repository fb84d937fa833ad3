"""A run's initial weights: the step after the model is built (on the meta device) and placed
(DDP, FSDP2, one process), visible where the trainer calls it:

    with torch.device("meta"):
        model = build_model(cfg.model, cfg.attention)
    model = shard(model)                                          # FSDP2: before any memory
    report = initial_weights(model, cfg.model.init_from, device=env.device,
                             position_mode=cfg.model.init_positions)
    # in Python, on a model built with its weights: initial_weights(model, "hf:gpt2")

Fresh weights first, each rank its shards (flashtrain.models.materialize: in one process bit for
bit those of a model built on CPU from the same seed); then, when model.init_from names weights
(a trainer checkpoint folder, a torch state-dict file, hf:PATH_OR_ID), each rank reads the rows of
its shards from them. Only the model is read: optimizer and schedule start afresh. The log says
what was read, resized or kept fresh.
"""

from __future__ import annotations

import logging

import torch

from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.checkpoint.sources import open_source
from flashtrain.models.materialize import FillReport, fill_from, materialize

log = logging.getLogger("flashtrain")


def initial_weights(
    model: torch.nn.Module,
    init_from: str | None,
    *,
    device: torch.device | str | None = None,
    position_mode: str | None = None,
) -> FillReport | None:
    """Materialise the meta-built `model` on `device` with fresh weights (a model built with
    weights already keeps them), then read `init_from`'s over them (every rank of the process
    group calls this). Returns what was read (None without init_from). A source that does not
    fit the model is a ValueError naming model.init_from and what differs; a damaged
    checkpoint a CheckpointError (of a run or checkpoints folder, its newest intact one is read,
    the log naming each damaged newer one passed over). position_mode: how positional tables
    of another length resize (interpolate | copy; default the model's config.init_positions)."""
    if any(t.is_meta for t in model.parameters()):
        if device is None:
            raise ValueError("the model is on the meta device: say which device to place it on")
        materialize(model, device)
    if not init_from:
        return None
    what = f"model.init_from={init_from}"
    cfg = model.config
    try:
        source = open_source(
            init_from, collective=True, on_note=lambda line: log.warning("%s: %s", what, line)
        )
        source.check_model(cfg)
        rows = source.rows_for(cfg, model)
        report = fill_from(
            model,
            rows,
            position_mode=position_mode or cfg.init_positions,
            optional=source.optional_prefixes,
            longer_positions=source.longer_positions,
            what=what,
        )
    except CheckpointError as e:  # damaged or missing: say it is the init_from's
        raise CheckpointError(f"{what}: {e}") from e
    except (KeyError, ValueError) as e:
        message = e.args[0] if e.args else str(e)
        raise ValueError(message if message.startswith(what) else f"{what}: {message}") from e
    log.info("%s", report.summary())
    return report
