"""Models on the project's attention: GPT-2, BERT, Llama-family decoders and a long-sequence
classifier.

    from flashtrain.models import build_model
    model = build_model(cfg.model, cfg.attention)     # configs or mappings (see config.py)
    out = model(**batch)                              # ModelOutput(loss, num_targets, correct, logits)

configs/model/<name>.yaml: a model config, picked by `arch` (registry.py: the model classes,
each carrying its dataclass from config.py, which holds every model's schema, as `Config`);
configs/attention/<name>.yaml: an attention impl's config, picked by `impl`: flash | blocksparse |
sdpa | reference (attention_layers.py).
See README.md beside this file for memory at long context.
"""

from __future__ import annotations

from flashtrain.models.attention_layers import (
    ATTENTION_IMPLS,
    Attention,
    AttentionConfig,
    AttentionContext,
    attention_config,
    build_attention,
)
from flashtrain.models.bert import Bert
from flashtrain.models.classifier import SequenceClassifier
from flashtrain.models.config import (
    BertConfig,
    ClassifierConfig,
    GPT2Config,
    LlamaConfig,
    TransformerConfig,
)
from flashtrain.models.gpt2 import GPT2
from flashtrain.models.llama import Llama
from flashtrain.models.loss import linear_cross_entropy
from flashtrain.models.positions import resize_positions
from flashtrain.models.registry import ARCHS, MODEL_CONFIGS, MODELS, build_model, model_config
from flashtrain.models.split_attention import RingAttention, UlyssesAttention
from flashtrain.models.transformer import Block, ModelOutput, TransformerModel

__all__ = [
    "ARCHS",
    "MODELS",
    "MODEL_CONFIGS",
    "ATTENTION_IMPLS",
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
    "UlyssesAttention",
    "attention_config",
    "build_attention",
    "build_model",
    "linear_cross_entropy",
    "model_config",
    "resize_positions",
]
