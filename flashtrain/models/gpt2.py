"""GPT-2 (Radford et al. 2019) on the project's attention.

Shapes exactly as the original: pre-LayerNorm blocks, GELU (tanh), biases everywhere, learned
positions, the output head tied to the token embedding, vocab 50257.

    gpt2         n_layer=12, n_head=12, d_model=768     124,439,808 parameters at 1024 positions
    gpt2-medium  n_layer=24, n_head=16, d_model=1024    354,823,168
    gpt2-large   n_layer=36, n_head=20, d_model=1280    774,030,080
    gpt2-xl      n_layer=48, n_head=25, d_model=1600  1,557,611,200

Long context: the positional table has max_seq_len rows (configs: ${seq_len}, 16K and 64K work);
load_state_dict_extended / model.init_from bring a shorter-context checkpoint's positions along by
interpolation or copying. position="rotary" drops the table for rotary embeddings on q and k.
The loss never materialises (tokens, vocab) logits in float32 at once (see loss.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.profiler import record_function

from flashtrain.models.attention_layers import AttentionContext
from flashtrain.models.config import GPT2Config
from flashtrain.models.loss import token_loss
from flashtrain.models.positions import token_positions
from flashtrain.models.rotary import rotary_tables
from flashtrain.models.transformer import ModelOutput, TransformerModel, normal_init_


class GPT2(TransformerModel):
    """Causal language model. forward(input_ids, labels) -> ModelOutput."""

    Config = GPT2Config  # its schema (configs/model/*.yaml with arch: gpt2)

    causal = True

    def __init__(self, config: GPT2Config, attention="flash"):
        super().__init__(config, attention)
        self.wte = nn.Embedding(config.padded_vocab_size, config.d_model)
        if config.position == "learned":
            self.wpe = nn.Embedding(config.max_seq_len, config.d_model)
            self.position_tables = {"wpe.weight": "1d"}
        else:
            self.wpe = None
        self.add_blocks(norm="pre")
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        # The output head is self.wte.weight (tied), so it is counted and stored once.
        self.finish_init()

    def init_weights(self) -> None:
        """GPT-2: N(0, 0.02), zero biases; residual projections N(0, 0.02 / sqrt(2 * n_layer))."""
        normal_init_(self, std=0.02)
        std_resid = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=std_resid)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=std_resid)

    def _lookup_parameters(self) -> int:
        return 0 if self.wpe is None else self.wpe.weight.numel()

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids (B, T) -> final hidden states (B, T, C) after ln_f.

        position_ids (B, T) int64: the tokens' positions when they are not 0..T-1 (a
        context-parallel shard's global positions, or positions restarting per document).
        Document masking (all three from the data pipeline, data/packing.py): the rows' tokens
        run packed as (B * T, C) through the varlen kernel, each cu_seqlens sequence attending
        only within itself."""
        batch, seqlen = input_ids.shape
        cfg = self.config
        packed, documents = self.document_fields(cu_seqlens, max_seqlen, position_ids)
        table_len = cfg.max_seq_len if self.wpe is not None else None
        pos = token_positions(input_ids, position_ids, table_len)  # (B, T) or (1, T)
        ids = input_ids
        if packed:  # (N,) tokens and their positions
            ids, pos = input_ids.reshape(-1), pos.reshape(-1)
        x = self.wte(ids)  # (B, T, C) or (N, C)
        rotary = None
        if self.wpe is not None:
            x = x + self.wpe(pos)  # + (B or 1, T, C) or (N, C)
        else:
            cos, sin = rotary_tables(
                pos, cfg.head_dim, cfg.rotary_base
            )  # (B or 1, T, D/2) or (N, D/2)
            rotary = (cos[..., None, :], sin[..., None, :])  # (..., 1, D/2)
        x = self.drop(x)
        ctx = AttentionContext(causal=self.causal, rotary=rotary, **documents)
        x = self.run_blocks(x, ctx)  # (B, T, C) or (N, C)
        return self.ln_f(x).view(batch, seqlen, -1)  # (B, T, C)

    def output_weight(self) -> torch.Tensor:
        """The head's (vocab_size, C) weight: the token embedding without vocab padding rows."""
        return self.wte.weight[: self.config.vocab_size]

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        """input_ids (B, T) int64; labels (B, T) int64, the next tokens, -100 = ignore;
        cu_seqlens, max_seqlen, position_ids: see hidden_states."""
        if labels.shape != input_ids.shape:
            raise ValueError(
                f"labels {tuple(labels.shape)} must have the shape of input_ids {tuple(input_ids.shape)}"
            )
        h = self.hidden_states(input_ids, cu_seqlens, max_seqlen, position_ids)  # (B, T, C)
        cfg = self.config
        with record_function("flashtrain::loss"):  # a named range for scripts/profile_step.py
            loss, num, _ = token_loss(
                h,
                labels,
                self.output_weight(),
                impl=cfg.loss_impl,
                chunk_size=cfg.loss_chunk_size,
                compute_hits=False,  # no accuracy for a language model: skip the argmax
            )
        return ModelOutput(loss=loss, num_targets=num)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., C) -> logits (..., vocab_size): the LM head (tied to the embedding)."""
        return hidden @ self.output_weight().t()

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full (B, T, vocab_size) logits, for inspection and sampling (materialises them)."""
        return self.head_logits(self.hidden_states(input_ids))
