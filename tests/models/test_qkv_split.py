"""The q, k, v projection split into views: the same values and gradients as Linear + view +
unbind (against float64), and a backward that makes no activation-sized stack or cat."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flashtrain.models.qkv import split_qkv_projection


def _unbind_reference(x, weight, bias, heads):
    qkv = torch.nn.functional.linear(x, weight, bias)
    return qkv.view(*x.shape[:-1], 3, heads, -1).unbind(-3)


def _inputs(dtype, with_bias=True, lead=(3, 7), width=24):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(*lead, width, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(3 * width, width, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(3 * width, generator=g, dtype=dtype, requires_grad=True) if with_bias else None
    grads = [torch.randn(*lead, 4, width // 4, generator=g, dtype=dtype) for _ in range(3)]
    return x, w, b, grads


def _run(fn, x, w, b, grads):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = b.detach().requires_grad_() if b is not None else None
    outs = fn(x, w, b, 4)
    torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs] + [t.grad for t in (x, w, b) if t is not None]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("lead", [(3, 7), (5,)])  # padded (B, T) and packed (N,)
def test_split_matches_unbind_against_float64(with_bias, lead):
    x, w, b, grads = _inputs(torch.float32, with_bias, lead)
    ref = _run(_unbind_reference, *(t.double() if t is not None else None for t in (x, w, b)),
               [g.double() for g in grads])  # fmt: skip
    plain = _run(_unbind_reference, x, w, b, grads)
    ours = _run(split_qkv_projection, x, w, b, grads)
    assert len(ours) == len(ref)
    for o, p, r in zip(ours, plain, ref):
        assert o.shape == r.shape and o.dtype == torch.float32
        tolerance = 2 * (p.double() - r).abs().max() + 1e-6
        assert (o.double() - r).abs().max() <= tolerance


def test_split_under_autocast_returns_grads_in_the_parameters_dtype():
    x, w, b, grads = _inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _run(_unbind_reference, x, w, b, [g.bfloat16() for g in grads])
        ours = _run(split_qkv_projection, x, w, b, [g.bfloat16() for g in grads])
    for o, p in zip(ours, plain):
        assert o.dtype == p.dtype
        assert torch.allclose(o.float(), p.float(), rtol=2e-2, atol=2e-2)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        numel = out.numel() if isinstance(out, torch.Tensor) else 0
        self.calls.append((func.overloadpacket.__name__, numel))
        return out


@pytest.mark.parametrize("fn,copies", [(split_qkv_projection, False), (_unbind_reference, True)])
def test_backward_makes_no_activation_sized_copy(fn, copies):
    """The reference shows the check can fail: unbind's backward stacks the three grads."""
    x, w, b, grads = _inputs(torch.float32, lead=(4, 16), width=8)
    outs = fn(x, w, b, 4)
    activation = 3 * x.numel()  # (tokens, 3C)
    with _Ops() as ops:
        torch.autograd.backward(outs, grads)
    copied = [
        c for c in ops.calls if c[0] in ("stack", "cat", "copy_", "clone") and c[1] >= activation
    ]
    assert bool(copied) == copies, ops.calls
