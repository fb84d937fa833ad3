"""BERT (Devlin et al. 2019) on the project's attention.

As the original: post-LayerNorm blocks, GELU (erf; model.activation=gelu_tanh: the tanh form, in
the MLPs and the MLM head alike, as the original's hidden_act), learned positions plus token-type
embeddings, an embedding LayerNorm, dropout 0.1 (attention dropout inside the kernel), N(0, 0.02)
init.

    head="mlm"             masked-LM head (dense + GELU + LayerNorm, decoder tied to the word
                           embeddings, own bias), run on the masked tokens only
    head="classification"  pooler (tanh dense on [CLS]) + dropout + linear, for long-document
                           classification

    bert-base   n_layer=12, n_head=12, d_model=768,  d_ff=3072   109,514,298 parameters (mlm head)
    bert-large  n_layer=24, n_head=16, d_model=1024, d_ff=4096   335,174,458

Padded batches (attention_mask, 1 = real token): with attention=flash the real tokens are packed
once (unpad_input), every block runs on them through the varlen kernel, and pad_input puts them back,
so no compute and no attention touches padding; sdpa / reference use a key-padding mask. Outputs are
zero at padded positions in every case, so changing a padded token changes nothing.

Context parallelism (ring attention over ranks that each hold a shard of every sequence): the MLM
head on unpadded batches, with the shard's position_ids; the classification head (the [CLS] token
lives on one rank) and padded batches (no key mask in the ring) are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from flashtrain.models.config import BertConfig
from flashtrain.models.loss import classification_loss, token_loss
from flashtrain.models.positions import token_positions
from flashtrain.models.transformer import ModelOutput, TransformerModel, normal_init_


class Bert(TransformerModel):
    """forward(input_ids, labels, attention_mask=None, token_type_ids=None) -> ModelOutput."""

    Config = BertConfig  # its schema (configs/model/*.yaml with arch: bert)

    causal = False
    position_tables = {"position_embeddings.weight": "1d"}

    def __init__(self, config: BertConfig, attention="flash"):
        super().__init__(config, attention)
        if config.head == "classification" and self.attn_op.splits_sequence:
            raise ValueError(
                "model.head=classification pools the [CLS] token, which only one rank of a "
                "context-parallel group holds; with context parallelism BERT takes head=mlm"
            )
        c = config.d_model
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, c)
        self.position_embeddings = nn.Embedding(config.max_seq_len, c)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, c)
        self.emb_ln = nn.LayerNorm(c, eps=config.layer_norm_eps)
        self.add_blocks(norm="post")
        if config.head == "mlm":
            self.mlm_dense = nn.Linear(c, c)
            # the blocks' GELU: BERT's (and transformers') head transform applies hidden_act
            gelu = "tanh" if config.activation == "gelu_tanh" else "none"
            self.mlm_act = nn.GELU(approximate=gelu)
            self.mlm_ln = nn.LayerNorm(c, eps=config.layer_norm_eps)
            self.mlm_bias = nn.Parameter(torch.zeros(config.padded_vocab_size))
        else:
            self.pooler = nn.Linear(c, c)
            self.cls_drop = nn.Dropout(config.dropout)
            self.classifier = nn.Linear(c, config.num_classes)
        self.finish_init()

    def init_weights(self) -> None:
        normal_init_(self, std=0.02)
        if self.config.head == "mlm":
            nn.init.zeros_(self.mlm_bias)

    def _lookup_parameters(self) -> int:
        return self.position_embeddings.weight.numel() + self.token_type_embeddings.weight.numel()

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids (B, T) -> hidden states (B, T, C), zero at padded positions.
        position_ids (B, T): the tokens' global positions (a context-parallel shard's); None: 0..T-1."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        pos = token_positions(input_ids, position_ids, self.config.max_seq_len)  # (B or 1, T)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)  # (B, T, C)
        x = x + self.token_type_embeddings(token_type_ids)
        x = self.drop(self.emb_ln(x))
        # flash: the real tokens packed as (N, C); otherwise (B, T, C) with a key-padding mask
        x, ctx, restore = self.pack_padded(x, attention_mask, causal=False)
        x = self.run_blocks(x, ctx)
        return restore(x)  # (B, T, C)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """mlm: labels (B, T), -100 = not predicted. classification: labels (B,)."""
        h = self.encode(input_ids, attention_mask, token_type_ids, position_ids)  # (B, T, C)
        cfg = self.config
        if cfg.head == "classification":
            pooled = torch.tanh(self.pooler(h[:, 0]))  # (B, C), the [CLS] token
            logits = self.classifier(self.cls_drop(pooled))  # (B, num_classes)
            loss, num, hits = classification_loss(logits, labels)
            return ModelOutput(loss=loss, num_targets=num, correct=hits, logits=logits)
        if labels.shape != input_ids.shape:
            raise ValueError(
                f"mlm labels {tuple(labels.shape)} must have the shape of input_ids "
                f"{tuple(input_ids.shape)}"
            )
        keep = labels.reshape(-1) != -100
        h = h.reshape(-1, cfg.d_model)[keep]  # (N, C): the masked tokens only
        h = self.mlm_ln(self.mlm_act(self.mlm_dense(h)))
        weight = self.word_embeddings.weight[: cfg.vocab_size]  # tied decoder (V, C)
        bias = self.mlm_bias[: cfg.vocab_size]
        loss, num, hits = token_loss(
            h,
            labels.reshape(-1)[keep],
            weight,
            bias,
            impl=cfg.loss_impl,
            chunk_size=cfg.loss_chunk_size,
            compute_hits=not self.training,  # MLM accuracy is an evaluation metric only
        )
        return ModelOutput(loss=loss, num_targets=num, correct=hits)
