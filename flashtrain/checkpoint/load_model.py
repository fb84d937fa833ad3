"""The one loader of a saved model: generate, evaluate, export and Python all call it.

    model, info = load_model("outputs/2026-01-01/12-00-00")    # a run directory, its
    # checkpoints/ folder (its newest intact checkpoint) or one step_NNNNNN folder (its files
    # checked against their checksums)
    model, info = load_model("hf:openai-community/gpt2")       # a transformers folder or hub id
    info.step, info.run_config, info.run_info, info.facts()

The model is rebuilt from the config its weights were saved with (a trainer checkpoint's
meta.json, a transformers config.json), on the meta device, then materialised on `device` and
filled from the weights tensor by tensor (no second copy in memory). It is returned in eval mode,
in float32 as the trainer keeps its weights (saved tensors of another dtype converted).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flashtrain.checkpoint.run_info import read_run_info
from flashtrain.checkpoint.sources import TrainerSource, open_source
from flashtrain.models import TransformerModel, build_model
from flashtrain.models.materialize import materialize_from


@dataclass
class CheckpointInfo:
    """What a loaded model came from."""

    source: str  # "checkpoint runs/a/checkpoints/step_000100", "hf:gpt2"
    path: Path | None = None  # the step_NNNNNN folder (trainer checkpoints)
    step: int | None = None
    meta: dict = field(default_factory=dict)  # the checkpoint's meta.json
    run_config: Any = None  # the run's resolved config (an OmegaConf DictConfig), or None
    run_info: dict = field(default_factory=dict)  # the run directory's run.json, {} if absent

    @property
    def run_name(self) -> str:
        if self.path is None:
            return self.source
        return str(self.meta.get("run_name") or self.path.parent.parent.name)

    @property
    def commit(self) -> str:
        """The code the run trained with ("unknown" when not recorded)."""
        return str(self.run_info.get("commit") or self.meta.get("commit") or "unknown")

    def facts(self) -> dict:
        """What a report names about the checkpoint."""
        where = str(self.path) if self.path is not None else self.source
        return dict(checkpoint=where, run=self.run_name, step=self.step, commit=self.commit)


def load_model(
    ref: str | os.PathLike,
    *,
    attention: Any = None,
    device: str | torch.device = "cpu",
    max_seq_len: int | None = None,
    position_mode: str = "interpolate",
    on_note=None,
) -> tuple[TransformerModel, CheckpointInfo]:
    """The model saved at `ref` and where it came from.

    attention: the attention config or impl to run with (default: the run's own; "flash" for a
    transformers checkpoint). max_seq_len: build for this many positions instead of the saved
    length (learned tables resized by `position_mode`: interpolate or copy). on_note(line):
    told of each damaged newer checkpoint passed over (default: a warning in the log)."""
    source = open_source(ref, on_note=on_note)
    model_cfg = {**source.model_config(), "init_from": None}
    if max_seq_len is not None:
        model_cfg["max_seq_len"] = max_seq_len
    with torch.device("meta"):
        model = build_model(
            model_cfg, source.attention_config() if attention is None else attention
        )
    materialize_from(
        model,
        device,
        source.rows_for(model.config, model),
        position_mode=position_mode,
        optional=source.optional_prefixes,
        longer_positions=source.longer_positions,
        what=str(ref),
    )
    info = CheckpointInfo(**source.facts())
    if isinstance(source, TrainerSource):
        info.run_info = read_run_info(source.path.parent.parent)  # RUN/checkpoints/step_NNNNNN
    return model.eval(), info
