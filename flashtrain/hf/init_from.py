"""model.init_from=hf:PATH_OR_ID: a configured model's starting weights from a transformers
checkpoint (registered as the models' "hf:" init source on import: flashtrain/models/init_sources.py).

The checkpoint's architecture must match the configured model's field for field (a mismatch is
refused naming the field). Learned positions: a longer context than the checkpoint's resizes
them as any init_from does (model.init_positions); a shorter one takes the checkpoint's first
positions, as transformers runs a shorter sequence. A head the checkpoint lacks (a classifier on a masked-LM
checkpoint) keeps its fresh initialisation.
"""

from __future__ import annotations

import logging

import torch

from flashtrain.hf.convert import complete_state, first_positions
from flashtrain.hf.registry import mapping_for
from flashtrain.hf.source import read_config, read_weights, resolve_source
from flashtrain.models.init_sources import register_init_source

PREFIX = "hf:"
log = logging.getLogger("flashtrain.hf")


def hf_init_state(ref: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The flashtrain state dict for `model` from the transformers checkpoint `ref` (a local
    folder or a hub id; "hf:" prefix optional), positions at the checkpoint's length."""
    ref = ref[len(PREFIX) :] if ref.startswith(PREFIX) else ref
    source = f"hf:{ref}"
    cfg = model.config
    mapping = mapping_for(cfg)
    folder = resolve_source(ref)
    hf_cfg = read_config(folder)
    if hf_cfg.get("model_type") not in mapping.model_types:
        raise ValueError(
            f"model.arch={cfg.arch} but the Hugging Face checkpoint {source} has "
            f"model_type={hf_cfg.get('model_type')!r} (model.arch={cfg.arch} loads "
            f"model_type {' or '.join(repr(t) for t in mapping.model_types)})"
        )
    mapping.check_architecture(hf_cfg, cfg, source)
    state = mapping.state_from_hf(read_weights(folder), cfg, source)
    state = first_positions(state, model)
    own = model.state_dict()
    fresh = sorted(k for k in own if k not in state)
    if fresh:
        log.info(
            "init_from=%s: %d tensors not in it keep their fresh init: %s",
            source,
            len(fresh),
            ", ".join(fresh[:4]),
        )
    return complete_state(state, model)


register_init_source(PREFIX, hf_init_state)
