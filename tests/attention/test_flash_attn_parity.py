"""Code ported from flash_attn runs unchanged: flash-attn's positional order and names, its
packed forms, unpad_input's five values, return_attn_probs for checking dropout. (The bitwise
repeatability of deterministic=True: test_flash_dense.py.)"""

import importlib.util
import inspect
import math

import pytest
import torch
from attention_testing import random_qkv

import flashtrain.attention as fa
from flashtrain.attention.reference import attention_reference, expand_block_mask

OPTIONS = [
    "dropout_p",
    "softmax_scale",
    "causal",
    "window_size",
    "softcap",
    "alibi_slopes",
    "deterministic",
    "return_attn_probs",
]
# flash-attn 2.6+'s positional parameters, in order (flash_attn/flash_attn_interface.py).
SIGNATURES = {
    "flash_attn_func": ["q", "k", "v", *OPTIONS],
    "flash_attn_kvpacked_func": ["q", "kv", *OPTIONS],
    "flash_attn_qkvpacked_func": ["qkv", *OPTIONS],
    "flash_attn_varlen_func": [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", *OPTIONS
    ],
    "flash_attn_varlen_kvpacked_func": [
        "q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", *OPTIONS
    ],
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen", *OPTIONS],
}  # fmt: skip
KERNEL_KEEP_MASK = importlib.util.find_spec("flashtrain.kernels.dropout_mask") is not None


@pytest.mark.single_route
@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_positional_parameters_match_flash_attn(name):
    params = inspect.signature(getattr(fa, name)).parameters.values()
    positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == SIGNATURES[name]
    defaults = {p.name: p.default for p in params if p.name in OPTIONS}
    assert defaults == dict(
        dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
        alibi_slopes=None, deterministic=False, return_attn_probs=False,
    )  # fmt: skip


def test_positional_call_equals_keyword_call():
    torch.manual_seed(0)
    q, k, v = random_qkv(1, 21, 21, 2, 1, 16, torch.float32)
    positional = fa.flash_attn_func(q, k, v, 0.0, 0.3, True, (5, 0), 0.0, None, True)
    keyword = fa.flash_attn_func(q, k, v, causal=True, softmax_scale=0.3, window_size=(5, 0))
    assert torch.equal(positional, keyword)
    cu = torch.tensor([0, 9, 21], dtype=torch.int32)
    packed = fa.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 12, 12, 0.0, 0.3, True)
    assert torch.equal(
        packed,
        fa.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 12, 12, causal=True, softmax_scale=0.3),
    )


def _grads(fn, *tensors):
    tensors = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*tensors)
    out.backward(torch.ones_like(out))
    return out.detach(), [t.grad for t in tensors]


def test_packed_forms_equal_separate_tensors():
    torch.manual_seed(1)
    q, k, v = random_qkv(2, 11, 11, 4, 2, 8, torch.float32)
    opts = dict(causal=True, softcap=0.0)
    want, (dq, dk, dv) = _grads(lambda a, b, c: fa.flash_attn_func(a, b, c, **opts), q, k, v)
    out, (dkv,) = _grads(
        lambda kv: fa.flash_attn_kvpacked_func(q, kv, **opts), torch.stack((k, v), dim=2)
    )
    assert torch.equal(out, want) and torch.equal(dkv, torch.stack((dk, dv), dim=2))
    q_mha = q[:, :, :2]
    want, grads = _grads(lambda a, b, c: fa.flash_attn_func(a, b, c, **opts), q_mha, k, v)
    out, (dqkv,) = _grads(
        lambda qkv: fa.flash_attn_qkvpacked_func(qkv, **opts), torch.stack((q_mha, k, v), dim=2)
    )
    assert torch.equal(out, want) and torch.equal(dqkv, torch.stack(grads, dim=2))
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    x = (q_mha[0], k[0], v[0])
    want = fa.flash_attn_varlen_func(*x, cu, cu, 7, 7, **opts)
    assert torch.equal(fa.flash_attn_varlen_qkvpacked_func(torch.stack(x, 1), cu, 7, **opts), want)
    kv = torch.stack(x[1:], 1)
    assert torch.equal(fa.flash_attn_varlen_kvpacked_func(x[0], kv, cu, cu, 7, 7, **opts), want)


@pytest.mark.single_route
def test_unpad_input_returns_flash_attn_values():
    """(hidden, indices, cu_seqlens, max_seqlen, used_seqlens); unused_mask slots are packed too
    and count in cu_seqlens but not in used_seqlens; an all-padding row is an empty sequence."""
    x = torch.arange(3 * 4, dtype=torch.float32).view(3, 4, 1)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]])
    unused = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    packed, indices, cu, max_seqlen, used = fa.unpad_input(x, mask)
    assert cu.tolist() == [0, 2, 2, 5] and max_seqlen == 3 and used.tolist() == [2, 0, 3]
    assert indices.tolist() == [0, 1, 8, 9, 10] and packed.flatten().tolist() == [0, 1, 8, 9, 10]
    packed, indices, cu, max_seqlen, used = fa.unpad_input(x, mask, unused)
    assert cu.tolist() == [0, 3, 3, 6] and used.tolist() == [2, 0, 3]
    assert indices.tolist() == [0, 1, 2, 8, 9, 10]
    assert torch.equal(fa.pad_input(packed, indices, 3, 4), x * (mask + unused)[..., None])


