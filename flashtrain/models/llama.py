"""Llama-family decoders (Llama 2/3, Mistral, Qwen 2-style) on the project's attention.

Pre-RMSNorm blocks, rotary positions (rotary.py: none | linear | dynamic | yarn | llama3
scaling), grouped-query attention (n_kv_head K/V heads shared by n_head / n_kv_head query
heads each; the kernels read them as they are, no copies), a SwiGLU MLP, no biases. Optional:
a Mistral-style sliding window (the kernels' window), Gemma-2-style softcaps on the attention
scores and on the final logits, a head tied to the token embedding.

    llama-125m  n_layer=12, n_head=12, n_kv_head=4, d_model=768            (~125M at vocab 32000)
    llama-1b    Llama-3.2-1B's shape: 16 x 2048, 32 heads / 8 KV heads, tied   1,235,814,400
    llama3-8b   Llama-3-8B's shape:   32 x 4096, 32 heads / 8 KV heads         8,030,261,248

Module names follow transformers' LlamaForCausalLM (q_proj ... down_proj), so weights map one to
one. Positions restart per document with document masking (position_ids from the data
pipeline) and are each rank's global positions under context parallelism. There is no
positional table: any sequence length runs; a checkpoint trained at a shorter context loads as
it is (model.init_from), and rope_scaling says how the positions stretch to the longer one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from flashtrain.models.attention_layers import Attention, AttentionContext
from flashtrain.models.config import LlamaConfig
from flashtrain.models.loss import token_loss
from flashtrain.models.positions import apply_rotary, token_positions
from flashtrain.models.rotary import inverse_frequencies, rotary_cos_sin
from flashtrain.models.tiled import tiled_mlp_residual
from flashtrain.models.transformer import ModelOutput, TransformerModel


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 at least (as Llama does for 16-bit inputs)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, C)


class GroupedQueryAttention(nn.Module):
    """q: n_head heads, k and v: n_kv_head heads, rotary on q and k, the attention op (which
    takes the K/V heads as they are: query head h reads K/V head h // (n_head / n_kv_head))."""

    def __init__(self, cfg: LlamaConfig, attn_op: Attention):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.attn_dropout = cfg.attn_dropout
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_dim, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.attn_op = attn_op

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        lead = x.shape[:-1]  # (B, T) padded or (N,) packed
        q = self.q_proj(x).view(*lead, self.n_head, self.head_dim)  # (B, T, H, D)
        k = self.k_proj(x).view(*lead, self.n_kv_head, self.head_dim)  # (B, T, Hkv, D)
        v = self.v_proj(x).view(*lead, self.n_kv_head, self.head_dim)
        cos, sin = ctx.rotary  # (..., 1, D/2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = self.attn_dropout if self.training else 0.0
        y = self.attn_op(q, k, v, ctx, dropout_p=p)  # (B, T, H, D)
        return self.o_proj(y.reshape(*lead, -1))  # (B, T, C)


class LlamaBlock(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); with tile_tokens > 0 and more tokens than that,
    the second half runs over the tokens in tiles of tile_tokens, forward and backward (tiled.py:
    no (tokens x d_ff) tensor exists whole)."""

    def __init__(self, cfg: LlamaConfig, attn_op: Attention):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.self_attn = GroupedQueryAttention(cfg, attn_op)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)
        self.drop = nn.Dropout(cfg.dropout)
        self.tile_tokens = cfg.tile_tokens  # 0: off (the config refuses it with dropout)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.drop(self.self_attn(self.input_layernorm(x), ctx))  # (B, T, C) or (N, C)
        if self.tile_tokens and x.numel() // x.shape[-1] > self.tile_tokens:
            norm, mlp = self.post_attention_layernorm, self.mlp
            return tiled_mlp_residual(
                x,
                norm.weight,
                mlp.gate_proj.weight,
                mlp.up_proj.weight,
                mlp.down_proj.weight,
                eps=norm.eps,
                tile_tokens=self.tile_tokens,
            )
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Llama(TransformerModel):
    """Causal language model. forward(input_ids, labels) -> ModelOutput."""

    causal = True
    Config = LlamaConfig  # its schema (configs/model/llama-*.yaml with arch: llama)
    mlp_widths = 4  # SwiGLU keeps gate, up, silu(gate) and their product

    def __init__(self, config: LlamaConfig, attention="flash"):
        super().__init__(config, attention)
        self.embed_tokens = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            [LlamaBlock(config, self.attn_op) for _ in range(config.n_layer)]
        )
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps)
        if config.tie_embeddings:
            self.lm_head = None  # the head is embed_tokens.weight, counted and stored once
        else:
            self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self.finish_init()

    def init_weights(self) -> None:
        """N(0, init_std) for embeddings and linears, RMSNorm gains 1; the residual branches'
        output projections N(0, init_std / sqrt(2 * n_layer)) (GPT-2's depth scaling)."""
        std = self.config.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        std_resid = std / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.self_attn.o_proj.weight, mean=0.0, std=std_resid)
            nn.init.normal_(block.mlp.down_proj.weight, mean=0.0, std=std_resid)

    def _lookup_parameters(self) -> int:
        """The token embedding is a lookup unless it is also the head."""
        return 0 if self.lm_head is None else self.embed_tokens.weight.numel()

    def attended_keys(self, seq_len: int) -> float:
        """Keys per query on average (the FLOP count's, TransformerModel.estimate_flops_per_token):
        causal, and within the sliding window when it is shorter: a query sees min(i + 1, window)
        keys, window * (1 - window / (2 * seq_len)) on average. GQA's narrower k/v projections
        and SwiGLU's three matrices are in N as they are, and the attention term counts every
        query head (QK^T and PV do not shrink with fewer K/V heads)."""
        window = self.config.sliding_window
        if not window or window >= seq_len:
            return super().attended_keys(seq_len)
        return window * (1 - window / (2 * seq_len))

    # ---- forward

    def _sequence_length(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        max_seqlen: int | None,
    ) -> int | None:
        """The length of the sequences this call covers, for a RoPE scaling that depends on it
        (dynamic), else None: the whole sequence under context parallelism, the longest
        document of a packed batch (max_seqlen: its positions restart at 0 in every document,
        so it is the largest position + 1), the row length without position_ids. Each is known
        on the host; only explicit positions outside those layouts (a decode step) are read
        from the tensor, which on a GPU waits for it."""
        if not self.config.rope_scaling.depends_on_length:
            return None
        if max_seqlen is not None:
            return int(max_seqlen)
        if self.attn_op.splits_sequence:
            return input_ids.shape[1] * self.attn_op.size
        if position_ids is None:
            return input_ids.shape[1]
        return int(position_ids.max()) + 1

    def rotary_tables(self, positions: torch.Tensor, seq_len: int | None = None):
        """cos, sin (*positions.shape, D/2) float32 for this model's RoPE and its scaling."""
        cfg = self.config
        inv_freq, factor = inverse_frequencies(
            cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, seq_len, positions.device
        )
        return rotary_cos_sin(positions, inv_freq, factor)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids (B, T) -> final hidden states (B, T, C) after the last RMSNorm.

        position_ids (B, T) int64: the tokens' positions when they are not 0..T-1 (a
        context-parallel shard's global positions, or positions restarting per document).
        Document masking (cu_seqlens, max_seqlen, position_ids from data/packing.py): the rows'
        tokens run packed as (B * T, C) through the varlen kernel, each cu_seqlens sequence
        attending only within itself; under context parallelism cu_seqlens is the whole batch's
        table (host ints) and the hidden states stay this rank's shard (document_fields)."""
        batch, seqlen = input_ids.shape
        cfg = self.config
        packed, documents = self.document_fields(cu_seqlens, max_seqlen, position_ids)
        pos = token_positions(input_ids, position_ids, None)  # (B, T) or (1, T)
        length = self._sequence_length(input_ids, position_ids, max_seqlen)
        ids = input_ids
        if packed:  # (N,) tokens and their positions
            ids, pos = input_ids.reshape(-1), pos.reshape(-1)
        x = self.drop(self.embed_tokens(ids))  # (B, T, C) or (N, C)
        cos, sin = self.rotary_tables(pos, length)  # (B or 1, T, D/2) or (N, D/2)
        ctx = AttentionContext(
            causal=self.causal,
            **documents,
            rotary=(cos[..., None, :], sin[..., None, :]),  # (..., 1, D/2)
            window_size=(cfg.sliding_window - 1, 0) if cfg.sliding_window else (-1, -1),
            softcap=cfg.attn_logit_softcap or 0.0,
        )
        x = self.run_blocks(x, ctx)  # (B, T, C) or (N, C)
        return self.norm(x).view(batch, seqlen, -1)  # (B, T, C)

    def output_weight(self) -> torch.Tensor:
        """The head's (vocab_size, C) weight, without vocab padding rows."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return head.weight[: self.config.vocab_size]

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
        with record_function("flashtrain::loss"):
            loss, num, _ = token_loss(
                h,
                labels,
                self.output_weight(),
                impl="chunked" if cfg.final_logit_softcap else cfg.loss_impl,
                chunk_size=cfg.loss_chunk_size,
                logit_softcap=cfg.final_logit_softcap or 0.0,
                compute_hits=False,
            )
        return ModelOutput(loss=loss, num_targets=num)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., C) -> logits (..., vocab_size): the LM head, then the final softcap; what
        the loss scores (inference samples and evaluates through this, not a copy of it)."""
        z = hidden @ self.output_weight().t()
        cap = self.config.final_logit_softcap
        return cap * torch.tanh(z / cap) if cap else z

    def logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None):
        """Full (B, T, vocab_size) logits, for inspection and sampling (materialises them)."""
        return self.head_logits(self.hidden_states(input_ids, position_ids=position_ids))
