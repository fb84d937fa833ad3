"""Which attention a model runs, chosen by configs/attention/<name>.yaml.

    impl: flash        ours, dense (flashtrain.attention.flash_attn_func); padded batches go through
                       unpad_input -> flash_attn_varlen_func -> pad_input, so nothing attends to padding
    impl: blocksparse  ours, block-sparse (flashtrain.attention.blocksparse_attn_func) with a named
                       pattern from flashtrain.attention.sparsity and its parameters
    impl: sdpa         torch.nn.functional.scaled_dot_product_attention, the baseline in comparisons
    impl: reference    plain PyTorch math that materialises the (T, T) scores, for debugging

All four take the same q, k, v (B, T, H, D) and give the same result up to rounding. Dropout on the
attention probabilities is the op's `dropout_p` (fused inside our kernels).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from flashtrain.attention import (
    blocksparse_attn_func,
    flash_attn_func,
    flash_attn_varlen_func,
    pad_input,
    sparsity,
    unpad_input,
)
from flashtrain.attention.reference import attention_reference
from flashtrain.attention.validation import MAX_HEAD_DIM
from flashtrain.config_dict import to_plain_dict

ATTENTION_IMPLS = ("flash", "blocksparse", "sdpa", "reference")
BLOCKSPARSE_PATTERNS = ("butterfly", "local", "global_local", "bigbird", "strided")
BLOCKSPARSE_BLOCK_SIZES = (64, 128)
# The head dims our kernels take (flashtrain.attention.validation): multiples of 8 up to this.
KERNEL_MAX_HEAD_DIM = MAX_HEAD_DIM


@dataclass
class AttentionConfig:
    """configs/attention/<name>.yaml. `pattern`, `block_size`, `pattern_args` are for blocksparse."""

    impl: str = "flash"
    name: str = ""
    pattern: str | None = None
    block_size: int = 128
    pattern_args: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"unknown attention impl {self.impl!r}; allowed: {', '.join(ATTENTION_IMPLS)}"
            )
        if self.impl == "blocksparse":
            if self.pattern not in BLOCKSPARSE_PATTERNS:
                raise ValueError(
                    f"unknown block-sparse pattern {self.pattern!r}; allowed: "
                    f"{', '.join(BLOCKSPARSE_PATTERNS)}"
                )
            if self.block_size not in BLOCKSPARSE_BLOCK_SIZES:
                raise ValueError(
                    f"attention.block_size={self.block_size} is not supported; allowed: "
                    f"{', '.join(map(str, BLOCKSPARSE_BLOCK_SIZES))}"
                )
        self.pattern_args = dict(self.pattern_args or {})

    @classmethod
    def from_any(cls, cfg) -> AttentionConfig:
        """From a dict, an OmegaConf DictConfig, an AttentionConfig, or an impl name."""
        if isinstance(cfg, AttentionConfig):
            return cfg
        if isinstance(cfg, str):
            return cls(impl=cfg)
        d = to_plain_dict(cfg, what="attention config")
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown attention config key(s) {unknown}; allowed: {', '.join(allowed)}"
            )
        return cls(**d)


@dataclass
class AttentionContext:
    """What every attention call in one forward pass shares.

    Padded layout: hidden states (B, T, C), optional key_padding_mask (B, T) bool, True = real token.
    Packed layout (flash on a padded batch): hidden states (N, C) of the real tokens only, with
    cu_seqlens int32 (B + 1,) and max_seqlen.
    rotary: (cos, sin), each broadcastable against q (..., H, D/2), or None.
    """

    causal: bool = False
    key_padding_mask: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None


class AttentionOp(nn.Module):
    """Scaled dot-product self-attention by the configured implementation. No parameters."""

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        self.impl = cfg.impl
        self._layouts: dict = {}
        if self.impl == "blocksparse":
            fn = sparsity.PATTERNS.get(cfg.pattern)
            if fn is None:
                raise ValueError(
                    f"flashtrain.attention.sparsity has no pattern {cfg.pattern!r}; "
                    f"available: {', '.join(sparsity.PATTERNS) or 'none'}"
                )
            self._pattern_fn = fn

    def extra_repr(self) -> str:
        if self.impl == "blocksparse":
            return f"impl=blocksparse, pattern={self.cfg.pattern}, block_size={self.cfg.block_size}"
        return f"impl={self.impl}"

    @property
    def supports_varlen(self) -> bool:
        """True when padded batches should be packed (unpadded) before the blocks."""
        return self.impl == "flash"

    @staticmethod
    def varlen_ops():
        """(unpad_input, pad_input, flash_attn_varlen_func): the packing ops for padded batches."""
        return unpad_input, pad_input, flash_attn_varlen_func

    # ---- block-sparse layouts -------------------------------------------------------------

    def layout(self, seqlen: int, heads: int):
        """The pattern's BlockSparseLayout for this shape, built once and cached (the layout
        caches its compiled block tables per device and causal flag itself)."""
        key = (seqlen, heads)
        if key not in self._layouts:
            self._layouts[key] = self._build_layout(seqlen, heads)
        return self._layouts[key]

    def _build_layout(self, seqlen: int, heads: int):
        cfg = self.cfg
        reserved = sorted({"seqlen", "heads", "block_size"} & set(cfg.pattern_args))
        if reserved:
            raise ValueError(
                f"attention.pattern_args must not set {reserved}: the model fills them in"
            )
        try:
            return self._pattern_fn(
                seqlen, block_size=cfg.block_size, heads=heads, **cfg.pattern_args
            )
        except TypeError as e:
            params = [
                n
                for n in inspect.signature(self._pattern_fn).parameters
                if n not in ("seqlen", "heads", "block_size")
            ]
            raise ValueError(
                f"block-sparse pattern {cfg.pattern!r} rejected attention.pattern_args="
                f"{cfg.pattern_args}: {e}. Its own parameters: {params}"
            ) from None

    def density(self, seqlen: int, heads: int = 1) -> float:
        """Fraction of (query, key) blocks kept by the pattern: 1.0 for dense attention."""
        if self.impl != "blocksparse":
            return 1.0
        return float(self.layout(seqlen, heads).density)

    # ---- the call ------------------------------------------------------------------------

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: AttentionContext,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """q, k, v: (B, T, H, D), or (N, H, D) packed with ctx.cu_seqlens. Returns like q."""
        if ctx.packed:
            if self.impl != "flash":
                raise ValueError(
                    f"packed (varlen) batches need attention impl flash, not {self.impl}"
                )
            _, _, varlen = self.varlen_ops()
            s = ctx.max_seqlen
            return varlen(
                q,
                k,
                v,
                ctx.cu_seqlens,
                ctx.cu_seqlens,
                s,
                s,
                causal=ctx.causal,
                dropout_p=dropout_p,
            )
        mask = ctx.key_padding_mask  # (B, T) bool or None
        if self.impl == "flash":
            if mask is not None:
                return self._flash_padded(q, k, v, mask, ctx.causal, dropout_p)
            return flash_attn_func(q, k, v, causal=ctx.causal, dropout_p=dropout_p)
        if self.impl == "blocksparse":
            if mask is not None:
                raise ValueError(
                    "blocksparse attention has no key-padding mask: feed unpadded batches, or use "
                    "attention=flash (varlen kernel), sdpa or reference for padded ones"
                )
            layout = self.layout(q.shape[1], q.shape[2])  # (B, T, H, D)
            return blocksparse_attn_func(
                q,
                k,
                v,
                layout,
                block_size=self.cfg.block_size,
                causal=ctx.causal,
                dropout_p=dropout_p,
            )
        if self.impl == "sdpa":
            return self._sdpa(q, k, v, mask, ctx.causal, dropout_p)
        return self._reference(q, k, v, mask, ctx.causal, dropout_p)

    def _flash_padded(self, q, k, v, mask, causal, dropout_p):
        unpad, pad, varlen = self.varlen_ops()
        batch, seqlen = q.shape[:2]
        qkv = torch.stack((q, k, v), dim=2)  # (B, T, 3, H, D)
        packed, indices, cu, max_s, _ = unpad(qkv, mask)  # (N, 3, H, D)
        qp, kp, vp = packed.unbind(1)  # (N, H, D) each
        out = varlen(qp, kp, vp, cu, cu, max_s, max_s, causal=causal, dropout_p=dropout_p)
        return pad(out, indices, batch, seqlen)  # (B, T, H, D), zeros at padding

    @staticmethod
    def _sdpa(q, k, v, mask, causal, dropout_p):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        attn_mask = None
        if mask is not None:
            attn_mask = mask[:, None, None, :].to(torch.bool)  # (B, 1, 1, T)
            if causal:
                t = q.shape[-2]
                tril = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
                attn_mask = attn_mask & tril
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal and mask is None
        )
        return out.transpose(1, 2)  # (B, T, H, D)

    @staticmethod
    def _reference(q, k, v, mask, causal, dropout_p):
        batch, seqlen, heads, _ = q.shape
        element_mask = None if mask is None else mask[:, None, None, :].to(torch.bool)
        dropout_mask = None
        if dropout_p > 0.0:
            keep = torch.rand(batch, heads, seqlen, k.shape[1], device=q.device) >= dropout_p
            dropout_mask = keep  # (B, H, T, T)
        out, _ = attention_reference(
            q,
            k,
            v,
            causal=causal,
            element_mask=element_mask,
            dropout_mask=dropout_mask,
            dropout_p=dropout_p,
        )
        return out
