"""Zero-length sequences (seqlen_q = 0, seqlen_k = 0, an empty sequence in a packed batch, as
unpad_input gives for an all-padding row) run on every route: ATen's fused CPU kernel divides by
zero on them (SIGFPE, the process dies), so they must never reach it."""

import os
import subprocess
import sys

import pytest
import torch
from attention_testing import assert_matches_reference, forward_backward, reference_results

from flashtrain.attention import cpu_flash, flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.torch_path import AttentionOptions

DENSE = AttentionOptions(scale=0.25)


@pytest.mark.single_route
def test_aten_route_takes_only_nonempty_float32_calls():
    """The eligibility rule itself (the in-process tests below would kill pytest if it broke)."""

    def eligible(sq, sk, dtype=torch.float32, opts=DENSE):
        q, k = torch.zeros(1, sq, 2, 16, dtype=dtype), torch.zeros(1, sk, 2, 16, dtype=dtype)
        return cpu_flash.eligible(q, k, k, opts)

    assert eligible(8, 8) and eligible(8, 8, opts=AttentionOptions(scale=0.25, window=(-1, 0)))
    assert not eligible(0, 8) and not eligible(8, 0) and not eligible(0, 0)
    assert not eligible(8, 8, torch.float16) and not eligible(8, 8, torch.bfloat16)
    assert not eligible(8, 8, opts=AttentionOptions(scale=0.25, softcap=5.0))
    assert not eligible(8, 8, opts=AttentionOptions(scale=0.25, alibi_slopes=torch.ones(1, 2)))


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(0, 7), (7, 0), (0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_zero_length_dense(seqlen_q, seqlen_k, causal):
    q = torch.randn(2, seqlen_q, 2, 16, requires_grad=True)
    k = torch.randn(2, seqlen_k, 2, 16, requires_grad=True)
    v = torch.randn(2, seqlen_k, 2, 16, requires_grad=True)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 2, seqlen_q)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and torch.equal(t.grad, torch.zeros_like(t))


@pytest.mark.parametrize("causal", [False, True])
def test_empty_sequence_in_a_packed_batch(causal):
    torch.manual_seed(0)
    cu = torch.tensor([0, 8, 8, 16], dtype=torch.int32)  # sequence 1 is empty
    q, k, v = (torch.randn(16, 2, 16) for _ in range(3))
    dout = torch.randn_like(q)
    out, lse, dq, dk, dv = forward_backward(
        lambda a, b, c: flash_attn_varlen_func(
            a, b, c, cu, cu, 8, 8, causal=causal, return_lse=True
        ),
        q,
        k,
        v,
        dout,
    )
    for r in (slice(0, 8), slice(8, 16)):
        truth, low = reference_results(
            q[None, r], k[None, r], v[None, r], dout[None, r], causal=causal
        )
        got = (out[None, r], lse[None, :, r], dq[None, r], dk[None, r], dv[None, r])
        assert_matches_reference(got, truth, low, torch.float32)


_CRASHERS = """
import torch
from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
x = lambda *shape: torch.randn(*shape, requires_grad=True)
flash_attn_func(x(1, 0, 2, 16), x(1, 5, 2, 16), x(1, 5, 2, 16)).sum().backward()
flash_attn_func(x(1, 5, 2, 16), x(1, 0, 2, 16), x(1, 0, 2, 16)).sum().backward()
cu = torch.tensor([0, 8, 8, 16], dtype=torch.int32)
flash_attn_varlen_func(x(16, 2, 16), x(16, 2, 16), x(16, 2, 16), cu, cu, 8, 8).sum().backward()
"""


@pytest.mark.single_route
def test_default_cpu_path_survives_zero_lengths():
    """The default CPU path (no interpreter) in a fresh process: a SIGFPE fails this test
    instead of killing pytest."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    env["FLASHTRAIN_CPU_ATTENTION"] = "auto"
    done = subprocess.run(
        [sys.executable, "-c", _CRASHERS], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
