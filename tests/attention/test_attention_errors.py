"""Bad input to the attention functions: a ValueError that names what is wrong and what is allowed."""

import pytest
import torch

from flashtrain.attention import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_qkvpacked_func,
)


def qkv(b=1, sq=8, sk=8, hq=2, hkv=2, d=16, dtype=torch.float16):
    return (
        torch.randn(b, sq, hq, d, dtype=dtype),
        torch.randn(b, sk, hkv, d, dtype=dtype),
        torch.randn(b, sk, hkv, d, dtype=dtype),
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (torch.randn(8, 2, 16), *qkv()[1:]), "must have 4 dims"),
        (lambda: (qkv(b=2)[0], *qkv(b=1)[1:]), "batch of q"),
        (lambda: (qkv(hq=3)[0], *qkv(hkv=2)[1:]), "multiple of heads_kv"),
        (lambda: (qkv(d=32)[0], *qkv(d=16)[1:]), "head_dim of q"),
        (lambda: qkv(d=264), "between 1 and 256"),
        (lambda: qkv(d=0), "between 1 and 256"),
        (lambda: (qkv()[0], qkv()[1], qkv(sk=9)[2]), "k and v must have the same shape"),
        (lambda: (qkv()[0].float(), *qkv()[1:]), "share one dtype"),
        (lambda: qkv(dtype=torch.float64), "allowed: float16, bfloat16, float32"),
        (lambda: [t.to(torch.int32) for t in qkv()], "allowed: float16, bfloat16, float32"),
    ],
)
def test_bad_tensors(make, message):
    with pytest.raises(ValueError, match=message):
        flash_attn_func(*make())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
        (dict(dropout_p=-0.1), r"dropout_p must be in \[0, 1\)"),
        (dict(window_size=(-2, 4)), "-1 for unbounded"),
        (dict(window_size=(3,)), "pair"),
        (dict(softmax_scale=0.0), "softmax_scale must be a positive"),
        (dict(softcap=-1.0), r"softcap must be a finite number >= 0"),
        (dict(softcap=float("inf")), r"softcap must be a finite number >= 0"),
        (dict(alibi_slopes=torch.ones(2, dtype=torch.float16)), r"float32 tensor of shape \(2,\)"),
        (dict(alibi_slopes=torch.ones(3)), r"got shape \(3,\)"),
        (dict(alibi_slopes=torch.ones(2, 2)), r"\(1, 2\).*got shape \(2, 2\)"),
        (dict(alibi_slopes=[0.5, 0.25]), "got list"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        flash_attn_func(*qkv(), **kwargs)


def test_attn_probs_refused_at_large_sizes():
    q, k, v = (torch.empty(1, 4097, 1, 8, dtype=torch.float16) for _ in range(3))
    with pytest.raises(ValueError, match=r"return_attn_probs=True materialises .* allowed up to"):
        flash_attn_func(q, k, v, return_attn_probs=True)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: flash_attn_qkvpacked_func(torch.randn(1, 8, 2, 2, 16)), r"qkv must have shape"),
        (lambda: flash_attn_kvpacked_func(*qkv()[:2]), r"kv must have shape .* 2 at dim -3"),
        (lambda: flash_attn_varlen_qkvpacked_func(torch.randn(8, 3, 2, 16, 1), None, 8), "qkv"),
    ],
)
def test_bad_packed_tensors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_mismatched_devices():
    q, k, v = qkv()
    meta_v = torch.empty_like(v, device="meta")
    with pytest.raises(ValueError, match="one device"):
        flash_attn_func(q, k, meta_v)
    with pytest.raises(ValueError, match="alibi_slopes is on meta but q is on cpu"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(2, device="meta"))


def _packed(total_q=10, total_k=10):
    return torch.randn(total_q, 2, 16), torch.randn(total_k, 2, 16), torch.randn(total_k, 2, 16)


@pytest.mark.parametrize(
    "cu_q, cu_k, max_q, max_k, message",
    [
        ([0, 4, 10], [0, 4, 10], 6, 6, None),
        ([0, 6, 4, 10], [0, 4, 6, 10], 6, 6, "non-decreasing"),
        ([0, 4, 9], [0, 4, 10], 6, 6, r"must equal the packed length 10"),
        ([1, 4, 10], [0, 4, 10], 6, 6, r"\[0\] must be 0"),
        ([0, 4, 10], [0, 4, 10], 5, 6, "max_seqlen_q=5 is smaller than the longest sequence"),
        ([0, 4, 10], [0, 10], 6, 10, "one per sequence"),
    ],
)
def test_bad_cu_seqlens(cu_q, cu_k, max_q, max_k, message):
    q, k, v = _packed()
    cu_q, cu_k = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    if message is None:  # the valid case runs
        assert flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k).shape == q.shape
        return
    with pytest.raises(ValueError, match=message):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)


def test_cu_seqlens_must_be_int32():
    q, k, v = _packed()
    cu = torch.tensor([0, 4, 10])  # int64
    with pytest.raises(ValueError, match="1-D int32 tensor"):
        flash_attn_varlen_func(q, k, v, cu, cu, 6, 6)


def test_unknown_cpu_route(monkeypatch):
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "cuda-please")
    with pytest.raises(ValueError, match="allowed: auto, triton, torch"):
        flash_attn_func(*qkv())


@pytest.mark.single_route
def test_cu_seqlens_values_are_read_on_cpu_or_on_request(monkeypatch):
    """Reading cu_seqlens on a GPU costs a host sync per call: only with FLASHTRAIN_CHECK_INPUTS=1."""
    from flashtrain.attention.validation import values_checked

    monkeypatch.delenv("FLASHTRAIN_CHECK_INPUTS", raising=False)
    assert values_checked(torch.device("cpu")) and not values_checked(torch.device("cuda"))
    monkeypatch.setenv("FLASHTRAIN_CHECK_INPUTS", "1")
    assert values_checked(torch.device("cuda"))
