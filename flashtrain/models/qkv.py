"""The fused q, k, v projection, split into three views without a copy either way.

`c_attn(x).view(..., 3, H, D).unbind()` makes no copy going forward, but unbind's backward stacks
dq, dk and dv into a new (tokens, 3, H, D) gradient before the projection's backward reads it:
one activation-sized copy per layer. Here the backward reads the three gradients where the
attention op left them: dx = dq Wq^T-rows + dk Wk + dv Wv (three matmuls accumulating into one
buffer), and the weight's gradient as three (C, C) blocks (a weight-sized concatenation, no
activation-sized one). Under autocast it computes as F.linear would (inputs cast to the autocast
dtype) and returns each gradient in its input's dtype.
"""

from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class _SplitQKVProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, heads: int):
        # x (M, C), weight (3C, C), bias (3C,) or None
        dtype = _compute_dtype(x)
        xc, wc = x.to(dtype), weight.to(dtype)
        bc = bias.to(dtype) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            qkv = torch.nn.functional.linear(xc, wc, bc)  # (M, 3C)
        ctx.save_for_backward(xc, wc)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype if bias is not None else None)
        width = weight.shape[0] // 3
        return qkv.view(x.shape[0], 3, heads, width // heads).unbind(1)  # (M, H, D) each

    @staticmethod
    def backward(ctx, dq, dk, dv):
        xc, wc = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        rows, width = xc.shape[0], wc.shape[0] // 3
        parts = []
        for grad in (dq, dk, dv):  # (M, H, D) each; an unused output's is None
            grad = (
                torch.zeros(rows, width, dtype=xc.dtype, device=xc.device) if grad is None else grad
            )
            parts.append(grad.reshape(rows, width).to(xc.dtype))
        weights = wc.split(width)  # Wq, Wk, Wv: (C, C) each
        dx = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            dx = parts[0] @ weights[0]  # (M, C)
            for g, w in zip(parts[1:], weights[1:]):
                dx.addmm_(g, w)
            dx = dx.to(x_dtype)
        if ctx.needs_input_grad[1]:
            grad_w = torch.cat([g.t() @ xc for g in parts]).to(w_dtype)  # (3C, C)
        if b_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = torch.cat([g.sum(0) for g in parts]).to(b_dtype)  # (3C,)
        return dx, grad_w, grad_b, None


def split_qkv_projection(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (..., C) -> q, k, v (..., H, D): views of the one (..., 3, H, D) projection
    x @ weight.T + bias, with weight (3C, C) in [q; k; v] row blocks (GPT-2's c_attn)."""
    lead = x.shape[:-1]
    q, k, v = _SplitQKVProjection.apply(x.reshape(-1, x.shape[-1]), weight, bias, heads)
    return tuple(t.view(*lead, *t.shape[1:]) for t in (q, k, v))
