"""Shared checks for the attention tests: a float64 reference, a same-precision PyTorch baseline,
and the flash-attention tolerance rule (error at most 2x the baseline's error plus a floor)."""

from __future__ import annotations

import pytest
import torch

from flashtrain.attention.reference import attention_reference

FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}

# MERGE(kernels): flip both to True when the kernel branch is merged (and delete
# flashtrain/attention/ops.py:_until_kernel_branch_merged). Its kernels then compute softcap and
# ALiBi, and its launchers take the dropout seed as an int64 (1,) device tensor.
KERNELS_HAVE_ALIBI_SOFTCAP = False
KERNELS_TAKE_DEVICE_SEED = False


def skip_unless_route_has_alibi_softcap(backend: str | None) -> None:
    if backend == "triton" and not KERNELS_HAVE_ALIBI_SOFTCAP:
        pytest.skip(
            "this build's Triton kernels have no softcap/ALiBi (KERNELS_HAVE_ALIBI_SOFTCAP)"
        )


def random_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device="cpu"):
    make = lambda s, h: torch.randn(batch, s, h, head_dim, dtype=dtype, device=device)
    return make(seqlen_q, heads_q), make(seqlen_k, heads_kv), make(seqlen_k, heads_kv)


def forward_backward(fn, q, k, v, dout):
    """Run fn(q, k, v) -> (out, lse) and backprop dout; returns out, lse, dq, dk, dv."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    out.backward(dout.to(out.dtype))
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def reference_results(q, k, v, dout, **kwargs):
    """Float64 truth and the same math done in the inputs' own precision."""
    truth = forward_backward(
        lambda a, b, c: attention_reference(a, b, c, **kwargs),
        q.double(),
        k.double(),
        v.double(),
        dout,
    )
    low = forward_backward(
        lambda a, b, c: attention_reference(a, b, c, upcast=False, **kwargs), q, k, v, dout
    )
    return truth, low


def assert_matches_reference(got, truth, low, dtype, names=("out", "lse", "dq", "dk", "dv")):
    for name, g, t, b in zip(names, got, truth, low):
        assert g.shape == t.shape, f"{name}: shape {tuple(g.shape)} != {tuple(t.shape)}"
        g, t, b = g.double(), t.double(), b.double()
        if name == "lse":
            # Rows that see no key: exactly -inf in both; compare the rest.
            assert torch.equal(torch.isneginf(g), torch.isneginf(t)), "lse: -inf rows differ"
            finite = torch.isfinite(t)
            g, t, b = g[finite], t[finite], b[finite]
            if g.numel() == 0:
                continue
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        err = (g - t).abs().max().item() if g.numel() else 0.0
        base = (b - t).abs().max().item() if b.numel() else 0.0
        bound = 2 * base + FLOOR[dtype]
        assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e} (baseline {base:.3e})"