def _dropped_fraction(s_dmask, allowed):
    return torch.signbit(s_dmask)[allowed].float().mean().item()


@pytest.mark.parametrize("causal", [False, True])
def test_attn_probs_without_dropout_are_the_probabilities(causal):
    torch.manual_seed(2)
    q, k, v = random_qkv(2, 23, 17, 4, 2, 8, torch.float32)
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 23, 17) and s_dmask.dtype == torch.float32
    scale = 1 / math.sqrt(8)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(2, 2))
    if causal:
        scores = scores.masked_fill(torch.ones(23, 17).tril(17 - 23) == 0, float("-inf"))
    want = torch.softmax(scores * scale, -1).nan_to_num(0.0)  # rows with no key: 0
    torch.testing.assert_close(s_dmask.double(), want, atol=1e-6, rtol=1e-5)
    assert not torch.signbit(s_dmask).any()


def _skip_without_kernel_keep_mask(route):
    if route == "triton" and not KERNEL_KEEP_MASK:
        pytest.skip("this build's kernels have no flashtrain.kernels.dropout_mask yet")


def _check_dropout_probs(out, s_dmask, v, dropout_p, allowed):
    """out is exactly the kept probabilities, rescaled, times V; the dropped rate is p."""
    kept = torch.where(torch.signbit(s_dmask), 0.0, s_dmask.abs()) / (1 - dropout_p)
    heads_q = s_dmask.shape[1]
    v = v.repeat_interleave(heads_q // v.shape[2], dim=2)
    torch.testing.assert_close(out, torch.einsum("bhqk,bkhd->bqhd", kept, v), atol=1e-5, rtol=1e-5)
    n = int(allowed.sum())
    sigma = math.sqrt(dropout_p * (1 - dropout_p) / n)
    assert abs(_dropped_fraction(s_dmask, allowed) - dropout_p) < 5 * sigma


def test_attn_probs_carry_the_dropout_that_ran(route):
    _skip_without_kernel_keep_mask(route)
    torch.manual_seed(3)
    q, k, v = random_qkv(2, 40, 33, 4, 2, 16, torch.float32)
    torch.manual_seed(11)
    out, _, s_dmask = fa.flash_attn_func(q, k, v, 0.3, None, True, return_attn_probs=True)
    allowed = torch.ones(40, 33, dtype=torch.bool).tril(33 - 40).expand_as(s_dmask)
    _check_dropout_probs(out, s_dmask, v, 0.3, allowed)
    torch.manual_seed(11)
    again = fa.flash_attn_func(q, k, v, 0.3, None, True, return_attn_probs=True)[2]
    assert torch.equal(torch.signbit(again), torch.signbit(s_dmask))  # manual_seed replays it
    assert torch.equal(s_dmask[~allowed], torch.zeros_like(s_dmask[~allowed]))


def test_attn_probs_varlen_layout(route):
    """(B, H, max_seqlen_q, max_seqlen_k), sequence i in the top-left corner of entry i."""
    _skip_without_kernel_keep_mask(route)
    torch.manual_seed(4)
    lens = [9, 0, 14]
    cu = torch.tensor([0, 9, 9, 23], dtype=torch.int32)
    q, k, v = (torch.randn(23, 2, 16) for _ in range(3))
    out, lse, s_dmask = fa.flash_attn_varlen_func(
        q, k, v, cu, cu, 14, 14, 0.4, return_attn_probs=True
    )
    assert s_dmask.shape == (3, 2, 14, 14) and lse.shape == (2, 23)
    allowed = torch.zeros(3, 2, 14, 14, dtype=torch.bool)
    for i, n in enumerate(lens):
        allowed[i, :, :n, :n] = True
        rows, corner = slice(int(cu[i]), int(cu[i + 1])), s_dmask[i : i + 1, :, :n, :n]
        if n:
            _check_dropout_probs(
                out[None, rows],
                corner,
                v[None, rows],
                0.4,
                torch.ones_like(corner, dtype=torch.bool),
            )
    assert torch.equal(s_dmask[~allowed], torch.zeros_like(s_dmask[~allowed]))


def test_attn_probs_blocksparse(route):
    torch.manual_seed(5)
    q, k, v = random_qkv(1, 100, 100, 2, 2, 16, torch.float32)
    mask = torch.tensor([[[True, False], [True, True]]])
    out, _, s_dmask = fa.blocksparse_attn_func(q, k, v, mask, block_size=64, return_attn_probs=True)
    want, _ = attention_reference(q, k, v, element_mask=expand_block_mask(mask, 64, 100, 100))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    allowed = expand_block_mask(mask, 64, 100, 100)[None].expand_as(s_dmask)
    assert torch.equal(s_dmask[~allowed], torch.zeros_like(s_dmask[~allowed]))
    torch.testing.assert_close(s_dmask.sum(-1), torch.ones(1, 2, 100))
