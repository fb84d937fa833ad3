"""Models on the project's attention: GPT-2, BERT, Llama-family decoders and a long-sequence
classifier.

    from flashtrain.models import build_model
    model = build_model(cfg.model, cfg.attention)     # configs or mappings (see config.py)
    out = model(**batch)                              # ModelOutput(loss, num_targets, correct, logits)

configs/model/<name>.yaml: a model config (config.py: GPT2Config, BertConfig, ClassifierConfig;
llama.py: LlamaConfig; picked by `arch`); configs/attention/<name>.yaml: an attention backend's
config (attention.py, picked by `impl`: flash | blocksparse | sdpa | reference). See README.md beside this file for
memory at long context.
"""

from __future__ import annotations

from typing import Any

from flashtrain.models.attention import (
    ATTENTION_BACKENDS,
    Attention,
    AttentionConfig,
    AttentionContext,
    RingAttention,
    attention_config,
    build_attention,
)
from flashtrain.models.bert import Bert
from flashtrain.models.classifier import SequenceClassifier
from flashtrain.models.config import (
    MODEL_CONFIGS,
    BertConfig,
    ClassifierConfig,
    GPT2Config,
    TransformerConfig,
    model_config,
)
from flashtrain.models.gpt2 import GPT2
from flashtrain.models.llama import Llama, LlamaConfig
from flashtrain.models.loss import linear_cross_entropy
from flashtrain.models.positions import resize_positions
from flashtrain.models.transformer import Block, ModelOutput, TransformerModel

# A model file that carries its own config registers it here, where every model module is
# imported (llama.py imports config.py, so config.py cannot import it).
MODEL_CONFIGS[LlamaConfig.arch] = LlamaConfig

ARCHS: dict[str, type[TransformerModel]] = {
    "gpt2": GPT2,
    "bert": Bert,
    "classifier": SequenceClassifier,
    "llama": Llama,
}


def build_model(model_cfg: Any, attention_cfg: Any) -> TransformerModel:
    """A model config + an attention config -> the model (on the default device; wrap in
    `with torch.device("meta"):` to build without allocating). Each config may be its dataclass
    or a mapping (a DictConfig, a dict; the attention also just an impl name)."""
    cfg = model_config(model_cfg)
    return ARCHS[cfg.arch](cfg, attention_cfg)


__all__ = [
    "ARCHS",
    "ATTENTION_BACKENDS",
    "Attention",
    "AttentionConfig",
    "AttentionContext",
    "Bert",
    "BertConfig",
    "Block",
    "ClassifierConfig",
    "GPT2",
    "GPT2Config",
    "Llama",
    "LlamaConfig",
    "ModelOutput",
    "RingAttention",
    "SequenceClassifier",
    "TransformerConfig",
    "TransformerModel",
    "attention_config",
    "build_attention",
    "build_model",
    "linear_cross_entropy",
    "model_config",
    "resize_positions",
]
