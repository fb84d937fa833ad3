"""Sequence-tiled Llama MLP (model.tile_tokens, flashtrain/models/tiled.py): the same loss and
gradients as the untiled block (the modules' own code is the reference), for tiles that do not
divide the tokens, packed tokens, inside recomputed and offloaded blocks, under autocast; and no
(tokens x d_ff) tensor ever exists whole."""

from __future__ import annotations

import pytest
import torch
from llama_testing import TINY_LLAMA, randomise, tiny_llama
from model_testing import grads
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flashtrain.data.lm_batches import lm_batch
from flashtrain.models import build_model, llama, model_config
from flashtrain.models.attention_layers import AttentionContext
from flashtrain.models.config import LlamaConfig
from flashtrain.models.tiled import TiledTokens, tiled_mlp_residual

# a wide MLP next to a narrow stream: a (tokens x d_ff) tensor is the largest a block makes
WIDE = dict(TINY_LLAMA, n_head=2, n_kv_head=1, d_model=16, d_ff=256)


@pytest.fixture(autouse=True)
def torch_attention(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")


def _block_and_context(cfg: dict, tokens_shape, dtype, seed=0):
    """A randomised LlamaBlock and the causal AttentionContext for (B, T) tokens."""
    torch.manual_seed(seed)
    model = randomise(build_model({**cfg, "n_layer": 1}, "reference")).to(dtype)
    positions = torch.arange(tokens_shape[-1]).expand(tokens_shape)
    cos, sin = model.rotary_tables(positions)
    ctx = AttentionContext(causal=True, rotary=(cos[..., None, :], sin[..., None, :]))
    return model.blocks[0], ctx


def _block_step(block, ctx, x, tile: int):
    """Output and gradients (input, every parameter) of the block with `tile` tokens per tile."""
    block.tile_tokens = tile
    block.zero_grad()
    x = x.detach().requires_grad_(True)
    y = block(x, ctx)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
    y.backward(g)
    named = {n: p.grad.clone() for n, p in block.named_parameters()}
    return y.detach(), {"input": x.grad, **named}


def _assert_close(got: dict, ref: dict, atol: float, rtol: float = 0.0):
    assert got.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("tile", [7, 44, 1])  # 45 tokens: 7 tiles of 7 and one of 3; 44 + 1
def test_tiled_block_matches_untiled_float64(tile):
    block, ctx = _block_and_context(TINY_LLAMA, (3, 15), torch.float64)
    x = torch.randn(3, 15, TINY_LLAMA["d_model"], dtype=torch.float64)
    y_ref, g_ref = _block_step(block, ctx, x, tile=0)
    y, g = _block_step(block, ctx, x, tile=tile)
    torch.testing.assert_close(y, y_ref, atol=1e-13, rtol=0)
    _assert_close(g, g_ref, atol=1e-12)


def test_tiled_block_float32_within_twice_the_untiled_error():
    """float32 against the float64 untiled block: tiling adds no error beyond rounding."""
    block, ctx = _block_and_context(TINY_LLAMA, (3, 15), torch.float64)
    x = torch.randn(3, 15, TINY_LLAMA["d_model"], dtype=torch.float64)
    y_ref, g_ref = _block_step(block, ctx, x, tile=0)
    block32 = block.float()
    y_plain, g_plain = _block_step(block32, ctx, x.float(), tile=0)
    y_tiled, g_tiled = _block_step(block32, ctx, x.float(), tile=7)
    for name, ref in [("output", y_ref), *g_ref.items()]:
        plain = y_plain if name == "output" else g_plain[name]
        tiled = y_tiled if name == "output" else g_tiled[name]
        plain_err = (plain.double() - ref).abs().max().item()
        tiled_err = (tiled.double() - ref).abs().max().item()
        assert tiled_err <= 2 * plain_err + 1e-6, (name, tiled_err, plain_err)


def test_tile_at_least_the_tokens_runs_the_plain_block(monkeypatch):
    calls = []
    monkeypatch.setattr(llama, "tiled_mlp_residual", lambda *a, **k: calls.append(1))
    block, ctx = _block_and_context(TINY_LLAMA, (3, 15), torch.float64)
    x = torch.randn(3, 15, TINY_LLAMA["d_model"], dtype=torch.float64)
    for tile in (45, 64):  # 45 tokens: one tile is the whole input, no tiling
        block.tile_tokens = tile
        block(x, ctx)
    assert calls == []
    block.tile_tokens = 44
    block(x, ctx)
    assert calls == [1]


def _lm_step(model, batch):
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), grads(model)


