"""The LM-head losses the loss benchmarks compare (bench/loss.py per process, the GPU suite's
loss section in one): each the mean cross-entropy of hidden (N, C) @ weight (V, C)^T against
targets (N,), differentiable in hidden and weight.

    fused     flashtrain's Triton kernel (impl="fused"): logits only as on-chip tiles
    chunked   flashtrain's PyTorch path (impl="chunked"): logits a chunk of tokens at a time
    compiled  compiled_cross_entropy below: the way people usually avoid the logits without a
              kernel of their own, a clean chunked cross-entropy under torch.compile
    liger     Liger-Kernel's fused linear cross-entropy (liger_fused_linear_cross_entropy,
              checked against its 0.8.5 wheel), where the module is importable
    plain     F.cross_entropy(h @ W.T): the full (N, V) logits
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F

from flashtrain.models.loss import linear_cross_entropy

METHODS = ("fused", "chunked", "compiled", "liger", "plain")
LIGER_MISSING = "liger-kernel missing: carry its wheel in .whl/ (docs/gpu_session.md)"


# ---- compiled: a chunked cross-entropy under torch.compile ------------------------------------


def _chunk_step(h, w, y, dw):
    """One chunk: (summed loss float32, d loss / d h (c, C)); adds d loss / d w into dw (V, C)
    float32. h (c, C), w (V, C), y (c,). The gradients are those of the summed loss."""
    logits = (h @ w.t()).float()  # (c, V)
    lse = torch.logsumexp(logits, dim=-1)  # (c,)
    loss = (lse - logits.gather(1, y[:, None])[:, 0]).sum()
    # d loss / d logits = softmax - one_hot; inductor fuses it and the cast into one pass
    g = (torch.exp(logits - lse[:, None]) - F.one_hot(y, logits.shape[1])).to(h.dtype)
    dw.add_(g.t() @ h)
    return loss, g @ w


@functools.cache
def _compiled_step():
    """torch.compile'd _chunk_step, built at first use (importing dynamo costs seconds); static
    shapes: one compile per (chunk, V, C), tokens that the chunk divides need no other."""
    return torch.compile(_chunk_step, dynamic=False, fullgraph=True)


class _CompiledChunkedCE(torch.autograd.Function):
    """The gradients are computed chunk by chunk in the forward (as Liger and flashtrain's chunked
    path do), so no chunk's logits outlive it; the backward only scales them."""

    @staticmethod
    def forward(ctx, h, w, y, chunk_size):
        step = _compiled_step()
        dh = torch.empty_like(h)  # (N, C)
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device)  # (V, C)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        for lo in range(0, h.shape[0], chunk_size):
            rows = slice(lo, lo + chunk_size)
            part, dh[rows] = step(h[rows], w, y[rows], dw)
            loss += part
        ctx.save_for_backward(dh, dw.to(w.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad):
        dh, dw = ctx.saved_tensors
        return dh * grad.to(dh.dtype), dw * grad.to(dw.dtype), None, None


def compiled_cross_entropy(h, w, y, chunk_size: int = 2048) -> torch.Tensor:
    """Summed cross-entropy of h (N, C) @ w (V, C)^T against y (N,) in [0, V), float32; no
    ignore_index, label smoothing or z-loss (the benchmarks use none)."""
    return _CompiledChunkedCE.apply(h, w, y, chunk_size)


# ---- liger -------------------------------------------------------------------------------------


def liger_function():
    """Liger's liger_fused_linear_cross_entropy(input, weight, target) -> mean loss, or a string:
    why it cannot run here."""
    try:
        found = importlib.util.find_spec("liger_kernel") is not None
    except (ImportError, ValueError):  # ValueError: blocked (None in sys.modules)
        found = False
    if not found:
        return LIGER_MISSING
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError as err:  # present but broken here (a dependency, a torch it rejects)
        return f"liger-kernel unusable here: {type(err).__name__}: {str(err)[:160]}"
    return liger_fused_linear_cross_entropy


def unavailable(method: str, device: torch.device | str) -> str:
    """ "" where `method` can run on `device`, else a note "skipped: why"."""
    if method not in METHODS:
        raise ValueError(f"loss method {method!r}; allowed: {', '.join(METHODS)}")
    if method != "liger":
        return ""
    liger = liger_function()
    if isinstance(liger, str):
        return f"skipped: {liger}"
    if torch.device(device).type != "cuda":
        return "skipped: liger-kernel runs on CUDA only"
    return ""


# ---- every method ------------------------------------------------------------------------------


def mean_loss(method: str, h, w, y, chunk_size: int = 2048) -> torch.Tensor:
    """The mean loss over the N tokens by `method` (float32 scalar, differentiable in h and w)."""
    n = y.shape[0]
    if method == "plain":
        return F.cross_entropy((h @ w.t()).float(), y)
    if method == "compiled":
        return compiled_cross_entropy(h, w, y, chunk_size) / n
    if method == "liger":
        return liger_function()(h, w, y).float()  # reduction "mean"
    loss_sum, _ = linear_cross_entropy(
        h, w, y, impl=method, chunk_size=chunk_size, compute_hits=False
    )
    return loss_sum / n


def loss_fn(method: str, h, w, y, chunk_size: int = 2048):
    """fwd + bwd of the mean loss; grads are dropped after each call so every call starts alike."""

    def run():
        mean_loss(method, h, w, y, chunk_size).backward()
        h.grad = w.grad = None

    return run


def loss_and_grads(method: str, h, w, y, chunk_size: int = 2048):
    """(mean loss float, d h, d w) of one fwd + bwd by `method`; h and w keep no grad."""
    loss = mean_loss(method, h, w, y, chunk_size)
    loss.backward()
    grads = (h.grad, w.grad)
    h.grad = w.grad = None
    return float(loss.detach()), *grads
