"""torch.compile traces through the attention ops without a graph break (fullgraph=True fails on
any break), forward and backward, with the same numbers as eager."""

import pytest
import torch

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.ops import AttentionArgs

pytestmark = pytest.mark.single_route  # each test picks its route


class TinyAttention(torch.nn.Module):
    def __init__(self, width=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):  # x (B, T, C)
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).unbind(2)  # (B, T, H, D)
        y = flash_attn_func(q, k, v, causal=True)
        return self.proj(y.reshape(b, t, c))


@pytest.mark.parametrize(
    "route,compiler",
    # inductor asserts the output strides the fake impls declare; aot_eager keeps the interpreter fast.
    [("torch", "inductor"), ("torch", "aot_eager"), ("triton", "aot_eager")],
)
def test_compile_fullgraph_matches_eager(route, compiler, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", route)
    torch.manual_seed(0)
    model = TinyAttention()
    x = torch.randn(2, 24, 32)
    eager_out = model(x)
    eager_out.square().sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    out = compiled(x)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager_out, atol=1e-5, rtol=1e-5)
    for g, e in zip([p.grad for p in model.parameters()], eager_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_varlen_compiles(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    q, k, v = (torch.randn(10, 2, 16, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    fn = torch.compile(
        lambda a, b, c: flash_attn_varlen_func(a, b, c, cu, cu, 7, 7, causal=True),
        fullgraph=True,
        backend="aot_eager",
    )
    fn(q, k, v).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("scores", ["plain", "softcap_alibi"])
def test_ops_pass_opcheck(packed, scores, monkeypatch):
    """Fake impls agree with the real ones on shapes, dtypes, strides and devices (strided q from
    a qkv split), every returned tensor on q's device."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    qkv = torch.randn(2, 13, 3, 2, 16)  # (B, S, 3, H, D): q, k, v are non-contiguous views
    q, k, v = qkv.unbind(2)
    cu = None
    if packed:
        q, k, v = (x.reshape(26, 2, 16) for x in (q, k, v))
        cu = torch.tensor([0, 5, 26], dtype=torch.int32)
    fancy = scores == "softcap_alibi"
    args = AttentionArgs(
        q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=21, max_seqlen_k=21,
        softmax_scale=0.25, window_left=-1, window_right=0, dropout_p=0.0,
        softcap=5.0 if fancy else 0.0, alibi_slopes=torch.rand(2, 2) if fancy else None,
        deterministic=True, block_mask=None, block_tables=[], block_size=128,
    )  # fmt: skip
    torch.library.opcheck(torch.ops.flashtrain.attention_forward.default, tuple(args))
    out, lse, seed = torch.ops.flashtrain.attention_forward(*args)
    assert seed.device == q.device and seed.dtype == torch.int64
    bwd_args = (torch.randn_like(out), out, lse, seed, *args)
    torch.library.opcheck(torch.ops.flashtrain.attention_backward.default, bwd_args)
