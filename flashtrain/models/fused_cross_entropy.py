"""The fused LM-head cross-entropy op: the logits never exist in memory, not even per chunk.

Two torch.library custom ops (so torch.compile sees opaque nodes, no graph break), tied together
by register_autograd, launch the Triton kernels of flashtrain/kernels/linear_cross_entropy.py
on CUDA tensors and on CPU tensors under TRITON_INTERPRET=1 (how the tests check the kernels),
except bfloat16 products there (the interpreter's tl.dot gets them wrong: attention/route.py).
On other CPU runs the chunked PyTorch path, with the same semantics, stands in. The forward saves
only the per-token log-sum-exp (N,) float32; the backward recomputes the logits from it.
No host synchronisation: the loss stays a device tensor, the splits depend only on shapes.
"""

from __future__ import annotations

import torch

from flashtrain.attention.route import interpreted, interpreter_miscomputes
from flashtrain.kernels.interpreter_compat import prepare_interpreter
from flashtrain.models.chunked_cross_entropy import LossOptions, chunked_linear_cross_entropy

FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def runs_triton(device: torch.device, compute_dtype: torch.dtype) -> bool:
    """CUDA: the kernels. CPU: the kernels under TRITON_INTERPRET=1 unless their products would
    be in a dtype the interpreter miscomputes (bfloat16), else the chunked path."""
    if device.type == "cuda":
        return True
    return interpreted() and not interpreter_miscomputes(device, compute_dtype)


def _empty(like: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The custom ops return a (0,) tensor where a result is absent (their outputs are tensors)."""
    return torch.empty(0, dtype=dtype or like.dtype, device=like.device)


def _operands(hidden: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype):
    """The products' inputs in compute_dtype with unit stride along C: under autocast, 16-bit
    copies of fp32 hidden states and weight (transient; the kernels accumulate in fp32 and the
    gradients come back in the original dtypes)."""
    return tuple(t.to(compute_dtype).contiguous() for t in (hidden, weight))


# fmt: off
@torch.library.custom_op("flashtrain::linear_xent_forward", mutates_args=())
def linear_xent_forward(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
    ignore_index: int, label_smoothing: float, z_loss: float, compute_dtype: torch.dtype,
    with_argmax: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (loss (N,) float32, lse (N,) float32, argmax (N,) int64 or (0,))."""
    from flashtrain.kernels.linear_cross_entropy import xent_forward

    prepare_interpreter()  # an old triton's interpreter under a new numpy (interpreter_compat)
    n = hidden.shape[0]
    loss = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
    argmax = torch.empty(n, dtype=torch.int64, device=hidden.device) if with_argmax else None
    xent_forward(*_operands(hidden, weight, compute_dtype), bias, targets, loss, lse, argmax,
                 ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss)
    return loss, lse, (argmax if with_argmax else _empty(hidden, torch.int64))


@linear_xent_forward.register_fake
def _(hidden, weight, bias, targets, ignore_index, label_smoothing, z_loss, compute_dtype,
      with_argmax):
    n = hidden.shape[0]
    stats = hidden.new_empty(n, dtype=torch.float32)
    return stats, torch.empty_like(stats), hidden.new_empty(n if with_argmax else 0, dtype=torch.int64)


@torch.library.custom_op("flashtrain::linear_xent_backward", mutates_args=())
def linear_xent_backward(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None, targets: torch.Tensor, lse: torch.Tensor,
    ignore_index: int, label_smoothing: float, z_loss: float, compute_dtype: torch.dtype,
    grad_hidden: bool, grad_weight: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (d hidden like hidden, d weight like weight, d bias like bias), each (0,) when not
    asked for (d bias comes with grad_weight); accumulated in float32, then cast."""
    from flashtrain.kernels.linear_cross_entropy import xent_backward

    prepare_interpreter()
    dh, dw, db = xent_backward(grad_loss, *_operands(hidden, weight, compute_dtype), bias, targets,
                               lse, ignore_index=ignore_index, label_smoothing=label_smoothing,
                               z_loss=z_loss, grad_hidden=grad_hidden, grad_weight=grad_weight)
    return (dh.to(hidden.dtype) if dh is not None else _empty(hidden),
            dw.to(weight.dtype) if dw is not None else _empty(weight),
            db.to(bias.dtype) if db is not None else _empty(weight))


@linear_xent_backward.register_fake
def _(grad_loss, hidden, weight, bias, targets, lse, ignore_index, label_smoothing, z_loss,
      compute_dtype, grad_hidden, grad_weight):
    return (torch.empty_like(hidden) if grad_hidden else _empty(hidden),
            torch.empty_like(weight) if grad_weight else _empty(weight),
            torch.empty_like(bias) if grad_weight and bias is not None else _empty(weight))
# fmt: on


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, targets, ignore_index, label_smoothing, z_loss, compute_dtype, _ = inputs
    _, lse, argmax = output
    ctx.save_for_backward(hidden, weight, bias, targets, lse)
    ctx.params = (ignore_index, label_smoothing, z_loss, compute_dtype)
    ctx.mark_non_differentiable(lse, argmax)


def _backward(ctx, grad_loss, _grad_lse, _grad_argmax):
    hidden, weight, bias, targets, lse = ctx.saved_tensors
    need_h, need_w, need_b = ctx.needs_input_grad[:3]
    dh, dw, db = linear_xent_backward(
        grad_loss, hidden, weight, bias, targets, lse, *ctx.params, need_h, need_w or need_b
    )
    grads = (dh if need_h else None, dw if need_w else None, db if need_b else None)
    return (*grads, *([None] * 6))


linear_xent_forward.register_autograd(_backward, setup_context=_setup_context)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    compute_dtype: torch.dtype,
    opts: LossOptions,
    with_hits: bool,
    chunk_size: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(summed loss float32, argmax hits int64 or None); inputs already validated by
    flashtrain.models.loss.linear_cross_entropy. Differentiable in hidden, weight and bias.
    chunk_size: the chunks of the chunked path where it stands in (CPU without the interpreter,
    or bfloat16 products under it)."""
    dtypes = {"hidden": hidden.dtype, "weight": weight.dtype, "compute": compute_dtype}
    for name, dtype in dtypes.items():
        if dtype not in FUSED_DTYPES:
            raise ValueError(
                f"the fused loss takes float16, bfloat16 or float32; {name} dtype is {dtype} "
                "(impl='chunked' takes float64)"
            )
    if not runs_triton(hidden.device, compute_dtype):
        kwargs = dict(compute_dtype=compute_dtype, opts=opts, with_hits=with_hits)
        return chunked_linear_cross_entropy(
            hidden, weight, targets, bias, chunk_size=chunk_size, **kwargs
        )
    loss, _, argmax = linear_xent_forward(
        hidden,
        weight,
        None if bias is None else bias.contiguous(),
        targets,
        opts.ignore_index,
        opts.label_smoothing,
        opts.z_loss,
        compute_dtype,
        with_hits,
    )
    hits = ((argmax == targets) & (targets != opts.ignore_index)).sum() if with_hits else None
    return loss.sum(), hits
