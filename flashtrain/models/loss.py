"""The losses the models return: LM-head cross-entropy (fused or chunked) and classification.

`linear_cross_entropy` / `token_loss` never hold the (tokens, vocab) logits at once. Two
implementations with the same semantics, chosen by `impl`:
  "fused"   the Triton kernels (flashtrain/models/fused_cross_entropy.py): logits exist only as
            tiles on chip, the backward recomputes them from the saved log-sum-exp (N,) float32.
            On a CPU without TRITON_INTERPRET=1, and for bfloat16 products under it (the
            interpreter's tl.dot gets them wrong), the chunked path stands in.
  "chunked" PyTorch in chunks of `chunk_size` tokens (flashtrain/models/chunked_cross_entropy.py),
            the reference: logits of one chunk at a time, gradients computed in the forward.
  "auto"    fused on CUDA, chunked on CPU (the rule behind `model.loss_impl`).
Per counted token (label != ignore_index), with lse = logsumexp(logits):
    loss = lse - (1 - label_smoothing) * logit[label] - label_smoothing * mean(logits)
           + z_loss * lse**2
(torch's label smoothing; z_loss * lse**2 is PaLM's z-loss, keeping log Z near 0; both 0 by
default). Argmax hits are computed only when asked (compute_hits), for evaluation.
"""

from __future__ import annotations

import math

import torch

from flashtrain.attention.validation import values_checked
from flashtrain.models.chunked_cross_entropy import LossOptions, chunked_linear_cross_entropy
from flashtrain.models.config import LOSS_IMPLS
from flashtrain.models.fused_cross_entropy import fused_linear_cross_entropy


def resolve_loss_impl(impl: str, device: torch.device) -> str:
    """The implementation that runs: auto is fused on CUDA, chunked elsewhere."""
    if impl not in LOSS_IMPLS:
        raise ValueError(f"loss impl {impl!r}; allowed: {', '.join(LOSS_IMPLS)}")
    if impl == "auto":
        return "fused" if device.type == "cuda" else "chunked"
    return impl


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    device_type = t.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return t.dtype


def _check_head_inputs(hidden, weight, targets, bias, chunk_size, opts: LossOptions) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden (N, C) and weight (V, C) expected, got {tuple(hidden.shape)}, {tuple(weight.shape)}"
        )
    vocab = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"bias must be (V,) = ({vocab},), got {tuple(bias.shape)}")
    if targets.shape != hidden.shape[:1] or targets.dtype.is_floating_point or targets.is_complex():
        raise ValueError(
            f"targets must be integer ({hidden.shape[0]},) like hidden's rows, got "
            f"{targets.dtype} {tuple(targets.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not 0.0 <= opts.label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {opts.label_smoothing}")
    if not (math.isfinite(opts.z_loss) and opts.z_loss >= 0.0):
        raise ValueError(f"z_loss must be a finite coefficient >= 0, got {opts.z_loss}")
    if not (math.isfinite(opts.logit_softcap) and opts.logit_softcap >= 0.0):
        raise ValueError(f"logit_softcap must be >= 0 (0 = off), got {opts.logit_softcap}")
    if not values_checked(targets.device):
        return  # on a GPU reading the labels is a host sync: the kernel's NaN loss reports them
    counted = targets != opts.ignore_index
    if bool((counted & ((targets < 0) | (targets >= vocab))).any()):
        y = targets[counted]
        raise ValueError(
            f"labels must be in [0, {vocab}) or {opts.ignore_index}; got values in "
            f"[{int(y.min())}, {int(y.max())}]"
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    impl: str = "auto",
    chunk_size: int = 2048,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    logit_softcap: float = 0.0,
    compute_hits: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """sum over counted tokens of CE(hidden_i @ weight.T + bias, targets_i), and argmax hits.

    hidden (N, C); weight (V, C); targets (N,) integer in [0, V) or ignore_index (not counted).
    Returns (loss_sum float32 scalar (float64 for float64 inputs, chunked only), hits int64
    scalar, or None when compute_hits=False). Differentiable in hidden, weight, bias.
    Under autocast the products run in the autocast dtype, the softmax in float32.
    logit_softcap > 0 caps the logits z as cap * tanh(z / cap) (chunked only: "auto" picks it,
    "fused" is refused).
    """
    opts = LossOptions(ignore_index, float(label_smoothing), float(z_loss), float(logit_softcap))
    _check_head_inputs(hidden, weight, targets, bias, chunk_size, opts)
    cd = _compute_dtype(hidden)
    fused = resolve_loss_impl(impl, hidden.device) == "fused"
    if fused and opts.logit_softcap > 0.0:
        if impl == "fused":
            raise ValueError("the fused loss has no logit softcap; use impl chunked (or auto)")
        fused = False
    run = fused_linear_cross_entropy if fused else chunked_linear_cross_entropy
    kwargs = dict(chunk_size=chunk_size, compute_dtype=cd, opts=opts, with_hits=compute_hits)
    return run(hidden, weight, targets, bias, **kwargs)


def token_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    impl: str = "auto",
    chunk_size: int = 2048,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    logit_softcap: float = 0.0,
    compute_hits: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Mean CE over the labelled tokens. hidden (B, T, C) or (N, C), labels (B, T) or (N,) with
    ignore_index; options as in linear_cross_entropy.

    Returns (loss, num_targets, hits or None); loss = summed loss / num_targets, 0 (and still
    part of the graph) when no token is labelled.
    """
    labels = labels.reshape(-1)  # (B*T,)
    h = hidden.reshape(-1, hidden.shape[-1])  # (B*T, C)
    loss_sum, hits = linear_cross_entropy(
        h,
        weight,
        labels,
        bias,
        impl=impl,
        chunk_size=chunk_size,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        logit_softcap=logit_softcap,
        compute_hits=compute_hits,
    )
    num = (labels != ignore_index).sum()
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
