"""Sequence-tiled layers (Arctic Long Sequence Training's tiled MLP, arXiv 2506.13996): a per-token
function of the hidden states run over the tokens in tiles, forward AND backward, so its wide
intermediates exist for one tile at a time. A Llama block's second half,
x + down(silu(gate(norm(x))) * up(norm(x))), keeps (tokens x d_ff) tensors for its backward:
Llama-3-8B's d_ff 14336 at 512K tokens is 56 GiB for one of them in bf16, tiled it is a tile's.

TiledTokens (an autograd Function): the forward runs the tiles under no_grad and saves only the
input and the weights; the backward recomputes each tile with grad enabled (under the autocast
state of the forward) and takes torch.autograd.grad w.r.t. (the tile's input, the weights),
writing the input gradient tile by tile into one buffer and summing the weight gradients in
float32 (at least). The weights are the Function's inputs, so DDP and FSDP2 see one gradient per
parameter, as from any op (torch.autograd.backward inside the backward would fire their hooks once
per tile). Dropout inside a tile would need its RNG replayed per tile: LlamaConfig refuses
tile_tokens with dropout.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


class _AutocastState:
    """The autocast state of one device type, recorded now and re-entered later (as
    torch.utils.checkpoint does for its recompute: the backward runs outside the forward's
    autocast, and a tile must be recomputed in the dtypes it was computed in)."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.enabled = torch.is_autocast_enabled(device_type)
        self.dtype = torch.get_autocast_dtype(device_type)

    def __call__(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


class TiledTokens(torch.autograd.Function):
    """y = body(x, *weights) computed over x's tokens in tiles of at most `tile` tokens.

    body: a per-token function (each output token depends only on the same input token) of
    x (M, C_in) and the weights, returning (M, C_out); x: (..., C_in), any leading shape, padded
    (B, T, C) or packed (N, C): the tokens are its flattened leading dims. Returns (..., C_out).
    """

    @staticmethod
    def forward(ctx, body: Callable, tile: int, x: torch.Tensor, *weights: torch.Tensor):
        rows = x.reshape(-1, x.shape[-1])  # (M, C_in)
        out = None
        for start in range(0, max(rows.shape[0], 1), tile):  # no tokens: one empty tile
            y = body(rows[start : start + tile], *weights)  # (tile, C_out)
            if out is None:  # its dtype is the body's (fp32 residual + autocast's bf16 -> fp32)
                out = y.new_empty((rows.shape[0], y.shape[-1]))
            out[start : start + tile] = y
        ctx.body, ctx.tile = body, tile
        ctx.autocast = _AutocastState(x.device.type)
        ctx.save_for_backward(x, *weights)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, *weights = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[2], ctx.needs_input_grad[3:]
        rows = x.detach().reshape(-1, x.shape[-1])  # (M, C_in)
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])  # (M, C_out)
        # detached leaves: the per-tile graphs end here, never at the parameters (no hooks fire)
        leaves = [w.detach().requires_grad_(n) for w, n in zip(weights, need_w)]
        sums = [
            torch.zeros_like(w, dtype=torch.promote_types(w.dtype, torch.float32)) if n else None
            for w, n in zip(weights, need_w)
        ]
        dx = torch.empty_like(rows) if need_x else None
        for start in range(0, rows.shape[0], ctx.tile):
            tile = rows[start : start + ctx.tile].detach().requires_grad_(need_x)
            with torch.enable_grad(), ctx.autocast():
                y = ctx.body(tile, *leaves)  # (tile, C_out)
            wrt = ([tile] if need_x else []) + [w for w in leaves if w.requires_grad]
            grads = list(torch.autograd.grad(y, wrt, grad_rows[start : start + ctx.tile]))
            if need_x:
                dx[start : start + ctx.tile] = grads.pop(0)
            for total in (s for s in sums if s is not None):
                total += grads.pop(0)
        grad_weights = [None if s is None else s.to(w.dtype) for s, w in zip(sums, weights)]
        return None, None, None if dx is None else dx.view(x.shape), *grad_weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """llama.RMSNorm's formula: x / rms(x) * weight, in float32 at least."""
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _swiglu_residual(x, norm_weight, gate_weight, up_weight, down_weight, *, eps: float):
    h = rms_norm(x, norm_weight, eps)  # (M, C)
    mlp = F.linear(F.silu(F.linear(h, gate_weight)) * F.linear(h, up_weight), down_weight)
    return x + mlp  # (M, C)


def tiled_mlp_residual(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    eps: float,
    tile_tokens: int,
) -> torch.Tensor:
    """x + down(silu(gate(rms_norm(x))) * up(rms_norm(x))) over x's tokens in tiles of at most
    tile_tokens, forward and backward (a Llama block's second half).

    x: (B, T, C) or packed (N, C); norm_weight (C,); gate_weight, up_weight (d_ff, C);
    down_weight (C, d_ff) (nn.Linear's layout, no biases). Returns x's shape."""
    if not isinstance(tile_tokens, int) or isinstance(tile_tokens, bool) or tile_tokens < 1:
        raise ValueError(f"tile_tokens must be an int >= 1, got {tile_tokens!r}")
    if gate_weight.shape != up_weight.shape or down_weight.shape != gate_weight.shape[::-1]:
        raise ValueError(
            f"gate {tuple(gate_weight.shape)}, up {tuple(up_weight.shape)} must be (d_ff, C) "
            f"and down {tuple(down_weight.shape)} (C, d_ff)"
        )

    def body(rows, norm_w, gate_w, up_w, down_w):
        return _swiglu_residual(rows, norm_w, gate_w, up_w, down_w, eps=eps)

    weights = (norm_weight, gate_weight, up_weight, down_weight)
    return TiledTokens.apply(body, tile_tokens, x, *weights)
