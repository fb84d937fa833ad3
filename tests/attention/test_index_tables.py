"""Integer tables the kernels index themselves (cu_seqlens, block-sparse tables) give the same
answer whatever their strides: the API makes them contiguous, the kernel launchers refuse a
strided one (issue 25.2: `cu[::2]` made the kernels read the entries in between)."""

import pytest
import torch
from attention_testing import forward_backward

from flashtrain.attention import flash_attn_varlen_func


def _strided(values):
    """A view of `values` with stride 2 whose skipped entries are junk (99)."""
    spread = torch.full((2 * len(values),), 99, dtype=torch.int32)
    spread[::2] = torch.tensor(values, dtype=torch.int32)
    view = spread[::2]
    assert view.stride(0) == 2 and view.tolist() == list(values)
    return view


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_strided_cu_seqlens_equal_contiguous(route, dtype):
    torch.manual_seed(25)
    cu_q, cu_k = _strided([0, 5, 17, 40]), _strided([0, 9, 12, 31])
    q = torch.randn(40, 4, 16, dtype=dtype)
    k, v = (torch.randn(31, 2, 16, dtype=dtype) for _ in range(2))
    dout = torch.randn_like(q)

    def run(cq, ck):
        return forward_backward(
            lambda a, b, c: flash_attn_varlen_func(
                a, b, c, cq, ck, 23, 19, causal=True, return_lse=True
            ),
            q, k, v, dout,
        )  # fmt: skip

    strided = run(cu_q, cu_k)
    contiguous = run(cu_q.contiguous(), cu_k.contiguous())
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), strided, contiguous):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=f"{name} differs")


@pytest.mark.single_route
def test_kernel_launchers_refuse_strided_tables():
    """Below the API (flashtrain.kernels called directly) a strided table is refused."""
    from flashtrain.kernels.flash_fwd import flash_forward

    q = torch.randn(40, 2, 16)
    out, lse = torch.empty_like(q), torch.empty(2, 40)
    cu = _strided([0, 17, 40])
    common = dict(max_seqlen_q=23, max_seqlen_k=23, softmax_scale=0.25, window_left=1 << 30,
                  window_right=1 << 30, dropout_p=0.0, seed=0)  # fmt: skip
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32 with its last dim contiguous"):
        flash_forward(q, q, q, out, lse, cu_seqlens_q=cu, cu_seqlens_k=cu.contiguous(), **common)
    from flashtrain.attention.sparsity.layout import BlockSparseLayout

    tables = BlockSparseLayout(torch.ones(1, 2, 2, dtype=torch.bool), 64).tables(
        128, 128, False, "cpu"
    )
    strided_index = torch.zeros(1, 2, 4, dtype=torch.int32)[..., ::2]
    bad = tables.as_list()
    bad[1] = strided_index
    x = torch.randn(1, 128, 2, 16)
    with pytest.raises(
        ValueError, match="partial_index must be int32 with its last dim contiguous"
    ):
        flash_forward(x, x, x, torch.empty_like(x), torch.empty(1, 2, 128), cu_seqlens_q=None,
                      cu_seqlens_k=None, tables=bad, block_size=64, **common)  # fmt: skip
