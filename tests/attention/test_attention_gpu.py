"""GPU-only checks: bfloat16 (the interpreter's bf16 dot is unreliable) and real sizes on the
compiled kernels. Run on a CUDA machine: `pytest -m gpu`."""

import pytest
import torch
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func

pytestmark = [
    pytest.mark.single_route,  # CUDA tensors: the CPU route does not apply
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape",
    [
        (2, 1023, 1023, 8, 8, 128),
        (1, 2048, 1999, 16, 4, 64),
        (1, 511, 777, 4, 1, 96),
        (1, 300, 300, 4, 4, 256),
    ],
    ids=lambda s: "x".join(map(str, s)),
)
def test_gpu_matches_reference(shape, causal, dtype):
    torch.manual_seed(0)
    q, k, v = random_qkv(*shape, dtype, device="cuda")
    dout = torch.randn_like(q)
    got = forward_backward(
        lambda a, b, c: flash_attn_func(a, b, c, causal=causal, return_lse=True), q, k, v, dout
    )
    truth, low = reference_results(q, k, v, dout, causal=causal)
    assert_matches_reference(got, truth, low, dtype)


def test_gpu_varlen_window_dropout_bf16():
    torch.manual_seed(1)
    lens = [700, 3, 1500, 0, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(lens), 8, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, 1500, 1500, causal=True, window_size=(128, 0))
    for i, n in enumerate(lens):
        if n == 0:
            continue
        r = slice(int(cu[i]), int(cu[i + 1]))
        alone = flash_attn_func(
            q[None, r], k[None, r], v[None, r], causal=True, window_size=(128, 0)
        )
        torch.testing.assert_close(out[r], alone[0], atol=0, rtol=0)
    torch.manual_seed(3)
    a = flash_attn_varlen_func(q, k, v, cu, cu, 1500, 1500, dropout_p=0.1)
    torch.manual_seed(3)
    b = flash_attn_varlen_func(q, k, v, cu, cu, 1500, 1500, dropout_p=0.1)
    assert torch.equal(a, b)


def test_gpu_backward_bitwise_deterministic():
    torch.manual_seed(2)
    q, k, v = random_qkv(1, 4096, 4096, 8, 2, 128, torch.bfloat16, device="cuda")
    dout = torch.randn_like(q)
    fn = lambda a, b, c: flash_attn_func(a, b, c, causal=True, deterministic=True, return_lse=True)
    first, second = forward_backward(fn, q, k, v, dout), forward_backward(fn, q, k, v, dout)
    for x, y in zip(first, second):
        assert torch.equal(x, y)


def test_gpu_calls_never_synchronise_with_the_host():
    """Dense with dropout, varlen and block-sparse, forward and backward, under
    torch.cuda.set_sync_debug_mode("error"): any host sync raises (CUDA graphs need none)."""
    from flashtrain.attention import blocksparse_attn_func, sparsity

    q, k, v = (
        t.requires_grad_() for t in random_qkv(2, 256, 256, 4, 2, 64, torch.bfloat16, "cuda")
    )
    cu = torch.tensor([0, 100, 512], dtype=torch.int32, device="cuda")
    layout = sparsity.local(256, block_size=64, window_blocks=1)

    def calls():
        flash_attn_func(q, k, v, 0.1, None, True).sum().backward()
        flash_attn_varlen_func(q.view(512, 4, 64), k.view(512, 2, 64), v.view(512, 2, 64), cu, cu,
                               412, 412, causal=True).sum().backward()  # fmt: skip
        blocksparse_attn_func(q, k, v, layout, dropout_p=0.1).sum().backward()

    calls()  # compiles the kernels and builds the layout's device tables
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_gpu_64k_tokens_fit():
    """B=1, H=16, head_dim 64, seqlen 65536: forward + backward on one GPU, memory linear."""
    q, k, v = random_qkv(1, 65536, 65536, 16, 16, 64, torch.bfloat16, device="cuda")
    q.requires_grad_()
    torch.cuda.reset_peak_memory_stats()
    flash_attn_func(q, k, v, causal=True).sum().backward()
    torch.cuda.synchronize()
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    assert peak_gib < 4.0, f"peak {peak_gib:.2f} GiB: something stored O(N^2)"
