"""flash_attn_varlen_func equals flash_attn_func run on each sequence alone; pad/unpad round trip."""

import pytest
import torch
from attention_testing import assert_matches_reference, forward_backward, reference_results

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func, pad_input, unpad_input


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize(
    "lens_q, lens_k, causal, window",
    [
        ([5, 0, 33, 17], [7, 3, 33, 12], True, (-1, -1)),  # empty sequence, Sq != Sk both ways
        ([40, 1, 23], [40, 1, 23], False, (-1, -1)),
        ([31, 50], [31, 50], True, (6, -1)),  # causal sliding window
        ([29, 44], [35, 44], False, (4, 9)),
    ],
)
# fp32: the slower twin (~3.5 s a case under the interpreter), under -m slow (the suite's 10
# minutes); the dense and block-sparse tests keep fp32 in the normal suite
@pytest.mark.parametrize(
    "dtype",
    [torch.float16, pytest.param(torch.float32, marks=pytest.mark.slow)],
    ids=["fp16", "fp32"],
)
def test_equals_each_sequence_alone(route, lens_q, lens_k, causal, window, dtype):
    torch.manual_seed(sum(lens_q))
    heads_q, heads_kv, head_dim = 4, 2, 32
    q = torch.randn(sum(lens_q), heads_q, head_dim, dtype=dtype)
    k = torch.randn(sum(lens_k), heads_kv, head_dim, dtype=dtype)
    v = torch.randn(sum(lens_k), heads_kv, head_dim, dtype=dtype)
    dout = torch.randn_like(q)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    opts = dict(causal=causal, window_size=window, return_lse=True)
    packed = forward_backward(
        lambda a, b, c: flash_attn_varlen_func(
            a, b, c, cu_q, cu_k, max(lens_q), max(lens_k), **opts
        ),
        q,
        k,
        v,
        dout,
    )
    out, lse, dq, dk, dv = packed
    assert out.shape == q.shape and lse.shape == (heads_q, q.shape[0])
    for i in range(len(lens_q)):
        rq, rk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if lens_q[i] == 0:
            continue
        alone = forward_backward(
            lambda a, b, c: flash_attn_func(a, b, c, **opts),
            q[None, rq],
            k[None, rk],
            v[None, rk],
            dout[None, rq],
        )
        torch.testing.assert_close(out[rq], alone[0][0], atol=0, rtol=0)
        torch.testing.assert_close(lse[:, rq], alone[1][0], atol=0, rtol=0)
        torch.testing.assert_close(dq[rq], alone[2][0], atol=0, rtol=0)
        torch.testing.assert_close(dk[rk], alone[3][0], atol=0, rtol=0)
        torch.testing.assert_close(dv[rk], alone[4][0], atol=0, rtol=0)
    # Keys of a sequence that has no queries get no gradient.
    empty = [i for i, n in enumerate(lens_q) if n == 0]
    for i in empty:
        assert torch.equal(dk[cu_k[i] : cu_k[i + 1]], torch.zeros_like(dk[cu_k[i] : cu_k[i + 1]]))


def test_varlen_against_float64_reference(route):
    """Independent of flash_attn_func: each sequence against the float64 definition."""
    torch.manual_seed(11)
    lens = [13, 38, 7]
    q, k, v = (torch.randn(sum(lens), 2, 16) for _ in range(3))
    dout = torch.randn_like(q)
    cu = _cu(lens)
    out, lse, dq, dk, dv = forward_backward(
        lambda a, b, c: flash_attn_varlen_func(
            a, b, c, cu, cu, 38, 38, causal=True, return_lse=True
        ),
        q,
        k,
        v,
        dout,
    )
    for i in range(len(lens)):
        r = slice(cu[i], cu[i + 1])
        truth, low = reference_results(
            q[None, r], k[None, r], v[None, r], dout[None, r], causal=True
        )
        got = (out[None, r], lse[None, :, r], dq[None, r], dk[None, r], dv[None, r])
        assert_matches_reference(got, truth, low, torch.float32)


def test_unpad_pad_round_trip_and_padding_is_ignored(route):
    torch.manual_seed(12)
    batch, seqlen, heads, head_dim = 3, 20, 2, 16
    mask = torch.zeros(batch, seqlen, dtype=torch.bool)
    for b, n in enumerate([20, 7, 13]):
        mask[b, :n] = True
    x = torch.randn(batch, seqlen, heads, head_dim)
    packed, indices, cu, max_len, used = unpad_input(x, mask)
    assert (
        packed.shape == (40, heads, head_dim) and cu.tolist() == [0, 20, 27, 40] and max_len == 20
    )
    assert used.dtype == torch.int32 and used.tolist() == [20, 7, 13]
    restored = pad_input(packed, indices, batch, seqlen)
    assert torch.equal(restored[mask], x[mask]) and torch.equal(
        restored[~mask], torch.zeros_like(x[~mask])
    )
    # Attention through the packed path never reads padding: changing it changes nothing.
    out1 = pad_input(
        flash_attn_varlen_func(packed, packed, packed, cu, cu, max_len, max_len),
        indices,
        batch,
        seqlen,
    )
    x2 = x.clone()
    x2[~mask] = 1e3
    p2 = unpad_input(x2, mask)[0]
    out2 = pad_input(
        flash_attn_varlen_func(p2, p2, p2, cu, cu, max_len, max_len), indices, batch, seqlen
    )
    assert torch.equal(out1, out2)


def test_unpad_rejects_mismatched_mask():
    with pytest.raises(ValueError, match="attention_mask shape"):
        unpad_input(torch.randn(2, 5, 3), torch.ones(2, 4))
