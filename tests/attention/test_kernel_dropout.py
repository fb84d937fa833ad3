"""Dropout through the launchers: a device-tensor seed draws the same Philox stream as the same
int; dropout_keep_mask regenerates exactly the mask the forward applied and the backward
differentiated (checked against the float64 definition with that mask)."""

import pytest
import torch
from kernel_testing import check_kernels_against_definition, cu_seqlens, run_kernels

from flashtrain.kernels.dropout_mask import dropout_keep_mask

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route


def _qkv(shape_q, shape_k, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda shape: torch.randn(shape, generator=gen).to(dtype)
    return make(shape_q), make(shape_k), make(shape_k)


@pytest.mark.parametrize("seed", [1, 2**31 - 1, 2**63 - 100])
def test_tensor_seed_draws_the_int_seeds_stream(seed):
    """Values at the int32 / int64 edges: the kernels widen both forms to int64 the same way."""
    q, k, v = _qkv((2, 24, 2, 16), (2, 24, 1, 16), seed=1)
    dout = torch.randn_like(q)
    by_int = run_kernels(q, k, v, dout, scale=0.3, causal=True, dropout_p=0.3, seed=seed)
    by_tensor = run_kernels(
        q,
        k,
        v,
        dout,
        scale=0.3,
        causal=True,
        dropout_p=0.3,
        seed=torch.tensor([seed], dtype=torch.int64),
    )
    for a, b in zip(by_int, by_tensor):
        assert torch.equal(a, b)
    assert torch.equal(
        dropout_keep_mask(seed, 2, 2, 24, 24, 0.3, "cpu"),
        dropout_keep_mask(torch.tensor([seed]), 2, 2, 24, 24, 0.3, "cpu"),
    )
    other = run_kernels(q, k, v, dout, scale=0.3, causal=True, dropout_p=0.3, seed=seed ^ 1)
    assert not torch.equal(by_int[0], other[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_dense_replay_with_the_regenerated_mask(dtype):
    seed = torch.tensor([2**45 + 7])
    batch, seqlen_q, seqlen_k, heads_q = 2, 33, 47, 2
    q, k, v = _qkv((batch, seqlen_q, heads_q, 16), (batch, seqlen_k, 1, 16), dtype, seed=2)
    keep = dropout_keep_mask(seed, batch, heads_q, seqlen_q, seqlen_k, 0.25, "cpu")
    check_kernels_against_definition(
        q, k, v, scale=0.4, causal=True, softcap=3.0, dropout_p=0.25, seed=seed, keep_mask=keep
    )


def test_varlen_replay_and_mask_layout():
    lens_q, lens_k = [9, 0, 30], [12, 5, 21]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q, k, v = _qkv((sum(lens_q), 2, 16), (sum(lens_k), 2, 16), seed=3)
    keep = dropout_keep_mask(11, 3, 2, max(lens_q), max(lens_k), 0.4, "cpu", cu_q, cu_k)
    assert keep.shape == (3, 2, 30, 21) and keep.dtype == torch.bool
    for b, (n_q, n_k) in enumerate(zip(lens_q, lens_k)):
        inside = torch.zeros(30, 21, dtype=torch.bool)
        inside[:n_q, :n_k] = True
        assert not keep[b][:, ~inside].any()  # False outside the sequence
    check_kernels_against_definition(
        q,
        k,
        v,
        scale=0.4,
        dropout_p=0.4,
        seed=11,
        cu_q=cu_q,
        cu_k=cu_k,
        keep_mask=keep,
        alibi_slopes=torch.rand(3, 2),
    )


def test_keep_rate_and_independent_heads():
    keep = dropout_keep_mask(5, 2, 3, 64, 64, 0.3, "cpu").float()
    n = keep.numel()
    assert abs(keep.mean().item() - 0.7) < 5 * (0.3 * 0.7 / n) ** 0.5
    flat = keep.reshape(6, -1)
    assert all(not torch.equal(flat[i], flat[j]) for i in range(6) for j in range(i))


def test_bad_mask_arguments():
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        dropout_keep_mask(0, 1, 1, 4, 4, 1.0, "cpu")
    with pytest.raises(ValueError, match="given together"):
        dropout_keep_mask(0, 1, 1, 4, 4, 0.1, "cpu", cu_seqlens_q=cu_seqlens([4]))
    with pytest.raises(ValueError, match="batch \\+ 1 = 2 entries"):
        dropout_keep_mask(0, 1, 1, 4, 4, 0.1, "cpu", cu_seqlens([2, 2]), cu_seqlens([2, 2]))
