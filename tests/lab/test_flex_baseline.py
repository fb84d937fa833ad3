"""The FlexAttention baseline of the block-sparse target computes what ours computes: the
BlockMask built from a block layout, run through *eager* flex_attention (which applies the
mask_mod alone and ignores the block tables, as a compiled flex_attention that falls back to
eager would), gives block-sparse attention, not dense attention. On CPU, fp32, toy sizes."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from flashtrain.attention import blocksparse_attn_func, sparsity
from flashtrain.attention.reference import expand_block_mask
from flashtrain.lab.bench import baselines

flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention

SEQLEN, BLOCK, HEADS, HEAD_DIM = 256, 64, 2, 32


def attention_float64(q, k, v, allowed):
    """(B, H, S, D) attention in float64 over the allowed (S, S) entries."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


# full: ~4 s, left out of the normal suite (causal covers the same code and its mask)
@pytest.mark.parametrize(
    "causal", [pytest.param(False, marks=pytest.mark.slow), True], ids=["full", "causal"]
)
def test_flex_block_mask_from_layout_computes_the_layout_on_cpu(causal):
    layout = sparsity.PATTERNS["local"](SEQLEN, block_size=BLOCK, window_blocks=1)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, SEQLEN, HEAD_DIM, generator=gen) for _ in range(3))

    block_mask = baselines.flex_block_mask_from_layout(layout, SEQLEN, causal)  # the layout's: CPU
    assert block_mask.kv_num_blocks.device.type == "cpu"
    with warnings.catch_warnings():  # "called without torch.compile()": eager is the point here
        warnings.simplefilter("ignore", UserWarning)
        flex = flex_attention(q, k, v, block_mask=block_mask)

    allowed = expand_block_mask(layout.block_mask, BLOCK, SEQLEN, SEQLEN)[0]
    if causal:
        allowed = allowed & torch.ones(SEQLEN, SEQLEN, dtype=torch.bool).tril()
    assert not allowed.all()  # a layout that leaves something out, or the check proves nothing
    expected = attention_float64(q, k, v, allowed)
    everything = torch.ones_like(allowed)
    dense = attention_float64(q, k, v, everything.tril() if causal else everything)
    assert float((flex.double() - dense).abs().max()) > 0.1  # not dense attention
    torch.testing.assert_close(flex.double(), expected, atol=1e-5, rtol=1e-5)

    # and flashtrain's op (B, S, H, D) on the same layout agrees with flex
    ours = blocksparse_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), layout, causal=causal)
    torch.testing.assert_close(ours.transpose(1, 2), flex, atol=1e-4, rtol=1e-4)
