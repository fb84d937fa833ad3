"""The transformer block every model here is built from, and what the models share.

Block: LayerNorm, multi-head self-attention (the configured AttentionOp), LayerNorm, MLP, residuals;
pre-LayerNorm (GPT-2, the classifier) or post-LayerNorm (BERT). A block takes hidden states either
padded (B, T, C) or packed (N, C) (the real tokens of a padded batch, for the varlen kernel): every
layer but attention is per token, and attention reads the layout from the AttentionContext.

TransformerModel: the base class of GPT2, Bert and SequenceClassifier: recomputation of whole blocks
(none / all / every_k), parameter and FLOP counts, loading a checkpoint with shorter positional tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from flashtrain.config_dict import to_plain_dict
from flashtrain.models.attention_impl import (
    KERNEL_MAX_HEAD_DIM,
    AttentionContext,
    AttentionOp,
)

RECOMPUTE_MODES = ("none", "all", "every_k")
ACTIVATIONS = ("gelu", "gelu_tanh")
POSITION_RESIZE_MODES = ("interpolate", "copy")


@dataclass
class ModelOutput:
    """What model(**batch) returns (docs/interfaces.md)."""

    loss: torch.Tensor  # float32 scalar, mean over the counted targets
    num_targets: torch.Tensor  # int64 scalar: targets counted in loss
    correct: torch.Tensor | None = None  # int64 scalar: argmax hits (mlm, classification)
    logits: torch.Tensor | None = None  # (B, num_classes), classification only


@dataclass
class TransformerConfig:
    """Fields every architecture has; gpt2.py, bert.py and classifier.py extend it."""

    name: str = ""
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    d_ff: int | None = None  # None: 4 * d_model
    max_seq_len: int = 1024  # the positional table (configs: ${seq_len})
    vocab_size: int = 50257
    dropout: float = 0.0  # embeddings and residual branches
    attn_dropout: float = 0.0  # attention probabilities, inside the kernel
    layer_norm_eps: float = 1e-5
    activation: str = "gelu_tanh"
    recompute: str = "none"  # none | all | every_k (torch.utils.checkpoint, non-reentrant)
    recompute_every: int = 1  # every_k: blocks 0, k, 2k, ... are recomputed
    init_from: str | None = None  # checkpoint to start from (positions resized if shorter)
    init_positions: str = "interpolate"  # interpolate | copy: how init_from's positions are resized

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
        if self.recompute is None:
            self.recompute = "none"
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(
                f"model.recompute={self.recompute!r}; allowed: {', '.join(RECOMPUTE_MODES)}"
            )
        if not isinstance(self.recompute_every, int) or self.recompute_every < 1:
            raise ValueError(
                f"model.recompute_every must be an int >= 1, got {self.recompute_every!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"model.activation={self.activation!r}; allowed: {', '.join(ACTIVATIONS)}"
            )
        for key in ("dropout", "attn_dropout"):
            p = getattr(self, key)
            if not 0.0 <= float(p) < 1.0:
                raise ValueError(f"model.{key} must be in [0, 1), got {p}")
        if self.init_positions not in POSITION_RESIZE_MODES:
            raise ValueError(
                f"model.init_positions={self.init_positions!r}; allowed: "
                f"{', '.join(POSITION_RESIZE_MODES)}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @classmethod
    def from_any(cls, cfg):
        """From a dict / DictConfig (the `arch` key is dropped) or an instance."""
        if isinstance(cfg, cls):
            return cfg
        d = to_plain_dict(cfg, what="model config")
        d.pop("arch", None)
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown {cls.__name__} key(s) {unknown}; allowed: {', '.join(['arch', *allowed])}"
            )
        return cls(**d)

    def check_attention(self, attn: AttentionOp) -> None:
        """The kernels take head_dim multiples of 8 up to 256."""
        hd = self.head_dim
        if attn.impl in ("flash", "blocksparse") and (hd % 8 != 0 or hd > KERNEL_MAX_HEAD_DIM):
            raise ValueError(
                f"attention={attn.impl} needs head_dim = d_model / n_head to be a multiple of 8 "
                f"up to {KERNEL_MAX_HEAD_DIM}; got {self.d_model} / {self.n_head} = {hd}"
            )


# ---- the block -----------------------------------------------------------------------------


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the head dim (GPT-NeoX layout). x (..., H, D); cos, sin (..., 1, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotary_tables(positions: torch.Tensor, head_dim: int, base: float = 10000.0):
    """cos, sin (len(positions), head_dim / 2) float32 for integer positions."""
    inv_freq = base ** (
        -torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    )
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    return angles.cos(), angles.sin()


class SelfAttention(nn.Module):
    """Fused q, k, v projection, the attention op, output projection (GPT-2's c_attn / c_proj)."""

    def __init__(self, d_model: int, n_head: int, attn_op: AttentionOp, attn_dropout: float):
        super().__init__()
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.attn_dropout = attn_dropout
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.attn_op = attn_op

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        lead = x.shape[:-1]  # (B, T) padded or (N,) packed
        qkv = self.c_attn(x).view(*lead, 3, self.n_head, self.head_dim)  # (B, T, 3, H, D)
        q, k, v = qkv.unbind(dim=-3)  # (B, T, H, D) each
        if ctx.rotary is not None:
            cos, sin = ctx.rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = self.attn_dropout if self.training else 0.0
        y = self.attn_op(q, k, v, ctx, dropout_p=p)  # (B, T, H, D)
        return self.c_proj(y.reshape(*lead, -1))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, activation: str):
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff)
        self.act = nn.GELU(approximate="tanh" if activation == "gelu_tanh" else "none")
        self.c_proj = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))  # (B, T, C)


