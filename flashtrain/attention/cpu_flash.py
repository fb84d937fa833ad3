"""The CPU fast path: ATen's fused flash-attention kernel for CPU, for the calls it covers
exactly and as accurately as the rest of the project: float32, no dropout, block mask, softcap
or ALiBi, no window, causal only with seqlen_q == seqlen_k (where its top-left alignment equals
our bottom-right one), and no empty sequence (it divides by zero there: SIGFPE). In fp16/bf16
its gradients are 1.5-3x the error of the same math in PyTorch, over the project's 2x rule, so
low precision goes to torch_path's chunked code, which computes in float32. It keeps O and the
log-sum-exp like ours and recomputes in its backward, so memory stays linear."""

from __future__ import annotations

import torch


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts) -> bool:
    """opts: a torch_path.AttentionOptions (window folded, sides >= seqlen_k already -1)."""
    if (
        q.device.type != "cpu"
        or q.dtype != torch.float32
        or q.numel() == 0
        or k.numel() == 0
        or opts.dropout_p > 0.0
        or opts.block_mask is not None
        or opts.softcap > 0.0
        or opts.alibi_slopes is not None
    ):
        return False
    dense = opts.window == (-1, -1)
    causal_square = opts.window == (-1, 0) and q.shape[1] == k.shape[1]
    # Its causal kernel lets a NaN/inf of V past the diagonal reach earlier rows (0 * NaN);
    # masked entries never contribute (docs/attention_semantics.md): the chunked path keeps that.
    return dense or (causal_square and bool(torch.isfinite(k).all() & torch.isfinite(v).all()))


def _to_bhsd(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B, S, H, D) -> (B, H*group, S, D), each kv head repeated for its query heads."""
    x = x.transpose(1, 2)
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def forward(q, k, v, *, scale, window):
    """q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D) -> out like q, lse (B, Hq, Sq) float32."""
    group = q.shape[2] // k.shape[2]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(1, 2), _to_bhsd(k, group), _to_bhsd(v, group), 0.0, window == (-1, 0),
        scale=scale,
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), lse.float()


def backward(dout, q, k, v, out, lse, *, scale, window):
    """Gradients (dq, dk, dv); GQA sums each kv head's gradient over its query heads."""
    batch, seqlen_k, heads_kv, head_dim = k.shape
    group = q.shape[2] // heads_kv
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout.transpose(1, 2), q.transpose(1, 2), _to_bhsd(k, group), _to_bhsd(v, group),
        out.transpose(1, 2), lse, 0.0, window == (-1, 0), scale=scale,
    )  # fmt: skip
    if group > 1:
        dk = dk.view(batch, heads_kv, group, seqlen_k, head_dim).sum(2)
        dv = dv.view(batch, heads_kv, group, seqlen_k, head_dim).sum(2)
    return dq.transpose(1, 2), dk.transpose(1, 2).to(k.dtype), dv.transpose(1, 2).to(v.dtype)
