"""Rotary embeddings as flash-attn's decode API takes them: tables (seqlen_ro, rotary_dim / 2)
looked up at per-token positions, applied to the first rotary_dim features of each head.

    interleaved=True:  pairs (x[2j], x[2j+1]) rotate by angle j (GPT-J)
    interleaved=False: halves (x[j], x[j + rotary_dim / 2]) rotate by angle j (GPT-NeoX, Llama)

Features past rotary_dim pass unchanged. Computed in float32, returned in x's dtype.
"""

from __future__ import annotations

import torch


def check_rotary_tables(cos: torch.Tensor, sin: torch.Tensor, head_dim: int, device) -> None:
    """cos, sin: float (seqlen_ro, rotary_dim / 2), rotary_dim even and <= head_dim."""
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
            got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must be a float tensor (seqlen_ro, rotary_dim / 2), got {got}"
            )
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")
    if cos.shape != sin.shape:
        raise ValueError(
            f"rotary_cos and rotary_sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if not 1 <= 2 * cos.shape[1] <= head_dim:
        raise ValueError(
            f"rotary_dim = 2 * rotary_cos.shape[1] = {2 * cos.shape[1]} must be between 2 and "
            f"head_dim={head_dim}"
        )


def apply_rotary_at(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    """x (B, S, H, D) rotated at positions (B, S) int64 (rows of the tables); a new tensor."""
    half = cos.shape[1]
    rot = 2 * half
    c = cos[positions].float()[:, :, None, :]  # (B, S, 1, rd/2)
    s = sin[positions].float()[:, :, None, :]
    xr = x[..., :rot].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]  # (B, S, H, rd/2)
        rotated = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rot:]), dim=-1)