class Block(nn.Module):
    """One transformer layer. norm="pre": x + f(LN(x)) (GPT-2); norm="post": LN(x + f(x)) (BERT)."""

    def __init__(self, cfg: TransformerConfig, attn_op: AttentionOp, norm: str = "pre"):
        super().__init__()
        if norm not in ("pre", "post"):
            raise ValueError(f"norm={norm!r}; allowed: pre, post")
        self.pre_norm = norm == "pre"
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = SelfAttention(cfg.d_model, cfg.n_head, attn_op, cfg.attn_dropout)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg.d_model, cfg.d_ff, cfg.activation)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.ln_1(x), ctx))
            x = x + self.drop(self.mlp(self.ln_2(x)))
        else:
            x = self.ln_1(x + self.drop(self.attn(x, ctx)))
            x = self.ln_2(x + self.drop(self.mlp(x)))
        return x


# ---- positions -----------------------------------------------------------------------------


def resize_positions(table: torch.Tensor, new_len: int, mode: str = "interpolate") -> torch.Tensor:
    """A (L, C) positional table resized to (new_len, C).

    interpolate: linear interpolation along positions (align_corners=False), the usual way to move
        learned positions to a longer context or a larger image side.
    copy: the old table repeated to fill the new length (Longformer's initialisation), cut if shorter.
    """
    old_len = table.shape[0]
    if new_len == old_len:
        return table.clone()
    if mode == "copy":
        reps = math.ceil(new_len / old_len)
        return table.repeat(reps, 1)[:new_len].clone()
    if mode == "interpolate":
        t = table.float().t()[None]  # (1, C, L)
        out = F.interpolate(t, size=new_len, mode="linear", align_corners=False)
        return out[0].t().to(table.dtype).contiguous()  # (new_len, C)
    raise ValueError(f"position resize mode {mode!r}; allowed: {', '.join(POSITION_RESIZE_MODES)}")


def _resize_nearest(table: torch.Tensor, new_len: int) -> torch.Tensor:
    """(L, C) -> (new_len, C), each old row covering new_len / L new rows (image axes)."""
    idx = (torch.arange(new_len) * table.shape[0]) // new_len
    return table[idx.to(table.device)].clone()


# ---- the base model ------------------------------------------------------------------------


