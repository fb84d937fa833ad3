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
Context parallelism (each rank holds a shard of every image): mean pooling sums over all the
shards (Attention.sequence_mean), positions come with the batch (position_ids); cls pooling and
padding masks are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from flashtrain.models.config import ClassifierConfig
from flashtrain.models.loss import classification_loss
from flashtrain.models.positions import check_seq_len, grid_positions
from flashtrain.models.transformer import ModelOutput, TransformerModel, normal_init_


class SequenceClassifier(TransformerModel):
    """forward(input_ids, labels, attention_mask=None) -> ModelOutput with logits (B, classes)."""

    Config = ClassifierConfig  # its schema (configs/model/*.yaml with arch: classifier)

    def __init__(self, config: ClassifierConfig, attention="flash"):
        super().__init__(config, attention)
        if config.pooling == "cls" and self.attn_op.splits_sequence:
            raise ValueError(
                "model.pooling=cls prepends a token that would unbalance the context-parallel "
                "shards and live on one rank; with context parallelism use model.pooling=mean"
            )
        self.causal = config.causal
        c = config.d_model
        self.tok_emb = nn.Embedding(config.padded_vocab_size, c)
        if config.position == "2d":
            self.pos_row = nn.Embedding(config.image_size, c)
            self.pos_col = nn.Embedding(config.image_size, c)
            self.position_tables = {"pos_row.weight": "2d", "pos_col.weight": "2d"}
        else:
            self.pos_emb = nn.Embedding(config.max_seq_len, c)
            self.position_tables = {"pos_emb.weight": "1d"}
        self.cls_token = nn.Parameter(torch.zeros(c)) if config.pooling == "cls" else None
        self.add_blocks(norm=config.norm)
        self.ln_f = nn.LayerNorm(c, eps=config.layer_norm_eps) if config.norm == "pre" else None
        self.head = nn.Linear(c, config.num_classes)
        self.finish_init()

    def init_weights(self) -> None:
        normal_init_(self, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, mean=0.0, std=0.02)

    def _lookup_parameters(self) -> int:
        n = self.tok_emb.weight.numel()
        for key in self.position_tables:
            n += self.get_parameter(key).numel()
        return n

    def positions(self, seqlen: int, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(T, C) positional embeddings for a sequence of T tokens, or (B, T, C) for the global
        positions position_ids (B, T) of a context-parallel shard (2d: of the whole image)."""
        cfg = self.config
        if cfg.position == "1d":
            if position_ids is None:
                check_seq_len(seqlen, cfg.max_seq_len)
            table = self.pos_emb.weight  # (max_seq_len, C)
        else:
            pixels = seqlen if position_ids is None else cfg.image_size**2
            table = grid_positions(self.pos_row.weight, self.pos_col.weight, pixels)  # (T, C)
        return table[:seqlen] if position_ids is None else table[position_ids]

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ):
        """input_ids (B, T) -> (hidden (B, T', C) zero at padding, mask (B, T') or None);
        T' = T + 1 with the CLS token first. position_ids (B, T): see positions()."""
        batch, seqlen = input_ids.shape
        x = self.tok_emb(input_ids) + self.positions(seqlen, position_ids)  # (B, T, C)
        if self.cls_token is not None:
            cls = self.cls_token.expand(batch, 1, -1)  # (B, 1, C)
            x = torch.cat((cls, x), dim=1)  # (B, T + 1, C)
            if attention_mask is not None:
                ones = torch.ones_like(attention_mask[:, :1])
                attention_mask = torch.cat((ones, attention_mask), dim=1)
        x = self.drop(x)
        x, ctx, restore = self.pack_padded(x, attention_mask, causal=self.causal)
        x = self.run_blocks(x, ctx)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return restore(x), attention_mask

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        h, mask = self.encode(input_ids, attention_mask, position_ids)  # (B, T', C)
        if self.config.pooling == "cls":
            pooled = h[:, 0]  # (B, C)
        elif mask is None:
            pooled = self.attn_op.sequence_mean(h)  # (B, C), over every rank's shard
        else:
            count = mask.sum(dim=1, keepdim=True).clamp(min=1).to(h.dtype)  # (B, 1)
            pooled = h.sum(dim=1) / count  # padding rows are zero
        logits = self.head(pooled)  # (B, num_classes)
        loss, num, hits = classification_loss(logits, labels)
        return ModelOutput(loss=loss, num_targets=num, correct=hits, logits=logits)
