"""ALiBi and softcap against the float64 reference (flash-attn's semantics: the softcap first,
then -slope * |i + Sk - Sq - j|, then the masks): dense, varlen and block-sparse, causal and
not, GQA, odd sizes, output, LSE and every gradient."""

import pytest
import torch
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)

from flashtrain.attention import blocksparse_attn_func, flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.reference import expand_block_mask


def _slopes(kind, batch, heads):
    """None, (H,) or (B, H) float32 slopes: ALiBi's geometric ones, then per-batch variants."""
    if kind is None:
        return None
    base = 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads)
    return base if kind == "H" else base * torch.rand(batch, 1) * 2


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window, softcap, alibi, dtype)
CASES = [
    (1, 37, 37, 4, 2, 16, True, (-1, -1), 0.0, "H", torch.float16),  # ALiBi alone, causal, GQA
    (2, 29, 45, 2, 1, 33, False, (-1, -1), 3.0, "BH", torch.float32),  # Sq < Sk, odd head_dim
    (1, 45, 29, 4, 4, 8, True, (-1, -1), 2.0, None, torch.float16),  # softcap, rows with no key
    (1, 50, 50, 2, 2, 32, False, (8, 4), 1.5, "H", torch.float32),  # with a window
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + f"-{c[8]}-{c[9]}")
def test_dense_matches_reference(case):
    *shape, causal, window, softcap, alibi, dtype = case
    torch.manual_seed(sum(shape))
    q, k, v = random_qkv(*shape, dtype)
    q = q * 3  # larger scores, so the cap bends them
    dout = torch.randn_like(q)
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    opts["alibi_slopes"] = _slopes(alibi, shape[0], shape[3])
    got = forward_backward(
        lambda a, b, c: flash_attn_func(a, b, c, return_lse=True, **opts), q, k, v, dout
    )
    truth, low = reference_results(q, k, v, dout, **opts)
    assert_matches_reference(got, truth, low, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_reference_per_sequence(causal):
    """Each sequence uses its own row of the slopes and its own bottom-right alignment."""
    torch.manual_seed(7)
    lens_q, lens_k = [13, 0, 30], [20, 5, 30]
    cu_q, cu_k = (
        torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
        for n in (lens_q, lens_k)
    )
    q = torch.randn(sum(lens_q), 4, 16) * 3
    k, v = torch.randn(sum(lens_k), 2, 16), torch.randn(sum(lens_k), 2, 16)
    dout = torch.randn_like(q)
    slopes = _slopes("BH", 3, 4)
    opts = dict(causal=causal, softcap=2.5)
    run = lambda a, b, c: flash_attn_varlen_func(
        a, b, c, cu_q, cu_k, 30, 30, alibi_slopes=slopes, return_lse=True, **opts
    )
    out, lse, dq, dk, dv = forward_backward(run, q, k, v, dout)
    for i in (0, 2):
        rq, rk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        sequence = (q[None, rq], k[None, rk], v[None, rk], dout[None, rq])
        truth, low = reference_results(*sequence, alibi_slopes=slopes[i], **opts)
        got = (out[None, rq], lse[None, :, rq], dq[None, rq], dk[None, rk], dv[None, rk])
        assert_matches_reference(got, truth, low, torch.float32)
    assert torch.equal(dk[20:25], torch.zeros_like(dk[20:25]))  # keys of the empty sequence


@pytest.mark.parametrize("causal", [False, True])
def test_blocksparse_matches_reference(causal):
    torch.manual_seed(8)
    q, k, v = random_qkv(1, 150, 150, 2, 1, 16, torch.float32)
    q = q * 3
    dout = torch.randn_like(q)
    mask = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(1)) < 0.6
    mask[:, torch.arange(3), torch.arange(3)] = True
    opts = dict(causal=causal, softcap=4.0, alibi_slopes=_slopes("H", 1, 2))
    run = lambda a, b, c: blocksparse_attn_func(
        a, b, c, mask, block_size=64, return_lse=True, **opts
    )
    got = forward_backward(run, q, k, v, dout)
    element_mask = expand_block_mask(mask, 64, 150, 150)[None]
    truth, low = reference_results(q, k, v, dout, element_mask=element_mask, **opts)
    assert_matches_reference(got, truth, low, torch.float32)