class TransformerModel(nn.Module):
    """Shared machinery. Subclasses set self.config, self.blocks, self.attn_op and implement
    forward, init_weights and _lookup_parameters (parameters that are table lookups, no matmul)."""

    config: TransformerConfig
    blocks: nn.ModuleList
    attn_op: AttentionOp
    # state-dict keys of positional tables -> "1d" (sequence axis) or "2d" (an image axis)
    position_tables: dict[str, str] = {}

    def _finish_init(self) -> None:
        if any(p.is_meta for p in self.parameters()):
            return  # built on the meta device: call initialize() after to_empty()
        self.initialize()

    def initialize(self) -> None:
        """Fresh weights (init_weights), then model.init_from's checkpoint if one is configured.

        Runs at construction; a model built under `torch.device("meta")` runs it after
        `to_empty(device=...)` (FSDP2-style deferred init)."""
        self.init_weights()
        if self.config.init_from:
            state = torch.load(self.config.init_from, map_location="cpu", weights_only=True)
            if isinstance(state, dict) and isinstance(state.get("model"), dict):
                state = state["model"]  # a trainer checkpoint
            if not isinstance(state, dict):
                raise ValueError(f"model.init_from={self.config.init_from!r} holds no state dict")
            self.load_state_dict_extended(state, mode=self.config.init_positions)

    def init_weights(self) -> None:
        raise NotImplementedError

    # ---- recomputation

    def recomputes_block(self, i: int) -> bool:
        mode = self.config.recompute
        return mode == "all" or (mode == "every_k" and i % self.config.recompute_every == 0)

    def run_blocks(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """All blocks in order, recomputing the configured ones in the backward pass."""
        grad = torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if grad and self.recomputes_block(i):
                x = checkpoint(block, x, ctx, use_reentrant=False)
            else:
                x = block(x, ctx)
        return x

    # ---- padded batches

    def pack_padded(self, x: torch.Tensor, attention_mask: torch.Tensor | None, ctx_kwargs: dict):
        """Prepare hidden states x (B, T, C) of a padded batch for the blocks.

        Returns (x_in, ctx, restore): flash packs the real tokens (N, C) for the varlen kernel; the
        others keep (B, T, C) with a key-padding mask. restore(y) gives (B, T, C) with zeros at
        padding either way, so every implementation returns the same hidden states.
        """
        if attention_mask is None:
            return x, AttentionContext(**ctx_kwargs), lambda y: y
        mask = attention_mask.to(torch.bool)  # (B, T), True = real token
        if bool(mask.all()):
            return x, AttentionContext(**ctx_kwargs), lambda y: y
        batch, seqlen = mask.shape
        if self.attn_op.supports_varlen:
            unpad, pad, _ = self.attn_op.varlen_ops()
            packed, indices, cu_seqlens, max_seqlen, _ = unpad(x, mask)  # (N, C)
            ctx = AttentionContext(cu_seqlens=cu_seqlens, max_seqlen=int(max_seqlen), **ctx_kwargs)
            return packed, ctx, lambda y: pad(y, indices, batch, seqlen)
        ctx = AttentionContext(key_padding_mask=mask, **ctx_kwargs)
        return x, ctx, lambda y: y.masked_fill(~mask[..., None], 0.0)

    # ---- counts

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Exact parameter count, tied weights once. non_embedding drops lookup-only tables."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self._lookup_parameters()
        return n

    def _lookup_parameters(self) -> int:
        raise NotImplementedError

    def estimate_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward): 6N + 12 * n_layer * d_model * seq_len.

        N counts the parameters used in matmuls (positional / token-type tables are lookups; a tied
        input embedding counts once, as the output head). The attention term is the PaLM / nanoGPT
        convention: QK^T and PV, 2 * 2 * T * d per token per layer forward, times 3 for the backward,
        not halved for causal masks; scaled by the layout's density for block-sparse attention.
        """
        cfg = self.config
        n = self.num_parameters(non_embedding=True)
        density = self.attn_op.density(seq_len, cfg.n_head)
        return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * seq_len * density

    # ---- longer context from a shorter checkpoint

    def load_state_dict_extended(self, state_dict: dict, mode: str = "interpolate", strict=True):
        """load_state_dict, first resizing positional tables whose length differs from this model's.

        1-D (sequence) tables: mode "interpolate" (linear) or "copy" (tile the old table).
        2-D row/column tables (an image side, e.g. 64 -> 128 pixels): "interpolate" (linear, which
        is bilinear on the row + column sum) or "copy" (nearest: each old row covers several).
        """
        if mode not in POSITION_RESIZE_MODES:
            raise ValueError(f"mode={mode!r}; allowed: {', '.join(POSITION_RESIZE_MODES)}")
        own = self.state_dict()
        state = dict(state_dict)
        for key, kind in self.position_tables.items():
            if key not in state or key not in own or state[key].shape == own[key].shape:
                continue
            old, new_len = state[key], own[key].shape[0]
            if old.shape[1:] != own[key].shape[1:]:
                raise ValueError(
                    f"{key}: checkpoint width {tuple(old.shape)} does not match {tuple(own[key].shape)}"
                )
            if kind == "2d" and mode == "copy":
                state[key] = _resize_nearest(old, new_len)
            else:
                state[key] = resize_positions(old, new_len, mode)
        return self.load_state_dict(state, strict=strict)


def normal_init_(module: nn.Module, std: float = 0.02) -> None:
    """N(0, std) weights for Linear and Embedding, zero biases, LayerNorm to (1, 0)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        elif isinstance(m, nn.LayerNorm):
            m.reset_parameters()


def check_seq_len(seqlen: int, max_seq_len: int, what: str = "positional table") -> None:
    if seqlen > max_seq_len:
        raise ValueError(
            f"sequence length {seqlen} exceeds the {what} (model.max_seq_len={max_seq_len}); "
            f"allowed: seq_len <= {max_seq_len}. Build the model with a larger max_seq_len "
            "(configs set it from ${seq_len}) and load shorter checkpoints with "
            "model.init_from / load_state_dict_extended"
        )
