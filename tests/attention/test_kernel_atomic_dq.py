"""The backward's atomic-dQ path (flash_backward(deterministic=False): dQ by fp32 atomics inside
the dK/dV kernel, then scaled into dq's dtype) against the float64 definition, with every
feature: GQA, varlen with an empty sequence, dropout, windows, block-sparse, softcap, ALiBi.
The deterministic two-kernel path is what the other kernel tests run."""

import pytest
import torch
from kernel_testing import check_kernels_against_definition, cu_seqlens, run_kernels

from flashtrain.kernels import tuning
from flashtrain.kernels.dropout_mask import dropout_keep_mask

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route


def _qkv(shape_q, shape_k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    make = lambda shape: torch.randn(shape, generator=gen).to(dtype)
    return make(shape_q), make(shape_k), make(shape_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "causal, window, softcap, alibi",
    [(True, (-1, -1), 0.0, False), (False, (5, 3), 3.0, True)],
    ids=["causal", "window-softcap-alibi"],
)
def test_dense_gqa(dtype, causal, window, softcap, alibi):
    q, k, v = _qkv((2, 37, 4, 24), (2, 45, 2, 24), dtype, seed=1)  # Sq != Sk, odd head_dim
    slopes = 0.1 + 0.3 * torch.rand(2, 4, generator=torch.Generator().manual_seed(2))
    check_kernels_against_definition(
        q, k, v, scale=0.4, causal=causal, window=window, softcap=softcap,
        alibi_slopes=slopes if alibi else None, deterministic=False,
    )  # fmt: skip


def test_varlen_dropout():
    lens_q, lens_k = [9, 0, 30], [12, 5, 21]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q, k, v = _qkv((sum(lens_q), 2, 16), (sum(lens_k), 1, 16), torch.float32, seed=3)
    keep = dropout_keep_mask(11, 3, 2, max(lens_q), max(lens_k), 0.3, "cpu", cu_q, cu_k)
    check_kernels_against_definition(
        q, k, v, scale=0.4, causal=True, dropout_p=0.3, seed=11, cu_q=cu_q, cu_k=cu_k,
        keep_mask=keep, deterministic=False,
    )  # fmt: skip


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_blocksparse(causal):
    block_mask = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(4)) < 0.6
    block_mask[:, :, 0] = True
    block_mask[0, 1, :] = False  # a query block that sees nothing: its dQ rows stay 0
    q, k, v = _qkv((1, 150, 2, 16), (1, 150, 2, 16), torch.float16, seed=5)
    check_kernels_against_definition(
        q, k, v, scale=0.5, causal=causal, block_mask=block_mask, block_size=64,
        deterministic=False,
    )  # fmt: skip


def test_matches_the_deterministic_path():
    """Same dK/dV bit for bit (same kernel, same order); dQ equal up to summation order."""
    q, k, v = _qkv((1, 70, 2, 32), (1, 70, 1, 32), torch.float32, seed=6)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    fast = run_kernels(q, k, v, dout, scale=0.3, causal=True, deterministic=False)
    exact = run_kernels(q, k, v, dout, scale=0.3, causal=True, deterministic=True)
    assert torch.equal(fast[3], exact[3]) and torch.equal(fast[4], exact[4])
    torch.testing.assert_close(fast[2], exact[2], rtol=1e-5, atol=1e-5)
    assert fast[2].abs().max() > 0.1  # dq was written


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic-dQ"])
def test_grouped_query_split_per_query_head(deterministic):
    """Grouped-query dK/dV with one program per query head into float32 shares summed per group
    (tuning.split_group: the GPU default at d > 64), dense with a group of 3 and varlen with an
    empty sequence, in both backward modes."""
    q, k, v = _qkv((2, 29, 6, 24), (2, 41, 2, 24), torch.float32, seed=8)
    lens_q, lens_k = [9, 0, 30], [12, 5, 21]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    vq, vk, vv = _qkv((sum(lens_q), 4, 16), (sum(lens_k), 2, 16), torch.float16, seed=9)
    with tuning.forced_group_split(True):
        check_kernels_against_definition(q, k, v, scale=0.4, causal=True, window=(6, 2),
                                         deterministic=deterministic)  # fmt: skip
        check_kernels_against_definition(vq, vk, vv, scale=0.5, causal=True, cu_q=cu_q, cu_k=cu_k,
                                         deterministic=deterministic)  # fmt: skip


def test_grouped_query_split_matches_the_group_loop():
    """The same dK/dV whether a program loops over the group or each query head adds its share
    afterwards (float32 either way; equal up to summation order)."""
    q, k, v = _qkv((1, 50, 4, 32), (1, 50, 1, 32), torch.float32, seed=10)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(11))
    with tuning.forced_group_split(True):
        split = run_kernels(q, k, v, dout, scale=0.3, causal=True, deterministic=True)
    with tuning.forced_group_split(False):
        loop = run_kernels(q, k, v, dout, scale=0.3, causal=True, deterministic=True)
    for a, b in zip(split[2:5], loop[2:5]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert b.abs().max() > 0.1


def test_head_dims_past_128_take_the_dq_kernel():
    """At block_d 256 the atomic dQ came out wrong on an H200 (benchmarks/results/gpu-suite-
    2026-11-27-nvidia-h200): head_dim 129-256 run the dQ kernel whatever deterministic says, so
    dQ is bit for bit the deterministic one (it differs in summation order at d <= 128)."""
    assert tuning.atomic_dq_exact(128) and not tuning.atomic_dq_exact(256)
    q, k, v = _qkv((1, 70, 2, 160), (1, 70, 2, 160), torch.float32, seed=12)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(13))
    fast = run_kernels(q, k, v, dout, scale=0.1, causal=True, deterministic=False)
    exact = run_kernels(q, k, v, dout, scale=0.1, causal=True, deterministic=True)
    assert torch.equal(fast[2], exact[2]) and fast[2].abs().max() > 0.1
