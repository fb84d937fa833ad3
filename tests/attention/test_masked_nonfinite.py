"""Masked entries never contribute (docs/attention_semantics.md; issue 25.10): a NaN or inf in a
key or value that a query row cannot see (past the causal diagonal, outside the window, in a
block the row's mask drops) leaves that row's out, lse and dq as if the value were finite, on
both routes and in the float64 reference; a row that sees it is not finite.

Before the rule the reference made 1 row NaN, the PyTorch path all rows (0 * NaN in p @ V), the
kernels every row of the tiles that held it."""

import pytest
import torch
from attention_testing import forward_backward

from flashtrain.attention import blocksparse_attn_func, flash_attn_func
from flashtrain.attention.reference import allowed_mask, attention_reference, fold_window

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def _poison(k, v, key, where, value):
    """k, v with `value` at key position `key` (all heads, all dims) of K, V or both."""
    k, v = k.clone(), v.clone()
    if where in ("k", "kv"):
        k[:, key] = value
    if where in ("v", "kv"):
        v[:, key] = value
    return k, v


def _check(got, want, sees, dtype):
    """got/want: (out, lse, dq) of (B, Sq, H, D), (B, H, Sq), (B, Sq, H, D); sees: bool (Sq,)
    rows that see the poisoned key (the same for every head here)."""
    out, lse, dq = got
    unseen = ~sees
    torch.testing.assert_close(out[:, unseen].double(), want[0][:, unseen], **TOL[dtype])
    torch.testing.assert_close(lse[:, :, unseen].double(), want[1][:, :, unseen], **TOL[dtype])
    torch.testing.assert_close(dq[:, unseen].double(), want[2][:, unseen], **TOL[dtype])
    assert not torch.isfinite(out[:, sees]).any(), "a row that sees a NaN/inf must not be finite"


CASES = [
    # (seqlen_q, seqlen_k, causal, window, poisoned key position)
    (40, 40, True, (-1, -1), 23),  # the case: rows 0..22 cannot see key 23
    (24, 40, True, (-1, -1), 31),  # bottom-right alignment: rows 0..14 cannot see it
    (37, 37, False, (5, 3), 18),  # a sliding window on both sides
]


@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, window, key", CASES)
@pytest.mark.parametrize(
    "where, value", [("kv", float("nan")), ("v", float("inf"))], ids=["nan-kv", "inf-v"]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
def test_unseen_nonfinite_key_or_value_does_not_reach_a_row(
    route, seqlen_q, seqlen_k, causal, window, key, where, value, dtype, deterministic
):
    torch.manual_seed(seqlen_q + key)
    q = torch.randn(1, seqlen_q, 2, 16, dtype=dtype)
    k, v = (torch.randn(1, seqlen_k, 1, 16, dtype=dtype) for _ in range(2))
    k, v = _poison(k, v, key, where, value)
    dout = torch.randn_like(q)
    opts = dict(causal=causal, window_size=window)
    got = forward_backward(
        lambda a, b, c: flash_attn_func(
            a, b, c, deterministic=deterministic, return_lse=True, **opts
        ),
        q, k, v, dout,
    )  # fmt: skip
    want = forward_backward(
        lambda a, b, c: attention_reference(a, b, c, **opts), q.double(), k.double(), v.double(),
        dout.double(),
    )  # fmt: skip
    sees = allowed_mask(seqlen_q, seqlen_k, fold_window(window, causal, seqlen_k))[:, key]
    assert 0 < int(sees.sum()) < seqlen_q  # some rows see it, some do not
    _check(got[:3], want[:3], sees, dtype)


def test_reference_follows_the_rule(route):
    """The float64 reference with the NaN equals itself with a finite value there, for the rows
    that cannot see it (out and dq), and is NaN for those that can."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 40, 2, 16, dtype=torch.float64) for _ in range(3))
    dout = torch.randn_like(q)
    run = lambda kk, vv: forward_backward(  # noqa: E731
        lambda a, b, c: attention_reference(a, b, c, causal=True), q, kk, vv, dout
    )
    poisoned = run(*_poison(k, v, 23, "kv", float("nan")))
    clean = run(*_poison(k, v, 23, "kv", 0.5))
    for got, want in zip(poisoned[:3:2], clean[:3:2]):  # out, dq
        torch.testing.assert_close(got[:, :23], want[:, :23], atol=1e-12, rtol=1e-12)
        assert got[:, 23:].isnan().all()


def test_blocksparse_dropped_block_with_nan_does_not_reach_a_row(route):
    """Head 0 keeps key block 0 for query block 1, head 1 does not: on the PyTorch path both
    heads' rows share the chunk's columns, so only the mask keeps head 1 clean."""
    torch.manual_seed(11)
    dtype = torch.float32
    q = torch.randn(1, 128, 2, 16, dtype=dtype)
    k, v = (torch.randn(1, 128, 1, 16, dtype=dtype) for _ in range(2))
    k, v = _poison(k, v, 10, "kv", float("nan"))
    mask = torch.tensor([[[1, 0], [1, 1]], [[1, 0], [0, 1]]], dtype=torch.bool)
    dout = torch.randn_like(q)
    out, lse, dq, _, _ = forward_backward(
        lambda a, b, c: blocksparse_attn_func(a, b, c, mask, block_size=64, return_lse=True),
        q, k, v, dout,
    )  # fmt: skip
    from flashtrain.attention.reference import expand_block_mask

    element_mask = expand_block_mask(mask, 64, 128, 128)[None]  # (1, 2, 128, 128)
    want = forward_backward(
        lambda a, b, c: attention_reference(a, b, c, element_mask=element_mask),
        q.double(), k.double(), v.double(), dout.double(),
    )  # fmt: skip
    # head 1, query block 1 cannot see key 10; every other (head, row) can
    torch.testing.assert_close(out[0, 64:, 1].double(), want[0][0, 64:, 1], **TOL[dtype])
    torch.testing.assert_close(lse[0, 1, 64:].double(), want[1][0, 1, 64:], **TOL[dtype])
    torch.testing.assert_close(dq[0, 64:, 1].double(), want[2][0, 64:, 1], **TOL[dtype])
    assert out[0, :, 0].isnan().all() and out[0, :64, 1].isnan().all()


def test_nan_in_another_packed_sequence_does_not_reach_a_row(route):
    """Packed sequences: a NaN in sequence 1's keys and values leaves sequence 0 as it is alone."""
    from flashtrain.attention import flash_attn_varlen_func

    torch.manual_seed(13)
    q = torch.randn(50, 2, 16)
    k, v = (torch.randn(50, 1, 16) for _ in range(2))
    k[30], v[30] = float("nan"), float("nan")  # in sequence 1 (rows 21..49)
    cu = torch.tensor([0, 21, 50], dtype=torch.int32)
    dout = torch.randn_like(q)
    packed = forward_backward(
        lambda a, b, c: flash_attn_varlen_func(a, b, c, cu, cu, 29, 29, causal=True, return_lse=True),
        q, k, v, dout,
    )  # fmt: skip
    alone = forward_backward(
        lambda a, b, c: flash_attn_func(a, b, c, causal=True, return_lse=True),
        q[None, :21], k[None, :21], v[None, :21], dout[None, :21],
    )  # fmt: skip
    torch.testing.assert_close(packed[0][:21], alone[0][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(packed[1][:, :21], alone[1][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(packed[2][:21], alone[2][0], atol=1e-6, rtol=1e-6)
    assert packed[0][21:30].isfinite().all() and packed[0][30:].isnan().all()
