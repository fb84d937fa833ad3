"""torch.compile traces through the attention ops without a graph break (fullgraph=True fails on
any break), forward and backward, with the same numbers as eager."""

import pytest
import torch

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func


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
    "backend,compiler",
    # inductor asserts the output strides the fake impls declare; aot_eager keeps the interpreter fast.
    [("torch", "inductor"), ("torch", "aot_eager"), ("triton", "aot_eager")],
)
def test_compile_fullgraph_matches_eager(backend, compiler, monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", backend)
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
def test_ops_pass_opcheck(packed, monkeypatch):
    """Fake impls agree with the real ones on shapes, dtypes and strides (strided q from a qkv split)."""
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    qkv = torch.randn(2, 13, 3, 2, 16)  # (B, S, 3, H, D): q, k, v are non-contiguous views
    q, k, v = qkv.unbind(2)
    cu = None
    if packed:
        q, k, v = (x.reshape(26, 2, 16) for x in (q, k, v))
        cu = torch.tensor([0, 5, 26], dtype=torch.int32)
    args = (q, k, v, cu, cu, 21, 21, 0.25, -1, 0, 0.0, None, [], 128)
    torch.library.opcheck(torch.ops.flashtrain.attention_forward.default, args)
    out, lse, seed = torch.ops.flashtrain.attention_forward(*args)
    bwd_args = (torch.randn_like(out), q, k, v, out, lse, seed, *args[3:])
    torch.library.opcheck(torch.ops.flashtrain.attention_backward.default, bwd_args)
