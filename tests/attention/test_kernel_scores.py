"""Soft-capping, ALiBi and odd head dims through the launchers, against the float64 definition:
out, lse, dq, dk, dv; dense, varlen and block-sparse; causal, windows, Sq != Sk, GQA."""

import pytest
import torch
from kernel_testing import check_kernels_against_definition, cu_seqlens, run_kernels

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route


def _qkv(shape_q, shape_k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    make = lambda shape: torch.randn(shape, generator=gen).to(dtype)
    return make(shape_q), make(shape_k), make(shape_k)


def _slopes(batch, heads, seed):
    return 0.05 + 0.45 * torch.rand(batch, heads, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal, window, softcap, alibi",
    [
        (2, 37, 37, 2, 1, True, (-1, -1), 5.0, True),  # both, GQA
        (1, 45, 70, 2, 2, False, (-1, -1), 2.0, False),  # softcap alone, Sq < Sk
        (1, 70, 45, 4, 2, True, (-1, -1), 0.0, True),  # ALiBi alone, Sq > Sk: rows with no key
        (2, 33, 33, 2, 1, False, (5, 3), 3.0, True),  # a window
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_dense_softcap_alibi(
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal, window, softcap, alibi, dtype
):
    q, k, v = _qkv((batch, seqlen_q, heads_q, 32), (batch, seqlen_k, heads_kv, 32), dtype, seqlen_q)
    # scale 0.5 puts scores where the cap bites (|s| up to ~10)
    check_kernels_against_definition(
        q, k, v, scale=0.5, causal=causal, window=window, softcap=softcap,
        alibi_slopes=_slopes(batch, heads_q, 1) if alibi else None,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_varlen_softcap_alibi(dtype):
    """Positions and the ALiBi distance restart in every sequence; an empty one is skipped."""
    lens_q, lens_k = [5, 0, 33, 17], [7, 3, 33, 12]
    q, k, v = _qkv((sum(lens_q), 4, 16), (sum(lens_k), 2, 16), dtype, 3)
    check_kernels_against_definition(
        q, k, v, scale=0.6, causal=True, softcap=4.0, alibi_slopes=_slopes(4, 4, 2),
        cu_q=cu_seqlens(lens_q), cu_k=cu_seqlens(lens_k),
    )  # fmt: skip


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_blocksparse_softcap_alibi(causal):
    gen = torch.Generator().manual_seed(4)
    block_mask = torch.rand(2, 3, 3, generator=gen) < 0.6
    block_mask[:, :, 0] = True
    block_mask[0, 1, :] = False  # a query block that sees nothing
    q, k, v = _qkv((1, 150, 2, 16), (1, 150, 2, 16), torch.float32, 5)
    check_kernels_against_definition(
        q, k, v, scale=0.5, causal=causal, softcap=3.0, alibi_slopes=_slopes(1, 2, 6),
        block_mask=block_mask, block_size=64,
    )  # fmt: skip


@pytest.mark.parametrize("head_dim", [5, 33, 72, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_any_head_dim(head_dim, dtype):
    """BLOCK_D is the next power of two (>= 16); the padding columns must stay out of every result."""
    q, k, v = _qkv((1, 21, 2, head_dim), (1, 26, 1, head_dim), dtype, head_dim)
    check_kernels_against_definition(q, k, v, scale=head_dim**-0.5, causal=True)


def test_features_off_is_todays_result():
    """softcap=0 and alibi_slopes=None compile to the plain kernels: same bits as the defaults."""
    q, k, v = _qkv((1, 40, 2, 16), (1, 40, 2, 16), torch.float32, 7)
    dout = torch.randn_like(q)
    plain = run_kernels(q, k, v, dout, scale=0.3, causal=True)
    explicit = run_kernels(q, k, v, dout, scale=0.3, causal=True, softcap=0.0, alibi_slopes=None)
    for a, b in zip(plain, explicit):
        assert torch.equal(a, b)


def test_zero_slopes_equal_no_alibi():
    q, k, v = _qkv((1, 40, 2, 16), (1, 40, 2, 16), torch.float32, 8)
    dout = torch.randn_like(q)
    plain = run_kernels(q, k, v, dout, scale=0.3)
    zero = run_kernels(q, k, v, dout, scale=0.3, alibi_slopes=torch.zeros(1, 2))
    for a, b in zip(plain, zero):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(softcap=-1.0), r"softcap must be a finite number >= 0"),
        (dict(alibi_slopes=torch.ones(2)), r"alibi_slopes must be None or a float32 \(batch, heads_q\) = \(1, 2\)"),
        (dict(alibi_slopes=torch.ones(1, 2, dtype=torch.float64)), "alibi_slopes must be None or a float32"),
        (dict(seed=-3), r"seed must be an int in \[0, 2\*\*63\)"),
        (dict(seed=torch.tensor([1], dtype=torch.int32)), "seed must be a Python int or a 1-element int64 tensor"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_value_errors(change, message):
    q, k, v = _qkv((1, 8, 2, 16), (1, 8, 2, 16), torch.float32, 9)
    with pytest.raises(ValueError, match=message):
        run_kernels(q, k, v, torch.randn_like(q), scale=0.3, **change)


@pytest.mark.parametrize("head_dim", [0, 257])
def test_unsupported_head_dim(head_dim):
    q, k, v = _qkv((1, 8, 2, head_dim), (1, 8, 2, head_dim), torch.float32, 10)
    with pytest.raises(
        ValueError, match=r"head_dim=\d+ is not supported by the kernels: allowed 1..256"
    ):
        run_kernels(q, k, v, torch.randn_like(q), scale=0.3)


def test_strided_head_dim_is_refused():
    q, k, v = _qkv((1, 8, 2, 32), (1, 8, 2, 32), torch.float32, 11)
    with pytest.raises(ValueError, match="head_dim contiguous"):
        run_kernels(q[..., ::2], k[..., ::2], v[..., ::2], torch.randn(1, 8, 2, 16), scale=0.3)
