"""Which mapping serves which model: by flashtrain arch (export) or by config.json model_type
(import). Architectures without a transformers twin are refused, saying why."""

from __future__ import annotations

from flashtrain.hf.bert import BertMapping
from flashtrain.hf.gpt2 import GPT2Mapping
from flashtrain.hf.llama import LlamaMapping
from flashtrain.hf.mapping import ArchMapping
from flashtrain.models.config import TransformerConfig

MAPPINGS: dict[str, ArchMapping] = {
    m.arch: m for m in (GPT2Mapping(), BertMapping(), LlamaMapping())
}

# flashtrain architectures with no transformers equivalent, and why
NO_EQUIVALENT = {
    "classifier": (
        "the Path-X sequence classifier (model.arch=classifier: pixel tokens, 2-D row + column "
        "positions, mean or [CLS] pooling) has no transformers equivalent"
    ),
}


def mapping_for(cfg: TransformerConfig) -> ArchMapping:
    """The mapping of a flashtrain model config."""
    if cfg.arch in MAPPINGS:
        return MAPPINGS[cfg.arch]
    why = NO_EQUIVALENT.get(cfg.arch, f"model.arch={cfg.arch} has no transformers mapping")
    raise ValueError(f"cannot convert to transformers: {why}; convertible: {', '.join(MAPPINGS)}")


def mapping_for_hf(hf_config: dict, source: str = "") -> ArchMapping:
    """The mapping of a transformers config.json dict (by its model_type)."""
    model_type = hf_config.get("model_type")
    for mapping in MAPPINGS.values():
        if model_type in mapping.model_types:
            return mapping
    known = ", ".join(t for m in MAPPINGS.values() for t in m.model_types)
    where = f" {source}" if source else ""
    raise ValueError(
        f"the Hugging Face model{where} has model_type={model_type!r}, which flashtrain does not "
        f"implement; allowed: {known}"
    )
