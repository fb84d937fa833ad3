"""Cross-entropy of a linear output head, computed in chunks of tokens.

An LM head over a long sequence must never hold the (tokens, vocab) float32 logits at once: GPT-2
small at 16K tokens would need 16384 * 50257 * 4 B = 3.3 GB for them, more than twice for softmax
and gradient. `linear_cross_entropy` walks the tokens in chunks; for each chunk it computes the
logits, the loss, the argmax hits and, when a backward will follow, the gradients of the summed loss
with respect to the hidden states and the head's weight right away (softmax - one_hot), so nothing
of size (tokens, vocab) outlives its chunk and the backward pass only rescales the saved gradients.
Peak extra memory: about 2 * chunk_size * vocab * 4 bytes plus one weight-sized float32 gradient.
"""

from __future__ import annotations

import torch


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    device_type = t.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return t.dtype


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for half / bfloat16 / float32 work, float64 for float64."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _chunk_stats(h, w, b, y):
    """Logits in float32 (float64 for float64 inputs), their log-sum-exp, per-token loss and
    argmax hits for one chunk."""
    logits = (h @ w.t()).to(_acc_dtype(h))  # (c, V)
    if b is not None:
        logits += b.to(logits.dtype)
    lse = torch.logsumexp(logits, dim=-1)  # (c,)
    loss = lse - logits.gather(1, y[:, None])[:, 0]  # (c,)
    hits = (logits.argmax(dim=-1) == y).sum()
    return logits, lse, loss, hits


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size, compute_dtype):
        # hidden (N, C), weight (V, C), bias (V,) or None, targets (N,) int64 in [0, V)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute_dtype)
            grad_h = torch.empty_like(hidden)
            acc = _acc_dtype(w)
            grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
            grad_b = None if bias is None else torch.zeros_like(bias, dtype=acc)
            loss_sum = torch.zeros((), dtype=acc, device=hidden.device)
            hits = torch.zeros((), dtype=torch.int64, device=hidden.device)
            for start in range(0, hidden.shape[0], chunk_size):
                h = hidden[start : start + chunk_size].to(compute_dtype)  # (c, C)
                y = targets[start : start + chunk_size]  # (c,)
                logits, lse, loss, chunk_hits = _chunk_stats(h, w, bias, y)
                loss_sum += loss.sum()
                hits += chunk_hits
                # d(sum loss)/d logits = softmax - one_hot, computed in place over the logits
                g = logits.sub_(lse[:, None]).exp_()  # (c, V) float32
                g[torch.arange(y.shape[0], device=y.device), y] -= 1.0
                if grad_b is not None:
                    grad_b += g.sum(dim=0)
                g = g.to(compute_dtype)
                grad_h[start : start + chunk_size] = (g @ w).to(hidden.dtype)  # (c, C)
                grad_w += (g.t() @ h).to(acc)  # (V, C)
                del logits, g
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
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
        return dh, dw, db, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    chunk_size: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_i CE(hidden_i @ weight.T + bias, targets_i) and the number of argmax hits.

    hidden (N, C) of the counted tokens only; weight (V, C); targets (N,) int64 in [0, V).
    Returns (loss_sum float32 scalar (float64 for float64 inputs), hits int64 scalar). Differentiable in hidden, weight, bias.
    Under autocast the matmuls run in the autocast dtype and the softmax in float32.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden (N, C) and weight (V, C) expected, got {tuple(hidden.shape)}, {tuple(weight.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    cd = _compute_dtype(hidden)
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_size, cd)
    with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
        w = weight.to(cd)
        loss_sum = torch.zeros((), dtype=_acc_dtype(w), device=hidden.device)
        hits = torch.zeros((), dtype=torch.int64, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size].to(cd)
            _, _, loss, chunk_hits = _chunk_stats(h, w, bias, targets[start : start + chunk_size])
            loss_sum += loss.sum()
            hits += chunk_hits
    return loss_sum, hits


def token_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    chunk_size: int = 2048,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean CE over the labelled tokens. hidden (B, T, C), labels (B, T) with ignore_index.

    Only the labelled tokens go through the head. Returns (loss, num_targets, hits); loss is 0
    (and still part of the graph) when no token is labelled.
    """
    labels = labels.reshape(-1)  # (B*T,)
    keep = labels != ignore_index
    h = hidden.reshape(-1, hidden.shape[-1])[keep]  # (N, C)
    y = labels[keep]  # (N,)
    vocab = weight.shape[0]
    if bool(((y < 0) | (y >= vocab)).any()):
        raise ValueError(
            f"labels must be in [0, {vocab}) or {ignore_index}; got values in "
            f"[{int(y.min())}, {int(y.max())}]"
        )
    loss_sum, hits = linear_cross_entropy(h, weight, y, bias, chunk_size=chunk_size)
    num = keep.sum()
    loss = loss_sum / num.clamp(min=1).to(loss_sum.dtype)
    return loss, num, hits


def classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean CE of (B, K) logits against (B,) labels (ignore_index skipped), in float32.

    Returns (loss, num_targets, hits), hits = argmax matches among the counted examples.
    """
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(
            f"classification labels must be (batch,) = ({logits.shape[0]},), got {tuple(labels.shape)}"
        )
    keep = labels != ignore_index
    num = keep.sum()
    loss_sum = torch.nn.functional.cross_entropy(
        logits.float(), labels, ignore_index=ignore_index, reduction="sum"
    )
    loss = loss_sum / num.clamp(min=1).to(loss_sum.dtype)
    hits = ((logits.argmax(dim=-1) == labels) & keep).sum()
    return loss, num, hits