def _windows(rows: int, length: int, seed: int):
    """Token rows with EOS (0) at 3 random places each: packed documents (lm_batch)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, TINY_LLAMA["vocab_size"], (rows, length + 1), generator=g)
    for r in range(rows):
        tokens[r, torch.randperm(length - 1, generator=g)[:3] + 1] = 0
    return lm_batch(tokens.numpy(), eos_id=0)


@pytest.mark.parametrize(
    "recompute, packed",
    [("none", False), ("all", False), ("offload", False), ("none", True), ("offload", True)],
)
def test_tiled_llama_matches_untiled(recompute, packed):
    """The whole tiny Llama: padded (B, T, C) in float64 with the reference attention, or
    packed (N, C) documents through the varlen path (float32: the kernels' dtypes); plain,
    inside recomputed blocks, inside offloaded ones."""
    n_layer = 3
    if packed:
        batch, attention, dtype, tol = _windows(3, 15, seed=2), "flash", torch.float32, 2e-6
        assert batch["cu_seqlens"].numel() > 4  # documents were cut
    else:
        ids = torch.randint(0, 97, (3, 15), generator=torch.Generator().manual_seed(2))
        batch, attention, dtype, tol = (
            {"input_ids": ids, "labels": ids},
            "reference",
            torch.float64,
            1e-12,
        )
    results = {}
    for tile in (0, 7):
        torch.manual_seed(0)
        cfg = dict(n_layer=n_layer, recompute=recompute, tile_tokens=tile)
        model = tiny_llama(attention, dtype, **cfg)
        assert [b.tile_tokens for b in model.blocks] == [tile] * n_layer
        results[tile] = _lm_step(model, batch)
    (loss_ref, g_ref), (loss, g) = results[0], results[7]
    torch.testing.assert_close(loss, loss_ref, atol=tol, rtol=0)
    _assert_close(g, g_ref, atol=tol, rtol=tol * 10)


def test_tiled_recompute_runs_under_the_forward_autocast():
    """Under bf16 autocast the backward's per-tile recompute runs in bf16 too (the autocast
    state is restored: every matmul of the backward is bf16, none float32), and the result is
    the untiled modules' up to bf16 rounding."""
    block, _ = _block_and_context(TINY_LLAMA, (3, 15), torch.float32)
    norm, mlp = block.post_attention_layernorm, block.mlp
    weights = (norm.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    x = torch.randn(3, 15, TINY_LLAMA["d_model"])

    def plain(x):
        return x + mlp(norm(x))

    def tiled(x):
        return tiled_mlp_residual(x, *weights, eps=norm.eps, tile_tokens=7)

    results = {}
    for name, fn in (("plain", plain), ("tiled", tiled)):
        block.zero_grad()
        xg = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(xg)
        with MatmulDtypes() as seen:
            y.pow(2).sum().backward()
        assert seen.dtypes == {torch.bfloat16}, (name, seen.dtypes)
        results[name] = (y.detach(), xg.grad, *(w.grad.clone() for w in weights))
    for got, ref in zip(results["tiled"], results["plain"]):
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


class MatmulDtypes(TorchDispatchMode):
    """The dtypes of the matrices of every matrix product run while active."""

    PRODUCTS = {torch.ops.aten.mm: 0, torch.ops.aten.bmm: 0, torch.ops.aten.addmm: 1}

    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.PRODUCTS:
            self.dtypes.add(args[self.PRODUCTS[func.overloadpacket]].dtype)
        return func(*args, **(kwargs or {}))


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op returned while active."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("tile", [0, 7])
def test_no_tokens_by_d_ff_tensor_exists_when_tiled(tile):
    """A block over 45 tokens with d_ff 256 (the largest other tensors: 256 x 16 weights and
    their gradients, 2 x 15 x 15 scores per row): untiled, some op makes a 45 x 256 tensor;
    tiled, none does, in the forward or the backward."""
    tokens, d_ff = 45, WIDE["d_ff"]
    block, ctx = _block_and_context(WIDE, (3, 15), torch.float32)
    block.tile_tokens = tile
    x = torch.randn(3, 15, WIDE["d_model"], requires_grad=True)
    with LargestTensor() as meter:
        block(x, ctx).sum().backward()
    if tile:
        assert meter.numel < tokens * d_ff, meter.numel
    else:
        assert meter.numel == tokens * d_ff, meter.numel


def test_gradcheck_tiled_function():
    g = torch.Generator().manual_seed(3)

    def leaf(*shape, mean=0.0):
        return (mean + torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()

    x, norm = leaf(2, 5, 4), leaf(4, mean=1.0)
    gate, up, down = leaf(6, 4), leaf(6, 4), leaf(4, 6)
    assert torch.autograd.gradcheck(
        lambda *t: tiled_mlp_residual(*t, eps=1e-5, tile_tokens=3), (x, norm, gate, up, down)
    )
    # a generic per-token body, packed (N, C) input, another output width
    w = leaf(4, 3)
    assert torch.autograd.gradcheck(
        lambda x2, w2: TiledTokens.apply(lambda r, m: torch.tanh(r @ m), 4, x2, w2),
        (leaf(9, 4), w),
    )


def test_tile_tokens_config_errors():
    base = dict(TINY_LLAMA)
    assert model_config({**base, "tile_tokens": 8}).tile_tokens == 8
    assert model_config(base).tile_tokens == 0  # off by default
    with pytest.raises(ValueError, match="model.tile_tokens must be an int >= 0"):
        model_config({**base, "tile_tokens": -1})
    for bad in (1.5, True, "8"):  # the dataclass itself (a config mapping converts types first)
        with pytest.raises(ValueError, match="model.tile_tokens must be an int >= 0"):
            LlamaConfig(**{**base, "tile_tokens": bad})
    with pytest.raises(ValueError, match="needs model.dropout=0"):
        model_config({**base, "tile_tokens": 8, "dropout": 0.1})
    model_config({**base, "tile_tokens": 8, "attn_dropout": 0.1})  # attention's own: allowed
    model_config({**base, "dropout": 0.1})  # dropout without tiling: allowed
    x, w = torch.zeros(5, 4), torch.zeros(6, 4)
    with pytest.raises(ValueError, match="tile_tokens must be an int >= 1"):
        tiled_mlp_residual(x, torch.ones(4), w, w, w.t(), eps=1e-5, tile_tokens=0)
    with pytest.raises(ValueError, match=r"must be \(d_ff, C\)"):
        tiled_mlp_residual(x, torch.ones(4), w, w, w, eps=1e-5, tile_tokens=2)
