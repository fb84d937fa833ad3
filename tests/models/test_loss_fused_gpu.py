"""GPU-only checks of the fused loss kernels: bfloat16 (the interpreter's bf16 dot is unreliable),
real sizes on the compiled kernels with their H100 tiles, bitwise repeatable gradients, memory that
does not grow with tokens beyond O(tokens), and torch.compile. Run on a CUDA machine:
`pytest -m gpu tests/models/test_loss_fused_gpu.py`."""

import pytest
import torch
from loss_testing import (
    assert_close_to_reference,
    compiled_fused_loss,
    head_inputs,
    reference,
    run_loss,
)

from flashtrain.models.loss import token_loss

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

OPTIONS = {
    "plain": {},
    "all": {"ignored": 100, "bias": True, "label_smoothing": 0.1, "z_loss": 1e-4},
}
# GPT-2's head with an odd token count; a vocabulary that is not a multiple of any tile with an
# odd hidden size; a small problem where the vocabulary splits.
SHAPES = [(4096 + 7, 768, 50257), (1000, 1000, 32005), (129, 64, 300)]


def _cuda_inputs(shape, dtype, opts):
    h, w, b, y = head_inputs(
        *shape, dtype=dtype, ignored=opts.get("ignored", 0), bias=opts.get("bias", False)
    )
    return tuple(None if t is None else t.cuda() for t in (h, w, b, y))


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_within_twice_pytorch_error(dtype, shape, option):
    opts = OPTIONS[option]
    loss_kwargs = {k: v for k, v in opts.items() if k in ("label_smoothing", "z_loss")}
    h, w, b, y = _cuda_inputs(shape, dtype, opts)
    truth = reference(h, w, y, b, **loss_kwargs)
    low = run_loss(h, w, y, b, impl="chunked", **loss_kwargs)
    got = run_loss(h, w, y, b, impl="fused", **loss_kwargs)
    assert_close_to_reference(got, truth, low, dtype)
    # near-ties may flip in 16-bit products; the count must agree closely
    assert abs(got["hits"].item() - truth["hits"].item()) <= max(2, shape[0] // 100)


def test_fused_gradients_are_bitwise_repeatable():
    h, w, b, y = _cuda_inputs((4096 + 7, 768, 50257), torch.bfloat16, OPTIONS["all"])
    first = run_loss(h, w, y, b, impl="fused", label_smoothing=0.1)
    second = run_loss(h, w, y, b, impl="fused", label_smoothing=0.1)
    for name in ("loss", "dh", "dw", "db"):
        assert torch.equal(first[name], second[name]), name


def test_bf16_autocast_keeps_float32_gradients():
    h, w, _, y = _cuda_inputs((2048, 768, 50257), torch.float32, {})
    truth = reference(h, w, y)
    low = run_loss(h, w, y, impl="chunked", autocast_dtype=torch.bfloat16)
    got = run_loss(h, w, y, impl="fused", autocast_dtype=torch.bfloat16)
    assert got["dh"].dtype == got["dw"].dtype == torch.float32
    assert_close_to_reference(got, truth, low, torch.bfloat16)


def _extra_peak_bytes(tokens, width=768, vocab=50257):
    """Peak CUDA memory of a token_loss forward + backward beyond its inputs."""
    h, w, _, y = _cuda_inputs((tokens, width, vocab), torch.bfloat16, {})
    h.requires_grad_()
    w.requires_grad_()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss, _, _ = token_loss(h, y, w, impl="fused", compute_hits=False)
    loss.backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_memory_grows_with_tokens_only_by_per_token_terms():
    """16384 vs 4096 tokens of GPT-2's head: the difference is O(tokens * C) (grad_hidden and its
    fp32 accumulator), not the 1.2 GB of bf16 logits 12288 more tokens would take."""
    small, large = _extra_peak_bytes(4096), _extra_peak_bytes(16384)
    per_token = 768 * (2 + 4 + 4) + 64  # dh bf16, its fp32 accumulator, slack; lse, loss
    assert large - small < 12288 * per_token, (small, large)
    assert large < 50257 * 768 * (4 + 2) + 16384 * per_token + 64 * 2**20, large


def test_fused_op_compiles_with_inductor():
    h, w, _, y = _cuda_inputs((1000, 1000, 32005), torch.bfloat16, {})
    eager = run_loss(h, w, y, impl="fused")
    fn = compiled_fused_loss(y, torch.bfloat16)
    hc, wc = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fn(hc, wc)
    (loss * 0.37).backward()
    assert torch.equal(loss, eager["loss"])
    assert torch.equal(hc.grad, eager["dh"]) and torch.equal(wc.grad, eager["dw"])
