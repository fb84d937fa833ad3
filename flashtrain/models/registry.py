"""The architectures `model.arch` picks: one model class each, carrying its config dataclass as
`Config` (whose `arch` default is the key). The tables are derived from MODELS, so a new model is
its file (the class and its Config), one entry below and a configs/model/<name>.yaml.

    model = build_model(cfg.model, cfg.attention)   # configs or mappings (see config.py)
"""

from __future__ import annotations

from typing import Any

from flashtrain.models.bert import Bert
from flashtrain.models.classifier import SequenceClassifier
from flashtrain.models.config import TransformerConfig
from flashtrain.models.gpt2 import GPT2
from flashtrain.models.llama import Llama
from flashtrain.models.transformer import TransformerModel
from flashtrain.typed_config import Registry

MODELS = Registry("arch", "model", [GPT2, Bert, SequenceClassifier, Llama])
ARCHS: dict[str, type[TransformerModel]] = MODELS.classes
MODEL_CONFIGS: dict[str, type[TransformerConfig]] = MODELS.configs


def model_config(cfg: Any) -> TransformerConfig:
    """The config of the architecture `cfg.arch` names, from an instance or a mapping."""
    return MODELS.config(cfg)


def build_model(model_cfg: Any, attention_cfg: Any) -> TransformerModel:
    """A model config + an attention config -> the model (on the default device; wrap in
    `with torch.device("meta"):` to build without allocating). Each config may be its dataclass
    or a mapping (a DictConfig, a dict; the attention also just an impl name)."""
    cfg = model_config(model_cfg)
    return MODELS.build_class(cfg)(cfg, attention_cfg)
