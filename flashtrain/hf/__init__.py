"""Hugging Face interop: flashtrain models in and out of transformers' format, and flashtrain's
attention inside transformers models.

    from flashtrain.hf import to_hf, from_hf, register
    from flashtrain.checkpoint.export_hf import export_checkpoint   # a trainer checkpoint out
    hf_model = to_hf(model)                      # GPT2LMHeadModel / BertForMaskedLM / ...
    model = from_hf("path/or/hub-id")            # or from a transformers model object
    export_checkpoint("outputs/RUN", "out")      # a folder from_pretrained loads
    register()                                   # attn_implementation="flashtrain" (attention.py)

Training needs none of this but the readers: model.init_from=hf:... reads through
flashtrain.checkpoint with source.py and the mappings here (safetensors, never transformers).
transformers and safetensors are the `hf` extra: pip install -e ".[hf]".
"""

from flashtrain.hf.convert import from_hf, hf_config_dict, to_hf
from flashtrain.hf.registry import MAPPINGS, mapping_for, mapping_for_hf

__all__ = [
    "MAPPINGS",
    "from_hf",
    "hf_config_dict",
    "mapping_for",
    "mapping_for_hf",
    "register",
    "to_hf",
]


def register() -> str:
    """Register attn_implementation="flashtrain" with transformers (flashtrain/hf/attention.py)."""
    from flashtrain.hf.attention import register as _register

    return _register()
