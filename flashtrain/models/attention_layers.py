"""Which attention a model runs: one nn.Module class per impl, picked by configs/attention/<impl>.yaml
(each class carries its config dataclass as `Config`; ATTENTION lists the classes).

    impl: flash        FlashAttention: ours, dense (flashtrain.attention.flash_attn_func); a padded
                       batch is packed once (unpad_input) and runs through flash_attn_varlen_func
    impl: blocksparse  BlockSparseAttention: ours, block-sparse (blocksparse_attn_func) with a
                       pattern from flashtrain.attention.sparsity and its parameters
    impl: sdpa         SDPAAttention: torch.nn.functional.scaled_dot_product_attention (the baseline),
                       attention.backend pins one of its kernels (flash, cudnn, efficient, math)
    impl: reference    ReferenceAttention: plain PyTorch math materialising the (T, T) scores

All four take the same q, k, v (B, T, H, D) and give the same result up to rounding. Dropout on
the attention probabilities is the call's `dropout_p` (fused inside our kernels).

    attention = build_attention(cfg)      # cfg: an AttentionConfig, or a mapping with `impl`

Context parallelism is not a choice of the attention config: the trainer (trainer.context_parallel)
builds a RingAttention or UlyssesAttention (split_attention.py) from the user's flash config, and
the model takes that object in place of a config. Each rank then holds a shard of every sequence
and the op makes attention exact over the whole sequence.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtrain.attention import (
    blocksparse_attn_func,
    flash_attn_func,
    flash_attn_varlen_func,
    pad_input,
    sparsity,
    unpad_input,
)
from flashtrain.attention.reference import allowed_mask, attention_reference, fold_window
from flashtrain.attention.validation import MAX_HEAD_DIM
from flashtrain.typed_config import Registry, check_choice

# ---- configs (the schemas of configs/attention/*.yaml) -----------------------------------------


@dataclass
class AttentionConfig:
    impl: str = "flash"  # which impl: the key of ATTENTION_IMPLS


@dataclass
class FlashAttentionConfig(AttentionConfig):
    impl: str = "flash"


# attention.backend of impl sdpa: which of PyTorch's kernels runs (auto: PyTorch's own choice)
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,  # FlashAttention-2
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


@dataclass
class SDPAAttentionConfig(AttentionConfig):
    impl: str = "sdpa"
    # auto (PyTorch picks) | flash | cudnn | efficient | math: a pinned backend that cannot run
    # a call (its dtype, head_dim or mask) is PyTorch's error, not a silent fallback
    backend: str = "auto"

    def __post_init__(self):
        check_choice(self.backend, ("auto", *SDPA_BACKENDS), "attention.backend")


@dataclass
class ReferenceAttentionConfig(AttentionConfig):
    impl: str = "reference"


@dataclass
class BlockSparseAttentionConfig(AttentionConfig):
    impl: str = "blocksparse"
    pattern: str = "butterfly"  # a name in flashtrain.attention.sparsity.PATTERNS
    block_size: int = 128  # one of sparsity.SUPPORTED_BLOCK_SIZES
    # The pattern function's own keyword arguments; the model passes seqlen, heads and block_size.
    pattern_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        check_choice(self.pattern, tuple(sparsity.PATTERNS), "attention.pattern")
        check_choice(self.block_size, sparsity.SUPPORTED_BLOCK_SIZES, "attention.block_size")
        self.pattern_args = dict(self.pattern_args or {})


@dataclass
class AttentionContext:
    """What every attention call in one forward pass shares.

    Padded layout: hidden states (B, T, C), optional key_padding_mask (B, T) bool, True = real token.
    Packed layout (flash on a padded batch): hidden states (N, C) of the real tokens only, with
    cu_seqlens int32 (B + 1,) and max_seqlen.
    Context parallelism with document masking: hidden states stay (B, T_local, C) (this rank's
    shard) and `documents` is the WHOLE batch's document table (host ints, prefix sums over the
    flattened (B * T) tokens, as one process would pass cu_seqlens), max_seqlen its longest.
    rotary: (cos, sin), each broadcastable against q (..., H, D/2), or None.
    window_size: (left, right) keys each query sees around itself, -1 = unbounded (flash-attn's
    sliding window); softcap > 0: scores s become softcap * tanh(s / softcap). Backends that
    cannot do either refuse the model at build time (Attention.check_model).
    """

    causal: bool = False
    key_padding_mask: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    documents: tuple[int, ...] | None = None
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None


def varies_per_batch(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t, its size along `dim` marked as one that changes from batch to batch (the packed token
    count, the number of documents): a compiled block traces it symbolic from its first call
    instead of recompiling for the second size (flashtrain/train/compile.py). Free in eager."""
    if not torch.compiler.is_compiling():  # marks are set on inputs, never while tracing
        torch._dynamo.maybe_mark_dynamic(t, dim)
    return t


