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

from flashtrain.hf.mapping import HFRows
from flashtrain.hf.registry import mapping_for, mapping_for_hf
from flashtrain.hf.source import open_weights, read_config, resolve_source
from flashtrain.models import TransformerModel, build_model, model_config
from flashtrain.models.materialize import materialize_from


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
    """(config dict, tensors by key, description) of a transformers model or checkpoint (a
    checkpoint's tensors unread until indexed: hf/source.py)."""
    if isinstance(model_or_path, torch.nn.Module):
        hf_cfg = model_or_path.config.to_dict()
        if not hf_cfg.get("architectures"):
            hf_cfg["architectures"] = [type(model_or_path).__name__]
        return hf_cfg, dict(model_or_path.state_dict()), type(model_or_path).__name__
    folder = resolve_source(str(model_or_path))
    return read_config(folder), open_weights(folder), str(model_or_path)


def from_hf(model_or_path: Any, attention: Any = "flash", **overrides) -> TransformerModel:
    """A flashtrain model from a transformers model, a local folder or a hub id: its config
    mapped (overrides: other model-config fields, e.g. max_seq_len, dropout, pad_vocab_multiple;
    a longer max_seq_len resizes learned positions as init_positions says, a shorter one keeps
    the first ones), its weights mapped exactly, in their dtype. The model is built on the meta
    device and each tensor read straight into its place (the weights are in memory once)."""
    hf_cfg, tensors, source = _source(model_or_path)
    mapping = mapping_for_hf(hf_cfg, source)
    cfg = model_config({**mapping.config_from_hf(hf_cfg), **overrides})
    plan = mapping.import_plan(tensors.keys(), cfg, source)
    # the weights' dtype: of a tensor the plan reads (a folder's buffers may differ)
    dtype = tensors[next(iter(plan.rules.values()))[1][0]].dtype
    with torch.device("meta"):
        model = build_model(cfg, attention).to(dtype)
    materialize_from(
        model, "cpu", HFRows(source, plan, tensors), position_mode=cfg.init_positions,
        optional=mapping.optional(cfg), longer_positions="first", what=source,
    )  # fmt: skip
    return model
