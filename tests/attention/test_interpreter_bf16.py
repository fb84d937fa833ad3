"""bfloat16 CPU tensors under TRITON_INTERPRET=1: the interpreter's tl.dot on bf16 operands is
wrong (off by ~8e8, no warning; upstream), so no attention op computes there. The default route
takes the PyTorch path and matches float64; a forced Triton route (FLASHTRAIN_CPU_ATTENTION=triton)
is refused in one line before anything is written. Before the fix each call returned garbage."""

import os

import pytest
import torch
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)

from flashtrain.attention import (
    blocksparse_attn_func,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)
from flashtrain.attention.reference import attention_reference, expand_block_mask
from flashtrain.attention.route import route_for

pytestmark = [
    pytest.mark.single_route,  # each test picks its route
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET", "0") != "1", reason="the rule is the interpreter's"
    ),
]
BF16 = torch.bfloat16


def test_route_takes_bf16_to_the_pytorch_path_and_keeps_the_others(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "auto")
    assert route_for(torch.empty(0, dtype=BF16)) == "torch"
    assert route_for(torch.empty(0, dtype=torch.float16)) == "triton"
    assert route_for(torch.empty(0)) == "triton"


def test_dense_forward_and_backward_match_float64(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "auto")
    torch.manual_seed(0)
    q, k, v = random_qkv(1, 9, 9, 2, 1, 16, BF16)
    dout = torch.randn_like(q)
    truth, low = reference_results(q, k, v, dout, causal=True)
    attend = lambda a, b, c: flash_attn_func(a, b, c, causal=True, return_lse=True)  # noqa: E731
    got = forward_backward(attend, q, k, v, dout)
    assert got[0].dtype == BF16
    assert_matches_reference(got, truth, low, BF16)


def test_varlen_and_block_sparse_forwards_match_float64(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "auto")
    torch.manual_seed(1)
    q, k, v = random_qkv(1, 8, 8, 2, 2, 16, BF16)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 5, 5, causal=True)
    for start, end in ((0, 3), (3, 8)):
        seq = [t[:, start:end].double() for t in (q, k, v)]
        ref, _ = attention_reference(*seq, causal=True)
        torch.testing.assert_close(out[start:end].double(), ref[0], atol=2e-2, rtol=0)
    q, k, v = random_qkv(1, 80, 80, 1, 1, 8, BF16)  # 2 x 2 blocks of 64, the last partial
    mask = torch.tensor([[[True, False], [True, True]]])
    out = blocksparse_attn_func(q, k, v, mask, block_size=64)
    keep = expand_block_mask(mask, 64, 80, 80)  # (1, 80, 80)
    ref, _ = attention_reference(q.double(), k.double(), v.double(), element_mask=keep)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=0)


def test_kvcache_append_and_decode_match_float64(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "auto")
    torch.manual_seed(2)
    q, k_new, v_new = random_qkv(2, 1, 1, 2, 1, 16, BF16)
    kc, vc = torch.randn(2, 7, 1, 16, dtype=BF16), torch.randn(2, 7, 1, 16, dtype=BF16)
    lens = torch.tensor([3, 6], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=True)
    for b, n in enumerate((4, 7)):
        keys, values = kc[b : b + 1, :n].double(), vc[b : b + 1, :n].double()
        ref, _ = attention_reference(q[b : b + 1].double(), keys, values, causal=True)
        torch.testing.assert_close(out[b : b + 1].double(), ref, atol=2e-2, rtol=0)


def test_a_forced_triton_route_refuses_bf16_in_one_line(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "triton")
    q, k, v = random_qkv(1, 4, 4, 1, 1, 8, BF16)
    with pytest.raises(ValueError, match="bfloat16.*FLASHTRAIN_CPU_ATTENTION") as refused:
        flash_attn_func(q, k, v)
    assert "\n" not in str(refused.value)
    kc, vc = torch.zeros(1, 6, 1, 8, dtype=BF16), torch.zeros(1, 6, 1, 8, dtype=BF16)
    with pytest.raises(ValueError, match="bfloat16.*FLASHTRAIN_CPU_ATTENTION"):
        flash_attn_with_kvcache(q[:, :1], kc, vc, k[:, :1], v[:, :1], cache_seqlens=2)
    assert not kc.any() and not vc.any()  # refused before the append
    assert flash_attn_func(*(t.float() for t in (q, k, v))).dtype == torch.float32  # fp32 runs
