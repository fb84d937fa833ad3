"""The model configs: the schemas of configs/model/*.yaml, one dataclass per architecture, all
here (as the data configs are in flashtrain/data/config.py): the model files import their schema
from this module, and so can code that reads a config without building a model (flashtrain.hf).

`arch` picks the architecture (gpt2 | bert | classifier | llama; registry.py maps it to the model
class, which carries its dataclass as `Config`); each dataclass's defaults are the original
model's (GPT-2 small, BERT-base, the LRA-size Path-X classifier, Llama-3-8B), so a size file names
only what differs. Values are checked here, at start-up, with errors that say what is allowed.

    cfg = flashtrain.models.model_config({"arch": "gpt2", "n_layer": 2})   # or a DictConfig
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from flashtrain.models.rotary import RopeScalingConfig, check_rotary_base, check_rotary_head_dim
from flashtrain.typed_config import check_choice

# the LM head's loss implementations (flashtrain.models.loss): auto = fused on CUDA, chunked elsewhere
LOSS_IMPLS = ("auto", "fused", "chunked")

RECOMPUTE_MODES = ("none", "all", "every_k", "offload")
ACTIVATIONS = ("gelu", "gelu_tanh")
POSITION_RESIZE_MODES = ("interpolate", "copy")


@dataclass
class TransformerConfig:
    """Fields every architecture has; the subclasses below set their own defaults.

    tasks: the data tasks (DataModule.task: lm | mlm | classification) the architecture trains
    on; task_key: the field that picks one where there are several (BERT's head). The trainer's
    config check refuses data of another task before anything is built."""

    tasks: ClassVar[tuple[str, ...]] = ()
    task_key: ClassVar[str | None] = None

    arch: str = ""  # gpt2 | bert | classifier | llama: the model's key in registry.MODELS
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
    # none | all | every_k | offload (torch.utils.checkpoint, non-reentrant, per block);
    # offload: all, each block's input in host memory until its backward (models/offload.py)
    recompute: str = "none"
    recompute_every: int = 1  # every_k: blocks 0, k, 2k, ... are recomputed
    # weights to start from (positions resized): a checkpoint folder, a torch file, hf:PATH_OR_ID;
    # read by flashtrain.checkpoint.initial_weights after the model is built, never by the model
    init_from: str | None = None
    init_positions: str = "interpolate"  # interpolate | copy: how init_from's positions resize

    def __post_init__(self):
        sizes = ("n_layer", "n_head", "d_model", "max_seq_len", "vocab_size", "loss_chunk_size")
        for key in (k for k in sizes if hasattr(self, k)):  # a classifier has no LM loss
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
        if self.d_ff is not None and (isinstance(self.d_ff, bool) or self.d_ff < 1):
            raise ValueError(f"model.d_ff must be a positive int or null, got {self.d_ff!r}")
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
        if not self.layer_norm_eps > 0:
            raise ValueError(f"model.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if self.pad_vocab_multiple < 1:
            raise ValueError(
                f"model.pad_vocab_multiple must be >= 1, got {self.pad_vocab_multiple}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def task(self) -> str:
        """The data task this config trains on (one of `tasks`)."""
        return getattr(self, self.task_key) if self.task_key else self.tasks[0]

    @property
    def padded_vocab_size(self) -> int:
        """Embedding rows: vocab_size rounded up to pad_vocab_multiple (the loss ignores the
        padding rows)."""
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m


@dataclass
class GPT2Config(TransformerConfig):
    """GPT-2 small; gpt2-medium/large/xl change n_layer, n_head, d_model."""

    tasks: ClassVar[tuple[str, ...]] = ("lm",)

    arch: str = "gpt2"
    position: str = "learned"  # learned | rotary
    rotary_base: float = 10000.0
    loss_impl: str = "auto"  # fused (Triton) | chunked (PyTorch) | auto: fused on CUDA
    loss_chunk_size: int = 2048  # tokens per chunk of the chunked head + cross-entropy

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.position, ("learned", "rotary"), "model.position")
        check_choice(self.loss_impl, LOSS_IMPLS, "model.loss_impl")
        check_rotary_base(self.rotary_base, "model.rotary_base")
        if self.position == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")


BERT_HEADS = ("mlm", "classification")


@dataclass
class BertConfig(TransformerConfig):
    """BERT-base; bert-large changes n_layer, n_head, d_model, d_ff."""

    tasks: ClassVar[tuple[str, ...]] = BERT_HEADS  # the head is the task
    task_key: ClassVar[str | None] = "head"

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

    tasks: ClassVar[tuple[str, ...]] = ("classification",)

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


# TransformerConfig fields of LayerNorm / GELU / learned-table models that a Llama has no use for:
# set to anything but their defaults they are refused, naming what to set instead.
_NOT_LLAMA = {
    "layer_norm_eps": (1e-5, "model.rms_norm_eps"),
    "activation": ("gelu_tanh", "nothing (the MLP is SwiGLU)"),
    "init_positions": ("interpolate", "model.rope_scaling (rotary positions have no table)"),
}


@dataclass
class LlamaConfig(TransformerConfig):
    """Llama-3-8B's shape; the configs/model/llama-*.yaml sizes name what differs."""

    tasks: ClassVar[tuple[str, ...]] = ("lm",)

    arch: str = "llama"
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int | None = 8  # K/V heads (GQA); null = n_head (MHA), 1 = MQA
    d_model: int = 4096
    d_ff: int | None = None  # SwiGLU hidden size; null: from multiple_of, ffn_dim_multiplier
    multiple_of: int = 1024  # d_ff rounded up to a multiple of this (Meta's rule)
    ffn_dim_multiplier: float | None = 1.3  # Meta's: d_ff = multiplier * 8 / 3 * d_model
    max_seq_len: int = 8192  # the run's context (configs: ${seq_len}); no table, no limit
    vocab_size: int = 128256
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    tie_embeddings: bool = False
    sliding_window: int | None = None  # Mistral: each token sees itself and the W - 1 before
    attn_logit_softcap: float | None = None  # Gemma 2: scores s -> cap * tanh(s / cap)
    final_logit_softcap: float | None = None  # the same on the output logits
    init_std: float = 0.02
    loss_impl: str = "auto"  # fused (Triton) | chunked (PyTorch) | auto: fused on CUDA
    loss_chunk_size: int = 2048
    # > 0: each block's MLP half (norm, SwiGLU, residual) runs over at most this many tokens at a
    # time, forward and backward (models/tiled.py); 0: off
    tile_tokens: int = 0

    def __post_init__(self):
        for key, (default, instead) in _NOT_LLAMA.items():
            if getattr(self, key) != default:
                raise ValueError(f"model.{key} does not apply to arch=llama; set {instead}")
        swiglu_default = self.d_ff is None
        if swiglu_default:  # set below from SwiGLU's rule, not the shared 4 * d_model
            self.d_ff = 1
        super().__post_init__()
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if not isinstance(self.n_kv_head, int) or self.n_kv_head < 1:
            raise ValueError(f"model.n_kv_head must be a positive int, got {self.n_kv_head!r}")
        if self.n_head % self.n_kv_head != 0:
            allowed = [h for h in range(1, self.n_head + 1) if self.n_head % h == 0]
            raise ValueError(
                f"model.n_kv_head={self.n_kv_head} does not divide model.n_head={self.n_head}: "
                f"each K/V head serves a whole group of query heads; allowed n_kv_head: {allowed}"
            )
        check_rotary_head_dim(self.head_dim)
        if self.multiple_of < 1:
            raise ValueError(f"model.multiple_of must be >= 1, got {self.multiple_of}")
        if self.ffn_dim_multiplier is not None and not self.ffn_dim_multiplier > 0:
            raise ValueError(
                f"model.ffn_dim_multiplier must be > 0 or null, got {self.ffn_dim_multiplier}"
            )
        if swiglu_default:
            self.d_ff = swiglu_hidden_size(self.d_model, self.multiple_of, self.ffn_dim_multiplier)
        check_rotary_base(self.rope_theta, "model.rope_theta")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"model.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not self.init_std > 0:
            raise ValueError(f"model.init_std must be > 0, got {self.init_std}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(
                f"model.sliding_window must be >= 1 (tokens seen, itself included) or null, "
                f"got {self.sliding_window}"
            )
        for key in ("attn_logit_softcap", "final_logit_softcap"):
            cap = getattr(self, key)
            if cap is not None and not cap > 0:
                raise ValueError(f"model.{key} must be > 0 or null (off), got {cap}")
        check_choice(self.loss_impl, LOSS_IMPLS, "model.loss_impl")
        self._check_tile_tokens()
        if self.final_logit_softcap and self.loss_impl == "fused":
            raise ValueError(
                "model.final_logit_softcap needs model.loss_impl=chunked (or auto): the fused "
                "loss kernel has no logit softcap"
            )

    def _check_tile_tokens(self) -> None:
        tile = self.tile_tokens
        if not isinstance(tile, int) or isinstance(tile, bool) or tile < 0:
            raise ValueError(f"model.tile_tokens must be an int >= 0 (0: off), got {tile!r}")
        if tile and self.dropout > 0:
            raise ValueError(
                f"model.tile_tokens={tile} needs model.dropout=0 (got {self.dropout}): the tiled "
                "MLP recomputes each tile in the backward and would need every tile's dropout "
                "mask replayed; set model.dropout=0 (model.attn_dropout is allowed) or "
                "model.tile_tokens=0"
            )

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim


def swiglu_hidden_size(d_model: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """Meta's SwiGLU width: 2/3 of 4 * d_model (the parameters of a 4x GELU MLP), times the
    multiplier, rounded up to multiple_of (Llama-3-8B: 4096 -> 14336)."""
    hidden = int(2 * (4 * d_model) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)
