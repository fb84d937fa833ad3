"""Cross-entropy of a linear output head, computed in chunks of tokens: the PyTorch path.

The reference for the fused kernel (flashtrain/models/fused_cross_entropy.py) and its CPU
fallback. An LM head over a long sequence must never hold the (tokens, vocab) float32 logits at
once: GPT-2 small at 16K tokens would need 16384 * 50257 * 4 B = 3.3 GB for them, more than twice
for softmax and gradient. This path walks the tokens in chunks; for each chunk it computes the
logits, the loss, the argmax hits (when asked) and, when a backward will follow, the gradients of
the summed loss with respect to the hidden states, the head's weight and bias right away, so
nothing of size (tokens, vocab) outlives its chunk and the backward pass only rescales the saved
gradients. Peak extra memory: about 2 * chunk_size * vocab * 4 bytes plus one weight-sized
float32 gradient. Semantics (ignore_index, label smoothing, z-loss) as in
flashtrain/kernels/linear_cross_entropy.py; a logit softcap (Gemma 2's final_logit_softcapping)
only here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossOptions:
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    logit_softcap: float = 0.0  # > 0: logits z -> cap * tanh(z / cap) before the softmax


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for half / bfloat16 / float32 work, float64 for float64."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _chunk_loss(h, w, b, y, opts: LossOptions, with_hits: bool):
    """One chunk: logits (c, V) in float32 (float64 for float64), lse, counted-token mask, labels
    with ignored ones replaced by 0, summed loss and argmax hits (None unless asked)."""
    logits = (h @ w.t()).to(_acc_dtype(h))  # (c, V)
    if b is not None:
        logits += b.to(logits.dtype)
    if opts.logit_softcap > 0.0:
        logits = torch.tanh(logits.div_(opts.logit_softcap)).mul_(opts.logit_softcap)
    lse = torch.logsumexp(logits, dim=-1)  # (c,)
    keep = y != opts.ignore_index
    y_safe = torch.where(keep, y, 0)
    eps = opts.label_smoothing
    loss = lse - (1.0 - eps) * logits.gather(1, y_safe[:, None])[:, 0]  # (c,)
    if eps > 0.0:
        loss = loss - (eps / logits.shape[1]) * logits.sum(dim=-1)
    if opts.z_loss > 0.0:
        loss = loss + opts.z_loss * lse.square()
    loss_sum = torch.where(keep, loss, 0.0).sum()
    hits = ((logits.argmax(dim=-1) == y) & keep).sum() if with_hits else None
    return logits, lse, keep, y_safe, loss_sum, hits


def _logit_grads_(logits, lse, keep, y_safe, opts: LossOptions) -> torch.Tensor:
    """d (summed loss) / d logits, computed in place over the logits; ignored rows are 0.
    With a logit softcap: d / d (logits before the cap), through tanh' = 1 - (z / cap)^2."""
    cap = opts.logit_softcap
    slope = 1.0 - (logits / cap).square() if cap > 0.0 else None  # (c, V)
    # exp(z - inf) = 0 zeroes the softmax of ignored rows without another pass over the chunk
    g = logits.sub_(torch.where(keep, lse, torch.inf)[:, None]).exp_()  # (c, V)
    if opts.z_loss > 0.0:
        g.mul_((1.0 + 2.0 * opts.z_loss * lse)[:, None])
    eps = opts.label_smoothing
    if eps > 0.0:
        g.sub_(((eps / g.shape[1]) * keep.to(g.dtype))[:, None])
    rows = torch.arange(y_safe.shape[0], device=y_safe.device)
    g[rows, y_safe] -= (1.0 - eps) * keep.to(g.dtype)
    return g if slope is None else g.mul_(slope)


def _chunked(hidden, weight, bias, targets, chunk_size, compute_dtype, opts, with_hits, with_grads):
    """(loss_sum, hits or None, grads or None); grads = (grad_h like hidden, grad_w float32
    (float64 for float64), grad_b or None) of the summed loss."""
    w = weight.to(compute_dtype)
    acc = torch.float64 if compute_dtype == torch.float64 else torch.float32
    loss_sum = torch.zeros((), dtype=acc, device=hidden.device)
    hits = torch.zeros((), dtype=torch.int64, device=hidden.device) if with_hits else None
    if with_grads:
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        grad_b = None if bias is None else torch.zeros_like(bias, dtype=acc)
    for start in range(0, hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        h = hidden[rows].to(compute_dtype)  # (c, C)
        logits, lse, keep, y_safe, chunk_loss, chunk_hits = _chunk_loss(
            h, w, bias, targets[rows], opts, with_hits
        )
        loss_sum += chunk_loss
        if with_hits:
            hits += chunk_hits
        if not with_grads:
            continue
        g = _logit_grads_(logits, lse, keep, y_safe, opts)  # (c, V) float32
        if grad_b is not None:
            grad_b += g.sum(dim=0)
        g = g.to(compute_dtype)
        grad_h[rows] = (g @ w).to(hidden.dtype)  # (c, C)
        grad_w += (g.t() @ h).to(acc)  # (V, C)
        del logits, g
    return loss_sum, hits, ((grad_h, grad_w, grad_b) if with_grads else None)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size, compute_dtype, opts, with_hits):
        # hidden (N, C), weight (V, C), bias (V,) or None, targets (N,) in [0, V) or ignore_index
        with torch.autocast(hidden.device.type, enabled=False):
            loss_sum, hits, grads = _chunked(
                hidden, weight, bias, targets, chunk_size, compute_dtype, opts, with_hits, True
            )
        ctx.save_for_backward(*grads)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        if hits is None:
            hits = torch.zeros((), dtype=torch.int64, device=hidden.device)
        ctx.mark_non_differentiable(hits)
        return loss_sum, hits

    @staticmethod
    def backward(ctx, grad_loss, _grad_hits):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        dh = (grad_h * grad_loss.to(grad_h.dtype)) if ctx.needs_input_grad[0] else None
        dw = (grad_w * grad_loss).to(w_dtype) if ctx.needs_input_grad[1] else None
        db = None
        if grad_b is not None and ctx.needs_input_grad[2]:
            db = (grad_b * grad_loss).to(b_dtype)
        return dh, dw, db, None, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    chunk_size: int,
    compute_dtype: torch.dtype,
    opts: LossOptions,
    with_hits: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(summed loss float32 (float64 for float64 work), hits int64 or None); inputs already
    validated by flashtrain.models.loss.linear_cross_entropy. Differentiable in hidden, weight
    and bias; the products run in compute_dtype, the softmax in float32."""
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        loss_sum, hits = _ChunkedCrossEntropy.apply(
            hidden, weight, bias, targets, chunk_size, compute_dtype, opts, with_hits
        )
        return loss_sum, (hits if with_hits else None)
    with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
        loss_sum, hits, _ = _chunked(
            hidden, weight, bias, targets, chunk_size, compute_dtype, opts, with_hits, False
        )
    return loss_sum, hits
