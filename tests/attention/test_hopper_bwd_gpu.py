"""GPU-only checks of the warp-specialized Gluon backward (kernels/hopper/flash_bwd_ws.py) on a
Hopper GPU: the variant config forced, output and every gradient against the float64 definition
by the project's tolerance rule, at odd sizes, GQA, packed documents, both head dims; masked
non-finite values; the route taking the kernel for each of them. `pytest -m gpu`; the GPU
suite's `hopper` section runs the same kernel first in a child process (a hang cannot stall it)."""

import pytest
import torch
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
from flashtrain.kernels import tuning
from flashtrain.kernels.hopper.route import ws_backward_config

pytestmark = [
    pytest.mark.single_route,  # CUDA tensors: the CPU route does not apply
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
        reason="needs a Hopper GPU (sm_90)",
    ),
]


@pytest.fixture
def gluon_backward():
    """The dK/dV config that names the Gluon backward, and a check that calls really took it."""
    from flashtrain.kernels.hopper import flash_bwd_ws

    launched = []
    kernel = flash_bwd_ws.flash_backward_ws

    def counting(*args, **kwargs):
        launched.append(kwargs.get("block_m"))
        return kernel(*args, **kwargs)

    flash_bwd_ws.flash_backward_ws = counting
    try:
        with tuning.overridden("dkdv", ws_backward_config()):
            yield launched
    finally:
        flash_bwd_ws.flash_backward_ws = kernel


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape",
    [(2, 1023, 1023, 8, 8, 128), (1, 2048, 1999, 16, 4, 64), (1, 333, 777, 4, 1, 128)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_gluon_backward_matches_reference(gluon_backward, shape, causal, dtype):
    torch.manual_seed(0)
    q, k, v = random_qkv(*shape, dtype, device="cuda")
    dout = torch.randn_like(q)
    got = forward_backward(
        lambda a, b, c: flash_attn_func(a, b, c, causal=causal, return_lse=True), q, k, v, dout
    )
    assert gluon_backward, "the route did not take the Gluon backward"
    truth, low = reference_results(q, k, v, dout, causal=causal)
    assert_matches_reference(got, truth, low, dtype)


def test_gluon_backward_packed_documents(gluon_backward):
    """Packed documents (an empty one, one past several key tiles): each its own attention."""
    torch.manual_seed(1)
    lens = [700, 3, 1500, 0, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")  # fmt: skip
    q = torch.randn(sum(lens), 8, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(sum(lens), 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    dout = torch.randn_like(q)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 1500, 1500, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert gluon_backward
    for i, n in enumerate(lens):
        if n == 0:
            continue
        r = slice(int(cu[i]), int(cu[i + 1]))
        piece = [t[None, r].detach() for t in (q, k, v)]
        truth, low = reference_results(*piece, dout[None, r], causal=True)
        got = (out[None, r].detach(), truth[1], *(g[None, r] for g in grads))
        assert_matches_reference(got, truth, low, torch.bfloat16)


def test_gluon_backward_keeps_masked_nonfinite_values_out(gluon_backward):
    """NaN and inf in K and V past a row's causal diagonal leave that row's dq as if finite."""
    torch.manual_seed(2)
    q, k, v = random_qkv(1, 600, 600, 4, 2, 64, torch.bfloat16, device="cuda")
    dout = torch.randn_like(q)
    clean = forward_backward(lambda a, b, c: flash_attn_func(a, b, c, causal=True,
                                                             return_lse=True), q, k, v, dout)  # fmt: skip
    k, v = k.clone(), v.clone()
    k[0, 400, 1, 7], v[0, 450, 0, 3] = float("nan"), float("inf")
    dirty = forward_backward(lambda a, b, c: flash_attn_func(a, b, c, causal=True,
                                                             return_lse=True), q, k, v, dout)  # fmt: skip
    assert gluon_backward
    # the same values up to the order of dQ's atomic adds (not bitwise repeatable)
    assert torch.isfinite(dirty[2][0, :400]).all()
    torch.testing.assert_close(dirty[2][0, :400], clean[2][0, :400])
    assert (~torch.isfinite(dirty[2][0, 400:])).any(dim=-1).all()  # each row that sees one
