"""A transformer sequence classifier for pixel or token sequences (Path-X / Path-256, LRA style).

Tokens: 256 pixel values by default (vocab_size). Positions:
    position="2d"  learned row and column tables (side = sqrt(max_seq_len)), added: pos[r, c] =
                   row[r] + col[c]. Pre-train on a small image and fine-tune on a larger one: the
                   FlashAttention paper trains Path-64 and moves to Path-X (128 x 128 = 16K tokens) and
                   Path-256 (64K tokens) by upsampling the positions; model.init_from (or
                   load_state_dict_extended) interpolates the row/column tables to the new side.
    position="1d"  one learned table over the flattened sequence (also resizable).
Pooling: "mean" over the real tokens, or "cls" (a learned token prepended). N classes.
Pre-LayerNorm by default (norm="post" as in the LRA baselines is an option).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from flashtrain.models.attention_impl import AttentionConfig, AttentionOp
from flashtrain.models.loss import classification_loss
from flashtrain.models.transformer import (
    Block,
    ModelOutput,
    TransformerConfig,
    TransformerModel,
    check_seq_len,
    normal_init_,
)

CLASSIFIER_POSITIONS = ("1d", "2d")
CLASSIFIER_POOLING = ("mean", "cls")
CLASSIFIER_NORMS = ("pre", "post")


@dataclass
class ClassifierConfig(TransformerConfig):
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_ff: int | None = 256
    max_seq_len: int = 1024
    vocab_size: int = 256  # pixel intensities
    num_classes: int = 2
    position: str = "2d"  # 2d | 1d
    pooling: str = "mean"  # mean | cls
    norm: str = "pre"  # pre | post
    causal: bool = False
    dropout: float = 0.1
    attn_dropout: float = 0.0
    activation: str = "gelu"

    def __post_init__(self):
        super().__post_init__()
        for key, allowed in (
            ("position", CLASSIFIER_POSITIONS),
            ("pooling", CLASSIFIER_POOLING),
            ("norm", CLASSIFIER_NORMS),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(
                    f"model.{key}={getattr(self, key)!r}; allowed: {', '.join(allowed)}"
                )
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


class SequenceClassifier(TransformerModel):
    """forward(input_ids, labels, attention_mask=None) -> ModelOutput with logits (B, classes)."""

    def __init__(self, config: ClassifierConfig, attention: AttentionConfig | dict | str = "flash"):
        super().__init__()
        self.config = config
        self.causal = config.causal
        self.attn_op = AttentionOp(AttentionConfig.from_any(attention))
        config.check_attention(self.attn_op)
        c = config.d_model
        self.tok_emb = nn.Embedding(config.vocab_size, c)
        if config.position == "2d":
            self.pos_row = nn.Embedding(config.image_size, c)
            self.pos_col = nn.Embedding(config.image_size, c)
            self.position_tables = {"pos_row.weight": "2d", "pos_col.weight": "2d"}
        else:
            self.pos_emb = nn.Embedding(config.max_seq_len, c)
            self.position_tables = {"pos_emb.weight": "1d"}
        self.cls_token = nn.Parameter(torch.zeros(c)) if config.pooling == "cls" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            [Block(config, self.attn_op, norm=config.norm) for _ in range(config.n_layer)]
        )
        self.ln_f = nn.LayerNorm(c, eps=config.layer_norm_eps) if config.norm == "pre" else None
        self.head = nn.Linear(c, config.num_classes)
        self._finish_init()

    def init_weights(self) -> None:
        normal_init_(self, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, mean=0.0, std=0.02)

    def _lookup_parameters(self) -> int:
        n = self.tok_emb.weight.numel()
        for key in self.position_tables:
            n += self.get_parameter(key).numel()
        return n

    def positions(self, seqlen: int) -> torch.Tensor:
        """(T, C) positional embeddings for a sequence of T tokens."""
        cfg = self.config
        if cfg.position == "1d":
            check_seq_len(seqlen, cfg.max_seq_len)
            return self.pos_emb.weight[:seqlen]
        side = cfg.image_size
        if seqlen != side * side:
            raise ValueError(
                f"position=2d: sequence length {seqlen} is not this model's image of "
                f"{side}x{side} = {side * side} pixels; allowed: seq_len == {side * side} "
                "(build the model for the new image size and load with init_from to upsample)"
            )
        grid = self.pos_row.weight[:, None, :] + self.pos_col.weight[None, :, :]  # (S, S, C)
        return grid.reshape(side * side, -1)  # (T, C), row-major like the flattened image

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """input_ids (B, T) -> (hidden (B, T', C) zero at padding, mask (B, T') or None);
        T' = T + 1 with the CLS token first."""
        batch, seqlen = input_ids.shape
        x = self.tok_emb(input_ids) + self.positions(seqlen)  # (B, T, C)
        if self.cls_token is not None:
            cls = self.cls_token.expand(batch, 1, -1)  # (B, 1, C)
            x = torch.cat((cls, x), dim=1)  # (B, T + 1, C)
            if attention_mask is not None:
                ones = torch.ones_like(attention_mask[:, :1])
                attention_mask = torch.cat((ones, attention_mask), dim=1)
        x = self.drop(x)
        x, ctx, restore = self.pack_padded(x, attention_mask, dict(causal=self.causal))
        x = self.run_blocks(x, ctx)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return restore(x), attention_mask

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        h, mask = self.encode(input_ids, attention_mask)  # (B, T', C)
        if self.config.pooling == "cls":
            pooled = h[:, 0]  # (B, C)
        elif mask is None:
            pooled = h.mean(dim=1)
        else:
            count = mask.sum(dim=1, keepdim=True).clamp(min=1).to(h.dtype)  # (B, 1)
            pooled = h.sum(dim=1) / count  # padding rows are zero
        logits = self.head(pooled)  # (B, num_classes)
        loss, num, hits = classification_loss(logits, labels)
        return ModelOutput(loss=loss, num_targets=num, correct=hits, logits=logits)
