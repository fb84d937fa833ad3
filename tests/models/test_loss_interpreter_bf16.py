"""The fused loss on bfloat16 under TRITON_INTERPRET=1: the interpreter's tl.dot on bf16 operands
is wrong (upstream), so the chunked path stands in (flashtrain.attention.route's rule) and the
loss and its gradients match float64. Before the fix the kernels ran there: loss off by ~1e9."""

import os

import pytest
import torch
from loss_testing import assert_close_to_reference, head_inputs, reference, run_loss

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") != "1", reason="the rule is the interpreter's"
)


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16-inputs", "fp32-under-bf16-autocast"])
def test_fused_bf16_matches_float64(autocast):
    """bf16 operands either way: bf16 tensors, or float32 ones cast by autocast."""
    dtype = torch.float32 if autocast else torch.bfloat16
    autocast_dtype = torch.bfloat16 if autocast else None
    h, w, b, y = head_inputs(9, 16, 40, dtype=dtype, bias=True, ignored=2)
    truth = reference(h, w, y, b, label_smoothing=0.1)
    options = dict(autocast_dtype=autocast_dtype, label_smoothing=0.1)
    low = run_loss(h, w, y, b, impl="chunked", chunk_size=4, **options)
    got = run_loss(h, w, y, b, impl="fused", **options)
    assert_close_to_reference(got, truth, low, torch.bfloat16)
