"""A decoder's KV cache, attached through the models' per-layer attention hook.

Every attention layer of a decoder (GPT-2's SelfAttention, the Llama family's) calls
`self.attn_op(q, k, v, ctx, dropout_p)` with q and k already carrying their positions (rotary
applied). That attribute is the hook: `KVCache.attached(model)` swaps each layer's attn_op for
one that reads and writes this layer's slice of the cache, and puts the original back after.
A new architecture needs nothing more than that call convention.

Two phases, chosen by the cache's state:
    prefill   a right-padded (B, P) batch of prompts: each layer stores k, v at 0..P-1 and runs
              its own attention (the flash kernels, causal): padding after a prompt never
              reaches the prompt's tokens.
    decode    one token per sequence at position seqlens[b]: flash_attn_with_kvcache appends
              k, v there and attends the first seqlens[b] + 1 keys (split-KV kernel).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from flashtrain.attention import flash_attn_with_kvcache


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` with an `attn_op` (one per attention layer, in module order)."""
    layers = [
        m
        for m in model.modules()  # the model's own attn_op (the shared backend) is no layer
        if m is not model and isinstance(getattr(m, "attn_op", None), nn.Module)
    ]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no attention layer with an attn_op: the KV cache "
            "hooks into each layer's attn_op(q, k, v, ctx, dropout_p)"
        )
    return layers


def kv_cache_bytes(model: nn.Module, batch: int, max_len: int) -> int:
    """Bytes of a KVCache(batch, max_len) on `model` once every layer has its buffers: layers x
    2 (k and v) x batch x max_len x K/V heads x head_dim x the weights' element size (the
    dtype k has without autocast), known before anything is allocated."""
    cfg = model.config
    kv_heads = getattr(cfg, "n_kv_head", None) or cfg.n_head  # GQA's, or one per query head
    element = model.output_weight().element_size()
    return len(attention_layers(model)) * 2 * batch * max_len * kv_heads * cfg.head_dim * element


class _CachedAttention(nn.Module):
    """Stands in for one layer's attn_op while a cache is attached."""

    def __init__(self, cache: KVCache, layer: int, original: nn.Module):
        super().__init__()
        self.cache, self.layer, self.original = cache, layer, original

    def forward(self, q, k, v, ctx, dropout_p: float = 0.0) -> torch.Tensor:
        return self.cache.attend(self.layer, q, k, v, ctx, self.original)


class KVCache:
    """Keys and values of every attention layer: (batch, max_len, heads_kv, head_dim) each,
    allocated at a layer's first call in its k's dtype and device; seqlens int32 (batch,) on
    the same device: the tokens each sequence holds."""

    def __init__(self, batch: int, max_len: int):
        self.batch, self.max_len = batch, max_len
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        self.seqlens: torch.Tensor | None = None
        self.prefilled = False

    @contextlib.contextmanager
    def attached(self, model: nn.Module):
        """Inside the block, every module of `model` with an `attn_op` (one per attention layer,
        in module order) attends through this cache."""
        layers = attention_layers(model)
        originals = [m.attn_op for m in layers]
        self.layers += [None] * (len(layers) - len(self.layers))
        try:
            for i, (m, op) in enumerate(zip(layers, originals)):
                m.attn_op = _CachedAttention(self, i, op)
            yield self
        finally:
            for m, op in zip(layers, originals):
                m.attn_op = op

    def _buffers(self, layer: int, k: torch.Tensor):
        if self.layers[layer] is None:
            shape = (self.batch, self.max_len, *k.shape[2:])
            self.layers[layer] = (k.new_zeros(shape), k.new_zeros(shape))
        return self.layers[layer]

    def attend(self, layer, q, k, v, ctx, original) -> torch.Tensor:
        """q, k, v (B, T, H, D) of one layer: prefill (T tokens from position 0) or decode (T
        new tokens after seqlens)."""
        k_cache, v_cache = self._buffers(layer, k)
        if not self.prefilled:
            seqlen = k.shape[1]
            k_cache[:, :seqlen], v_cache[:, :seqlen] = k, v
            return original(q, k, v, ctx, 0.0)
        return flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, cache_seqlens=self.seqlens, causal=True,
            # a context that carries a sliding window or a soft-cap (the Llama family's) keeps it
            window_size=getattr(ctx, "window_size", (-1, -1)),
            softcap=getattr(ctx, "softcap", 0.0) or 0.0,
        )  # fmt: skip

    def finish_prefill(self, lengths: torch.Tensor) -> None:
        """After the prompts' pass: sequence b holds its first lengths[b] tokens."""
        self.seqlens = lengths.to(torch.int32)
        self.prefilled = True

    def advance(self, count: int = 1) -> None:
        """After a decode pass: every sequence holds `count` more tokens."""
        self.seqlens = self.seqlens + count