# ---- impls -----------------------------------------------------------------------------------


class Attention(nn.Module):
    """Scaled dot-product self-attention by one impl. No parameters.

    forward(q, k, v, ctx, dropout_p) with q, k, v (B, T, H, D), or (N, H, D) packed when the
    impl packs padded batches (FlashAttention). Returns like q.
    """

    Config: ClassVar[type[AttentionConfig]]
    runs_our_kernels: ClassVar[bool] = False  # the kernels' head_dim rule applies
    splits_sequence: ClassVar[bool] = False  # each rank holds a shard of each sequence
    supports_window: ClassVar[bool] = False  # AttentionContext.window_size
    supports_softcap: ClassVar[bool] = False  # AttentionContext.softcap

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg

    @property
    def impl(self) -> str:
        return self.cfg.impl

    def extra_repr(self) -> str:
        return f"impl={self.impl}"

    def check_model(self, config) -> None:
        """What this impl needs of the model config (a TransformerConfig): our kernels take
        head_dim multiples of 8 up to MAX_HEAD_DIM."""
        head_dim = config.head_dim
        if self.runs_our_kernels and (head_dim % 8 != 0 or head_dim > MAX_HEAD_DIM):
            raise ValueError(
                f"attention={self.impl} needs head_dim = d_model / n_head to be a multiple of 8 "
                f"up to {MAX_HEAD_DIM}; got {config.d_model} / {config.n_head} = {head_dim}"
            )
        # model configs with a sliding window / score softcap name them so (LlamaConfig)
        if getattr(config, "sliding_window", None) and not self.supports_window:
            raise ValueError(
                f"{self.describe()} has no sliding window: model.sliding_window="
                f"{config.sliding_window} needs attention=flash (or sdpa / reference) on one "
                "process; set model.sliding_window=null to attend to the whole context"
            )
        if getattr(config, "attn_logit_softcap", None) and not self.supports_softcap:
            raise ValueError(
                f"{self.describe()} has no score softcap: model.attn_logit_softcap="
                f"{config.attn_logit_softcap} needs attention=flash or reference on one process"
            )

    def describe(self) -> str:
        """How refusals name this impl."""
        return f"attention={self.impl}"

    def sequence_mean(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, C): the mean over the sequence axis of the whole sequence."""
        return x.mean(dim=1)

    def density(self, seqlen: int, heads: int = 1) -> float:
        """Fraction of (query, key) blocks attended: 1.0 for dense attention."""
        return 1.0

    def padded_context(self, x: torch.Tensor, mask: torch.Tensor, **ctx_kwargs):
        """Hidden states x (B, T, C) of a padded batch (mask (B, T) bool, True = real token) as
        the blocks take them: (x_in, ctx, restore), restore(y) giving (B, T, C) with zeros at
        padding. Here: the padded layout with a key-padding mask."""
        ctx = AttentionContext(key_padding_mask=mask, **ctx_kwargs)
        return x, ctx, lambda y: y.masked_fill(~mask[..., None], 0.0)

    def _refuse_packed(self, ctx: AttentionContext) -> None:
        if ctx.packed:
            raise ValueError(f"packed (varlen) batches need attention impl flash, not {self.impl}")


class FlashAttention(Attention):
    Config = FlashAttentionConfig
    runs_our_kernels = True
    supports_window = True
    supports_softcap = True

    def padded_context(self, x, mask, **ctx_kwargs):
        """The real tokens packed once as (N, C) for the varlen kernel: no compute on padding."""
        batch, seqlen = mask.shape
        packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(x, mask)  # (N, C)
        ctx = AttentionContext(cu_seqlens=cu_seqlens, max_seqlen=int(max_seqlen), **ctx_kwargs)
        packed = varies_per_batch(packed, 0)  # N: the batch's real tokens
        return packed, ctx, lambda y: pad_input(y, indices, batch, seqlen)

    def forward(self, q, k, v, ctx: AttentionContext, dropout_p: float = 0.0) -> torch.Tensor:
        options = dict(causal=ctx.causal, dropout_p=dropout_p, window_size=ctx.window_size)
        if ctx.softcap:
            options["softcap"] = ctx.softcap
        if ctx.packed:  # (N, H, D)
            s = ctx.max_seqlen
            cu = ctx.cu_seqlens
            return flash_attn_varlen_func(q, k, v, cu, cu, s, s, **options)
        if ctx.key_padding_mask is not None:  # a padded (B, T, H, D) call: pack, attend, unpack
            batch, seqlen = q.shape[:2]
            qkv = torch.stack((q, k, v), dim=2)  # (B, T, 3, H, D)
            packed, indices, cu, s, _ = unpad_input(qkv, ctx.key_padding_mask)  # (N, 3, H, D)
            qp, kp, vp = packed.unbind(1)  # (N, H, D) each
            out = flash_attn_varlen_func(qp, kp, vp, cu, cu, s, s, **options)
            return pad_input(out, indices, batch, seqlen)  # (B, T, H, D), zeros at padding
        return flash_attn_func(q, k, v, **options)


class BlockSparseAttention(Attention):
    """The configured pattern's layout, built once per (seqlen, heads) and cached (the layout
    caches its compiled block tables per device and causal flag itself)."""

    Config = BlockSparseAttentionConfig
    runs_our_kernels = True
    NO_PADDING = (
        "blocksparse attention has no key-padding mask: feed unpadded batches, or use "
        "attention=flash (varlen kernel), sdpa or reference for padded ones"
    )

    def __init__(self, cfg: BlockSparseAttentionConfig):
        super().__init__(cfg)
        self._pattern_fn = sparsity.PATTERNS[cfg.pattern]
        self._layouts: dict[tuple[int, int], sparsity.BlockSparseLayout] = {}

    def extra_repr(self) -> str:
        return f"impl=blocksparse, pattern={self.cfg.pattern}, block_size={self.cfg.block_size}"

    def layout(self, seqlen: int, heads: int) -> sparsity.BlockSparseLayout:
        key = (seqlen, heads)
        if key not in self._layouts:
            self._layouts[key] = self._build_layout(seqlen, heads)
        return self._layouts[key]

    def _build_layout(self, seqlen: int, heads: int) -> sparsity.BlockSparseLayout:
        cfg, filled = self.cfg, ("seqlen", "heads", "block_size")
        reserved = sorted(set(filled) & set(cfg.pattern_args))
        if reserved:
            raise ValueError(
                f"attention.pattern_args must not set {reserved}: the model fills them in"
            )
        try:
            return self._pattern_fn(
                seqlen, block_size=cfg.block_size, heads=heads, **cfg.pattern_args
            )
        except TypeError as e:
            own = [n for n in inspect.signature(self._pattern_fn).parameters if n not in filled]
            raise ValueError(
                f"block-sparse pattern {cfg.pattern!r} rejected attention.pattern_args="
                f"{cfg.pattern_args}: {e}. Its own parameters: {own}"
            ) from None

    def density(self, seqlen: int, heads: int = 1) -> float:
        return float(self.layout(seqlen, heads).density)

    def padded_context(self, x, mask, **ctx_kwargs):
        raise ValueError(self.NO_PADDING)

    def forward(self, q, k, v, ctx: AttentionContext, dropout_p: float = 0.0) -> torch.Tensor:
        self._refuse_packed(ctx)
        if ctx.key_padding_mask is not None:
            raise ValueError(self.NO_PADDING)
        layout = self.layout(q.shape[1], q.shape[2])  # (B, T, H, D)
        return blocksparse_attn_func(
            q, k, v, layout, block_size=self.cfg.block_size, causal=ctx.causal, dropout_p=dropout_p
        )


class SDPAAttention(Attention):
    Config = SDPAAttentionConfig
    supports_window = True  # as an explicit (T, T) mask

    def forward(self, q, k, v, ctx: AttentionContext, dropout_p: float = 0.0) -> torch.Tensor:
        self._refuse_packed(ctx)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        mask, attn_mask = ctx.key_padding_mask, None
        t = q.shape[-2]
        windowed = tuple(ctx.window_size) != (-1, -1)
        if windowed or (mask is not None and ctx.causal):
            window = fold_window(tuple(ctx.window_size), ctx.causal, t)
            attn_mask = allowed_mask(t, t, window, device=q.device)  # (T, T)
        if mask is not None:
            padding = mask[:, None, None, :].to(torch.bool)  # (B, 1, 1, T)
            attn_mask = padding if attn_mask is None else attn_mask & padding
        backend = self.cfg.backend
        pinned = sdpa_kernel(SDPA_BACKENDS[backend]) if backend != "auto" else nullcontext()
        with pinned:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=ctx.causal and attn_mask is None,
                enable_gqa=k.shape[1] != q.shape[1],
            )
        return out.transpose(1, 2)  # (B, T, H, D)

    def extra_repr(self) -> str:
        return f"impl=sdpa, backend={self.cfg.backend}"


class ReferenceAttention(Attention):
    Config = ReferenceAttentionConfig
    supports_window = True
    supports_softcap = True

    def forward(self, q, k, v, ctx: AttentionContext, dropout_p: float = 0.0) -> torch.Tensor:
        self._refuse_packed(ctx)
        batch, seqlen, heads, _ = q.shape
        mask = ctx.key_padding_mask
        element_mask = None if mask is None else mask[:, None, None, :].to(torch.bool)
        dropout_mask = None
        if dropout_p > 0.0:  # (B, H, T, T)
            dropout_mask = (
                torch.rand(batch, heads, seqlen, k.shape[1], device=q.device) >= dropout_p
            )
        out, _ = attention_reference(
            q,
            k,
            v,
            causal=ctx.causal,
            window_size=tuple(ctx.window_size),
            softcap=ctx.softcap,
            element_mask=element_mask,
            dropout_mask=dropout_mask,
            dropout_p=dropout_p,
        )
        return out


# The impls `attention.impl` picks (RingAttention is the trainer's, built from a flash config).
ATTENTION = Registry(
    "impl", "attention", [FlashAttention, BlockSparseAttention, SDPAAttention, ReferenceAttention]
)
ATTENTION_IMPLS: dict[str, type[Attention]] = ATTENTION.classes
ATTENTION_CONFIGS: dict[str, type[AttentionConfig]] = ATTENTION.configs


def attention_config(cfg: Any) -> AttentionConfig:
    """The config of the impl `cfg.impl` names, from an instance, a mapping or an impl name."""
    if isinstance(cfg, str):
        cfg = {"impl": cfg}
    return ATTENTION.config(cfg)


def build_attention(cfg: Any) -> Attention:
    """The impl for a config (an AttentionConfig, a mapping with `impl`, an impl name);
    an Attention object (e.g. a RingAttention the trainer built) is taken as it is."""
    if isinstance(cfg, Attention):
        return cfg
    cfg = attention_config(cfg)
    return ATTENTION.build_class(cfg)(cfg)
