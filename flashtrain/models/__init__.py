"""Models on the project's attention: GPT-2, BERT and a long-sequence classifier.

    from flashtrain.models import build_model
    model = build_model(cfg.model, cfg.attention)     # DictConfig or dict
    out = model(**batch)                              # ModelOutput(loss, num_targets, correct, logits)

configs/model/<name>.yaml: `arch` (gpt2 | bert | classifier) and that architecture's config fields
(GPT2Config, BertConfig, ClassifierConfig); configs/attention/<name>.yaml: AttentionConfig
(`impl`: flash | blocksparse | sdpa | reference, and a block-sparse pattern's parameters).
See README.md beside this file for memory at long context.
"""

from __future__ import annotations

from torch import nn

from flashtrain.config_dict import to_plain_dict
from flashtrain.models.attention_impl import (
    ATTENTION_IMPLS,
    BLOCKSPARSE_PATTERNS,
    AttentionConfig,
    AttentionContext,
    AttentionOp,
)
from flashtrain.models.bert import Bert, BertConfig
from flashtrain.models.classifier import ClassifierConfig, SequenceClassifier
from flashtrain.models.gpt2 import GPT2, GPT2Config
from flashtrain.models.loss import linear_cross_entropy
from flashtrain.models.transformer import (
    Block,
    ModelOutput,
    TransformerConfig,
    TransformerModel,
    resize_positions,
)

ARCHS = {
    "gpt2": (GPT2Config, GPT2),
    "bert": (BertConfig, Bert),
    "classifier": (ClassifierConfig, SequenceClassifier),
}


def build_model(model_cfg, attention_cfg) -> nn.Module:
    """configs/model/<name>.yaml + configs/attention/<name>.yaml -> the model (on the default
    device; wrap in `with torch.device("meta"):` to build without allocating)."""
    d = to_plain_dict(model_cfg, what="model config")
    arch = d.get("arch")
    if arch not in ARCHS:
        raise ValueError(f"unknown model arch {arch!r}; allowed: {', '.join(ARCHS)}")
    config_cls, model_cls = ARCHS[arch]
    attention = AttentionConfig.from_any(attention_cfg)
    return model_cls(config_cls.from_any(d), attention)


__all__ = [
    "ARCHS",
    "ATTENTION_IMPLS",
    "BLOCKSPARSE_PATTERNS",
    "AttentionConfig",
    "AttentionContext",
    "AttentionOp",
    "Bert",
    "BertConfig",
    "Block",
    "ClassifierConfig",
    "GPT2",
    "GPT2Config",
    "ModelOutput",
    "SequenceClassifier",
    "TransformerConfig",
    "TransformerModel",
    "build_model",
    "linear_cross_entropy",
    "resize_positions",
]
