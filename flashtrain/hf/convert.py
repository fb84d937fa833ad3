"""flashtrain models <-> transformers models, in Python.

    hf_model = to_hf(model)                       # a transformers PreTrainedModel, same weights
    model = from_hf(hf_model)                     # or a local folder / hub id
    model = from_hf("path/or/id", attention="flash", max_seq_len=4096)   # config overrides

Both keep the weights' dtype. to_hf needs transformers; from_hf of a folder or hub id needs only
safetensors (the config is read as JSON).
"""

from __future__ import annotations

from typing import Any

import torch

from flashtrain.hf.registry import mapping_for, mapping_for_hf
from flashtrain.hf.source import read_config, read_weights, resolve_source
from flashtrain.models import TransformerModel, build_model, model_config


def hf_config_dict(model_or_config) -> dict:
    """The transformers config.json dict of a flashtrain model (or model config)."""
    cfg = getattr(model_or_config, "config", model_or_config)
    return mapping_for(cfg).hf_config(cfg)


def to_hf(model: TransformerModel, *, extra_config: dict | None = None):
    """A transformers model computing what `model` computes, with copies of its weights in
    their dtype (GPT-2 -> GPT2LMHeadModel, BERT -> BertForMaskedLM / BertForSequenceClassification).
    extra_config: more config.json fields (token ids). Refuses architectures transformers has
    no equivalent for, naming them."""
    import transformers

    cfg = model.config
    mapping = mapping_for(cfg)
    fields = {**mapping.hf_config(cfg), **(extra_config or {})}
    model_type = fields.pop("model_type")
    hf_cfg = transformers.AutoConfig.for_model(model_type, **fields)
    dtype = next(model.parameters()).dtype
    hf_model = getattr(transformers, mapping.hf_class(cfg))(hf_cfg).to(dtype)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    hf_model.load_state_dict(mapping.state_to_hf(state, cfg), strict=True)
    hf_model.tie_weights()
    return hf_model.eval()


def _source(model_or_path) -> tuple[dict, dict, str]:
    """(config dict, state dict, description) of a transformers model or checkpoint."""
    if isinstance(model_or_path, torch.nn.Module):
        hf_cfg = model_or_path.config.to_dict()
        hf_cfg.setdefault("architectures", [type(model_or_path).__name__])
        if not hf_cfg.get("architectures"):
            hf_cfg["architectures"] = [type(model_or_path).__name__]
        return hf_cfg, dict(model_or_path.state_dict()), type(model_or_path).__name__
    folder = resolve_source(str(model_or_path))
    return read_config(folder), read_weights(folder), str(model_or_path)


def from_hf(model_or_path: Any, attention: Any = "flash", **overrides) -> TransformerModel:
    """A flashtrain model from a transformers model, a local folder or a hub id: its config
    mapped (overrides: other model-config fields, e.g. max_seq_len, dropout, pad_vocab_multiple;
    a longer max_seq_len resizes learned positions as init_positions says, a shorter one keeps
    the first ones), its
    weights mapped exactly, in their dtype. attention: an attention config or impl name."""
    hf_cfg, hf_state, source = _source(model_or_path)
    mapping = mapping_for_hf(hf_cfg, source)
    cfg = model_config({**mapping.config_from_hf(hf_cfg), **overrides})
    dtype = next(t.dtype for t in hf_state.values() if t.is_floating_point())  # not a buffer's
    with torch.device("meta"):
        model = build_model(cfg, attention)
    model.to_empty(device="cpu")
    model.init_weights()  # only what the checkpoint lacks (a head) keeps these
    model.to(dtype)
    state = complete_state(
        first_positions(mapping.state_from_hf(hf_state, cfg, source), model), model
    )
    model.load_state_dict_extended(state, mode=cfg.init_positions)
    return model


def complete_state(state: dict, model: TransformerModel) -> dict:
    """state with the keys it lacks (an optional head) taken from the model's own."""
    own = model.state_dict()
    return {**{k: v for k, v in own.items() if k not in state}, **state}


def first_positions(state: dict, model: TransformerModel) -> dict:
    """state with learned 1-D position tables longer than the model's cut to its length: a
    shorter context than the checkpoint's uses its first positions, as transformers runs a
    shorter sequence (a longer one is resized by load_state_dict_extended)."""
    own = model.state_dict()
    out = dict(state)
    for key, kind in model.position_tables.items():
        if kind == "1d" and key in out and out[key].shape[0] > own[key].shape[0]:
            out[key] = out[key][: own[key].shape[0]]
    return out
