"""GPU-only checks of what the CPU cannot run in the longest-context features: offload's CUDA path
(side stream, pinned buffers, events, CUDA RNG replay of dropout), the tiled MLP under bf16
autocast, and the document-masked ring / Ulysses ops' host-planned tables on a CUDA device (one
rank: no process group). Run on a CUDA machine: `pytest -m gpu tests/models/test_long_context_gpu.py`
(the GPU suite's pytest section runs every gpu test)."""

from __future__ import annotations

import pytest
import torch

from flashtrain.attention import flash_attn_varlen_func, ring_attn_func, ulysses_attn_func
from flashtrain.models import build_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _loss_and_grads(model, ids):
    torch.manual_seed(7)  # the same dropout masks in both runs (and in each recompute)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.loss.detach(), grads


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_offload_on_cuda_is_bitwise_recompute_all(arch):
    """Two steps each (the second reuses the pinned buffers): offload's loss and every gradient
    bitwise those of recompute=all, GPT-2 with dropout (the CUDA RNG replayed)."""
    base = dict(n_layer=4, n_head=4, d_model=128, vocab_size=512, max_seq_len=2048)
    extra = {"dropout": 0.1} if arch == "gpt2" else {"n_kv_head": 2, "d_ff": 256}
    torch.manual_seed(0)
    model = build_model(dict(arch=arch, recompute="all", **base, **extra), "flash").cuda()
    offloaded = build_model(dict(arch=arch, recompute="offload", **base, **extra), "flash").cuda()
    offloaded.load_state_dict(model.state_dict())
    for step in range(2):
        ids = torch.randint(0, 512, (2, 2048), device="cuda")
        want, want_grads = _loss_and_grads(model, ids)
        got, got_grads = _loss_and_grads(offloaded, ids)
        assert torch.equal(got, want), step
        for a, b in zip(got_grads, want_grads):
            assert torch.equal(a, b), step
    assert offloaded.block_offload.buffers.free, "the pinned buffers came back for reuse"


def test_offload_keeps_block_inputs_off_the_device():
    """16 layers of 32K tokens x 1024, the residual stream in fp32 (fp32 weights under
    autocast): recompute=all keeps 16 block inputs (2 GiB), offload one; the peak drops by
    most of the other 15."""
    cfg = dict(arch="llama", n_layer=16, n_head=8, n_kv_head=2, d_model=1024, d_ff=2048,
               vocab_size=512, max_seq_len=32768)  # fmt: skip
    peaks = {}
    for mode in ("all", "offload"):
        torch.manual_seed(0)
        model = build_model(dict(cfg, recompute=mode), "flash").cuda()
        ids = torch.randint(0, 512, (1, 32768), device="cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        _loss_and_grads(model, ids)
        torch.cuda.synchronize()
        peaks[mode] = torch.cuda.max_memory_allocated()
        del model
        torch.cuda.empty_cache()
    inputs = 15 * 32768 * 1024 * 4  # the 15 block inputs offload moves, fp32
    assert peaks["all"] - peaks["offload"] > 0.8 * inputs, peaks


def test_tiled_mlp_under_bf16_autocast_matches_untiled():
    cfg = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=256, d_ff=704,
               vocab_size=512, max_seq_len=4096)  # fmt: skip
    torch.manual_seed(0)
    plain = build_model(cfg, "flash").cuda()
    tiled = build_model(dict(cfg, tile_tokens=1000), "flash").cuda()
    tiled.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 512, (1, 4096), device="cuda")
    want, want_grads = _loss_and_grads(plain, ids)
    got, got_grads = _loss_and_grads(tiled, ids)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("op", ["ring", "ulysses"])
def test_document_masked_ops_on_one_cuda_rank_equal_the_varlen_kernel(op):
    """The host-planned document tables reach the kernels on the device (one rank: no group)."""
    torch.manual_seed(0)
    seq, heads, kv_heads, dim = 4096, 8, 2, 128
    q = torch.randn(2, seq, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, seq, kv_heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    table = (0, 1000, 1001, 3000, 4096, 4100, 8192)  # rows never joined: 4096 a boundary
    fn = ring_attn_func if op == "ring" else ulysses_attn_func
    out = fn(q, k, v, causal=True, cu_seqlens=table)
    cu = torch.tensor(table, dtype=torch.int32, device="cuda")
    flat = [t.reshape(2 * seq, t.shape[2], dim) for t in (q, k, v)]
    want = flash_attn_varlen_func(*flat, cu, cu, 3001, 3001, causal=True).view_as(out)
    torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)
    dout = torch.randn_like(out)
    got_grads = torch.autograd.grad(out, (q, k, v), dout)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
