"""The model configs: the schemas of configs/model/*.yaml, one dataclass per architecture.

`arch` picks the architecture (gpt2 | bert | classifier); each dataclass's defaults are the
original model's (GPT-2 small, BERT-base, the LRA-size Path-X classifier), so a size file names
only what differs. Values are checked here, at start-up, with errors that say what is allowed.

    cfg = model_config({"arch": "gpt2", "n_layer": 2})     # or a DictConfig, or an instance
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flashtrain.typed_config import check_choice, typed_group

# the LM head's loss implementations (flashtrain.models.loss): auto = fused on CUDA, chunked elsewhere
LOSS_IMPLS = ("auto", "fused", "chunked")

RECOMPUTE_MODES = ("none", "all", "every_k")
ACTIVATIONS = ("gelu", "gelu_tanh")
POSITION_RESIZE_MODES = ("interpolate", "copy")


@dataclass
class TransformerConfig:
    """Fields every architecture has; the subclasses below set their own defaults."""

    arch: str = ""  # gpt2 | bert | classifier | llama: the key of MODEL_CONFIGS
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    d_ff: int | None = None  # None: 4 * d_model
    max_seq_len: int = 1024  # the positional table (configs: ${seq_len})
    vocab_size: int = 50257  # token ids the data produces (configs: ${data.vocab_size})
    pad_vocab_multiple: int = 1  # e.g. 64: embedding rows rounded up for faster matmuls
    dropout: float = 0.0  # embeddings and residual branches
    attn_dropout: float = 0.0  # attention probabilities, inside the kernel
    layer_norm_eps: float = 1e-5
    activation: str = "gelu_tanh"  # gelu | gelu_tanh
    recompute: str = "none"  # none | all | every_k (torch.utils.checkpoint, non-reentrant)
    recompute_every: int = 1  # every_k: blocks 0, k, 2k, ... are recomputed
    init_from: str | None = None  # checkpoint to start from (positions resized); hf:PATH_OR_ID
    init_positions: str = "interpolate"  # interpolate | copy: how init_from's positions resize

    def __post_init__(self):
        for key in ("n_layer", "n_head", "d_model", "max_seq_len", "vocab_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{key} must be a positive int, got {value!r}")
        if self.d_model % self.n_head != 0:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            shown = [h for h in divisors if h <= 64]
            raise ValueError(
                f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}; "
                f"allowed n_head for this width: {shown}{' ...' if len(shown) < len(divisors) else ''}"
            )
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        check_choice(self.recompute, RECOMPUTE_MODES, "model.recompute")
        if not isinstance(self.recompute_every, int) or self.recompute_every < 1:
            raise ValueError(
                f"model.recompute_every must be an int >= 1, got {self.recompute_every!r}"
            )
        check_choice(self.activation, ACTIVATIONS, "model.activation")
        for key in ("dropout", "attn_dropout"):
            p = getattr(self, key)
            if not 0.0 <= float(p) < 1.0:
                raise ValueError(f"model.{key} must be in [0, 1), got {p}")
        check_choice(self.init_positions, POSITION_RESIZE_MODES, "model.init_positions")
        if self.pad_vocab_multiple < 1:
            raise ValueError(
                f"model.pad_vocab_multiple must be >= 1, got {self.pad_vocab_multiple}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        """Embedding rows: vocab_size rounded up to pad_vocab_multiple (the loss ignores the
        padding rows)."""
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m


@dataclass
class GPT2Config(TransformerConfig):
    """GPT-2 small; gpt2-medium/large/xl change n_layer, n_head, d_model."""

    arch: str = "gpt2"
    position: str = "learned"  # learned | rotary
    rotary_base: float = 10000.0
    loss_impl: str = "auto"  # fused (Triton) | chunked (PyTorch) | auto: fused on CUDA
    loss_chunk_size: int = 2048  # tokens per chunk of the chunked head + cross-entropy

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.position, ("learned", "rotary"), "model.position")
        check_choice(self.loss_impl, LOSS_IMPLS, "model.loss_impl")
        if self.position == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")


BERT_HEADS = ("mlm", "classification")


@dataclass
class BertConfig(TransformerConfig):
    """BERT-base; bert-large changes n_layer, n_head, d_model, d_ff."""

    arch: str = "bert"
    d_ff: int | None = 3072
    max_seq_len: int = 512
    vocab_size: int = 30522
    type_vocab_size: int = 2
    dropout: float = 0.1
    attn_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    activation: str = "gelu"
    head: str = "mlm"  # mlm | classification (pooler + linear on [CLS])
    num_classes: int | None = None  # classification head only
    loss_impl: str = "auto"  # the MLM head's loss, as GPT2Config.loss_impl
    loss_chunk_size: int = 2048

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.head, BERT_HEADS, "model.head")
        check_choice(self.loss_impl, LOSS_IMPLS, "model.loss_impl")
        if self.head == "classification" and (self.num_classes is None or self.num_classes < 2):
            raise ValueError(
                f"model.head=classification needs model.num_classes >= 2, got {self.num_classes!r}"
            )
        if self.type_vocab_size < 1:
            raise ValueError(f"model.type_vocab_size must be >= 1, got {self.type_vocab_size}")


@dataclass
class ClassifierConfig(TransformerConfig):
    """A Long Range Arena-size sequence classifier over pixel tokens (Path-X / Path-256)."""

    arch: str = "classifier"
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_ff: int | None = 256
    vocab_size: int = 256  # pixel intensities
    num_classes: int = 2
    position: str = "2d"  # 2d (row + column tables over a square image) | 1d
    pooling: str = "mean"  # mean | cls
    norm: str = "pre"  # pre | post
    causal: bool = False
    dropout: float = 0.1
    activation: str = "gelu"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.position, ("1d", "2d"), "model.position")
        check_choice(self.pooling, ("mean", "cls"), "model.pooling")
        check_choice(self.norm, ("pre", "post"), "model.norm")
        if not isinstance(self.num_classes, int) or self.num_classes < 2:
            raise ValueError(f"model.num_classes must be an int >= 2, got {self.num_classes!r}")
        if self.position == "2d" and math.isqrt(self.max_seq_len) ** 2 != self.max_seq_len:
            side = math.isqrt(self.max_seq_len)
            raise ValueError(
                f"position=2d needs max_seq_len to be image_size**2, got {self.max_seq_len}; "
                f"nearest allowed: {side**2} ({side}x{side}) or {(side + 1) ** 2} "
                f"({side + 1}x{side + 1}); or use position=1d"
            )

    @property
    def image_size(self) -> int:
        return math.isqrt(self.max_seq_len)


# LlamaConfig (flashtrain/models/llama.py, with its model) joins this table in
# flashtrain/models/__init__.py: llama.py imports this module, so it cannot be imported here.
MODEL_CONFIGS: dict[str, type[TransformerConfig]] = {
    cls.arch: cls for cls in (GPT2Config, BertConfig, ClassifierConfig)
}


def model_config(cfg: Any) -> TransformerConfig:
    """The config of the architecture `cfg.arch` names, from an instance or a mapping."""
    return typed_group(cfg, MODEL_CONFIGS, key="arch", what="model")
