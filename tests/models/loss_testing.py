"""Shared pieces of the loss tests: random LM-head inputs, a float64 reference built from plain
PyTorch (F.cross_entropy on the full logits), and the tolerance rule of the attention tests: the
error at most 2x the error of the same math done in PyTorch in the same low precision, plus a
floor relative to the values' size."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flashtrain.models.chunked_cross_entropy import LossOptions
from flashtrain.models.fused_cross_entropy import fused_linear_cross_entropy
from flashtrain.models.loss import linear_cross_entropy

IGNORE = -100
FLOOR = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}
GRAD_SCALE = 0.37  # backward of GRAD_SCALE * loss_sum: the incoming gradient is not 1


def head_inputs(n, c, v, *, dtype=torch.float32, bias=False, ignored=0, seed=0):
    """hidden (n, c), weight (v, c), bias (v,) or None, targets (n,) with `ignored` of them
    set to IGNORE; logits of about unit-to-a-few scale so the softmax is neither flat nor one-hot."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, c, generator=g)
    w = torch.randn(v, c, generator=g) * (2.0 / math.sqrt(c))
    b = 0.5 * torch.randn(v, generator=g) if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    y[torch.randperm(n, generator=g)[:ignored]] = IGNORE
    cast = lambda t: None if t is None else t.to(dtype)
    return cast(h), cast(w), cast(b), y


def run_loss(h, w, y, b=None, *, autocast_dtype=None, **kwargs) -> dict:
    """loss_sum, hits and the gradients of GRAD_SCALE * loss_sum through linear_cross_entropy."""
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    b = None if b is None else b.detach().clone().requires_grad_()
    with torch.autocast(
        h.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
    ):
        loss, hits = linear_cross_entropy(h, w, y, b, **kwargs)
    (loss * GRAD_SCALE).backward()
    return {"loss": loss.detach(), "hits": hits, "dh": h.grad, "dw": w.grad,
            "db": None if b is None else b.grad}  # fmt: skip


def reference(h, w, y, b=None, *, ignore_index=IGNORE, label_smoothing=0.0, z_loss=0.0) -> dict:
    """The same quantities in float64 from the full logits and F.cross_entropy."""
    h, w = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b = None if b is None else b.detach().double().requires_grad_()
    z = h @ w.t() + (0 if b is None else b)  # (N, V)
    loss = F.cross_entropy(
        z, y, ignore_index=ignore_index, reduction="sum", label_smoothing=label_smoothing
    )
    keep = y != ignore_index
    loss = loss + z_loss * (torch.logsumexp(z, dim=-1)[keep] ** 2).sum()
    (loss * GRAD_SCALE).backward()
    hits = ((z.argmax(dim=-1) == y) & keep).sum()
    return {"loss": loss.detach(), "hits": hits, "dh": h.grad, "dw": w.grad,
            "db": None if b is None else b.grad}  # fmt: skip


def assert_close_to_reference(got: dict, truth: dict, low: dict, dtype: torch.dtype) -> None:
    """got and low (the same math in PyTorch at the same precision) against the float64 truth."""
    for name in ("loss", "dh", "dw", "db"):
        if truth[name] is None:
            assert got[name] is None, f"{name}: expected no gradient"
            continue
        g, t, lo = got[name], truth[name], low[name]
        assert g.shape == t.shape, f"{name}: shape {tuple(g.shape)} != {tuple(t.shape)}"
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        err = (g.double() - t).abs().max().item() if g.numel() else 0.0
        base = (lo.double() - t).abs().max().item() if g.numel() else 0.0
        bound = 2 * base + FLOOR[dtype] * max(1.0, t.abs().max().item() if t.numel() else 0.0)
        assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e} (baseline {base:.3e})"


def compiled_fused_loss(y, compute_dtype, **compile_kwargs):
    """(hidden, weight) -> the fused op's summed loss, compiled with fullgraph=True (a graph
    break fails)."""
    return torch.compile(
        lambda h, w: fused_linear_cross_entropy(
            h, w, y, None, compute_dtype=compute_dtype, opts=LossOptions(), with_hits=False
        )[0],
        fullgraph=True,
        **compile_kwargs,
    )
