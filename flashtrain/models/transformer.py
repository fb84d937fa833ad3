"""The transformer block every model here is built from, and what the models share.

Block: LayerNorm, multi-head self-attention (the configured attention impl), LayerNorm, MLP, residuals;
pre-LayerNorm (GPT-2, the classifier) or post-LayerNorm (BERT). A block takes hidden states either
padded (B, T, C) or packed (N, C) (the real tokens of a padded batch, for the varlen kernel): every
layer but attention is per token, and attention reads the layout from the AttentionContext.

TransformerModel: the base class of GPT2, Bert, SequenceClassifier and Llama: recomputation of whole
blocks (none / all / every_k / offload: all, with the block inputs in host memory, offload.py),
parameter and FLOP counts, loading a checkpoint with shorter positional tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from flashtrain.models.attention_layers import (
    Attention,
    AttentionContext,
    build_attention,
    varies_per_batch,
)
from flashtrain.models.config import TransformerConfig
from flashtrain.models.offload import BlockInputOffload
from flashtrain.models.positions import apply_rotary, resize_position_tables
from flashtrain.models.qkv import split_qkv_projection

# Training FLOPs of attention per (query, key) pair per channel: QK^T and PV forward (2 * 2),
# the backward 2.5x that (five matmuls): the FlashAttention papers' count.
ATTENTION_FLOPS_PER_KEY = 4.0 * 3.5


@dataclass
class ModelOutput:
    """What model(**batch) returns (docs/interfaces.md)."""

    loss: torch.Tensor  # float32 scalar, mean over the counted targets
    num_targets: torch.Tensor  # int64 scalar: targets counted in loss
    correct: torch.Tensor | None = None  # int64 scalar: argmax hits (mlm, classification)
    logits: torch.Tensor | None = None  # (B, num_classes), classification only


class SelfAttention(nn.Module):
    """Fused q, k, v projection, the attention op, output projection (GPT-2's c_attn / c_proj)."""

    def __init__(self, d_model: int, n_head: int, attn_op: Attention, attn_dropout: float):
        super().__init__()
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.attn_dropout = attn_dropout
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.attn_op = attn_op

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        lead = x.shape[:-1]  # (B, T) padded or (N,) packed
        # views of one (B, T, 3, H, D) projection; its backward stacks no gradients (qkv.py)
        q, k, v = split_qkv_projection(x, self.c_attn.weight, self.c_attn.bias, self.n_head)
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

    def __init__(self, cfg: TransformerConfig, attn_op: Attention, norm: str = "pre"):
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


# ---- the base model ------------------------------------------------------------------------


class TransformerModel(nn.Module):
    """Shared machinery of GPT2, Bert and SequenceClassifier. A subclass's __init__ calls
    super().__init__(config, attention), adds its embeddings, then add_blocks(norm), its head, and
    finish_init(); it implements forward, init_weights and _lookup_parameters (parameters that are
    table lookups, no matmul)."""

    # state-dict keys of positional tables -> "1d" (sequence axis) or "2d" (an image axis)
    position_tables: dict[str, str] = {}
    # tensors d_ff wide an MLP keeps for its backward (GELU: input, output), for memory estimates
    mlp_widths = 2
    causal = False  # a causal mask (GPT2, Llama): what the FLOP count's attention term halves

    def __init__(self, config: TransformerConfig, attention):
        super().__init__()
        self.config = config
        self.attn_op = build_attention(attention)  # one impl object shared by every block
        self.attn_op.check_model(config)
        self.block_offload = BlockInputOffload()  # recompute=offload's host buffers, reused

    def add_blocks(self, norm: str) -> None:
        """Embedding dropout and the blocks, registered after the embeddings (parameter order)."""
        cfg = self.config
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg, self.attn_op, norm) for _ in range(cfg.n_layer)])

    def finish_init(self) -> None:
        """Fresh weights, unless built on the meta device: then flashtrain.models.materialize
        initialises them where they are placed (each rank its shards), and weights from a
        checkpoint come after, as a step of their own (flashtrain.checkpoint.initial_weights)."""
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    def init_weights(self) -> None:
        """Fresh weights in place; elementwise draws only (normal, zeros, ones), so it runs as
        well on one rank's shards of every tensor (materialize.py)."""
        raise NotImplementedError

    # ---- recomputation

    def recomputes_block(self, i: int) -> bool:
        mode = self.config.recompute
        if mode in ("all", "offload"):
            return True
        return mode == "every_k" and i % self.config.recompute_every == 0

    def run_blocks(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """All blocks in order, recomputing the configured ones in the backward pass; with
        recompute=offload every block's input but the last one's waits in host memory."""
        grad = torch.is_grad_enabled()
        if grad and self.config.recompute == "offload":
            return self._run_blocks_offloaded(x, ctx)
        for i, block in enumerate(self.blocks):
            if grad and self.recomputes_block(i):
                x = checkpoint(block, x, ctx, use_reentrant=False)
            else:
                x = block(x, ctx)
        return x

    def _run_blocks_offloaded(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """recompute=all with checkpoint's saved block inputs moved to the host (offload.py)."""
        forward = self.block_offload.forward_pass()
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            with forward.saving_input(x, to_host=i != last):  # the backward needs the last first
                x = checkpoint(block, x, ctx, use_reentrant=False)
        return x

    # ---- document masking

    def document_fields(self, cu_seqlens, max_seqlen, position_ids) -> tuple[bool, dict]:
        """How a batch's documents (data/packing.py) reach attention: (packed, AttentionContext
        fields). One process: the rows' tokens run packed as (N, C) through the varlen kernel.
        Context parallelism: the hidden states stay this rank's (B, T_local, C) shard and the op
        gets the whole batch's table as host ints (`documents`), which it plans its work from."""
        if cu_seqlens is None:
            return False, {}
        if position_ids is None or max_seqlen is None:
            raise ValueError("cu_seqlens needs max_seqlen and position_ids (data/packing.py)")
        if not self.attn_op.splits_sequence:  # the number of documents changes per batch
            return True, {"cu_seqlens": varies_per_batch(cu_seqlens, 0), "max_seqlen": max_seqlen}
        if isinstance(cu_seqlens, torch.Tensor):
            if cu_seqlens.device.type != "cpu":
                raise ValueError(
                    "under context parallelism cu_seqlens must stay on the host (a tuple of ints "
                    "or a CPU tensor): each rank plans its attention from it without a device sync"
                )
            cu_seqlens = cu_seqlens.tolist()
        return False, {"documents": tuple(int(c) for c in cu_seqlens), "max_seqlen": max_seqlen}

    # ---- padded batches

    def pack_padded(self, x: torch.Tensor, attention_mask: torch.Tensor | None, **ctx_kwargs):
        """Hidden states x (B, T, C) of a possibly padded batch as the blocks take them:
        (x_in, ctx, restore), restore(y) giving (B, T, C) with zeros at padding, so every
        attention impl returns the same hidden states (Attention.padded_context)."""
        if attention_mask is None or bool(attention_mask.all()):
            return x, AttentionContext(**ctx_kwargs), lambda y: y
        mask = attention_mask.to(torch.bool)  # (B, T), True = real token
        return self.attn_op.padded_context(x, mask, **ctx_kwargs)

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
        """Training FLOPs per token (forward + backward): 6N + 14 * n_layer * d_model * keys.

        N counts the parameters used in matmuls (positional / token-type tables are lookups; a tied
        input embedding counts once, as the output head). Attention is counted as FlashAttention
        counts it (flashtrain/lab/bench/flops.py, so the MFU of a training run and the TFLOP/s of
        the attention benchmarks agree): QK^T and PV are 4 FLOPs per (query, key) pair per
        channel forward, the backward 2.5x the forward, 14 in all; `keys` is the keys a query
        attends on average (attended_keys: half the sequence under a causal mask), scaled by the
        layout's density for block-sparse attention."""
        cfg = self.config
        n = self.num_parameters(non_embedding=True)
        density = self.attn_op.density(seq_len, cfg.n_head)
        keys = self.attended_keys(seq_len)
        return 6.0 * n + ATTENTION_FLOPS_PER_KEY * cfg.n_layer * cfg.d_model * keys * density

    def attended_keys(self, seq_len: int) -> float:
        """Keys per query on average: seq_len, halved under a causal mask (FlashAttention's
        S * S / 2; the diagonal is not counted apart)."""
        return seq_len / 2 if self.causal else float(seq_len)

    # ---- longer context from a shorter checkpoint

    def load_state_dict_extended(
        self, state_dict: dict, mode: str = "interpolate", strict=True, assign=False
    ):
        """load_state_dict, first resizing positional tables whose length differs from this
        model's (positions.resize_position_tables: mode "interpolate" or "copy").

        assign=True, for a model built on the meta device: the model takes the tensors
        themselves instead of copying them into allocated ones (an 8B model's weights sit in
        host memory once, not twice), each converted to the model's dtype where it differs."""
        own = self.state_dict()
        state = resize_position_tables(state_dict, own, self.position_tables, mode)
        if assign:
            state = {k: v.to(own[k].dtype) if k in own else v for k, v in state.items()}
        return self.load_state_dict(state, strict=strict, assign=assign)


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
