"""Where flash_attn_with_kvcache's rotary puts each token, and which cache_seqlens it takes.

flash-attn's semantics (FA2 csrc flash_fwd_kernel.h: the cos/sin row of a new key or query is
seqlen_k_cache + leftpad_k, where BlockInfo's seqlen_k_cache = cache_seqlens - leftpad_k; FA3's
rotary_seqlens defaults to cache_seqlens): new key i of entry b is stored at slot
cache_seqlens[b] + i and rotated at that same absolute position, cache_leftpad or not; query row
i at cache_seqlens[b] + i (causal or windowed) or cache_seqlens[b] (otherwise). The reference
below is written from that rule alone, in float64. Before the fix the rotation counted from
cache_leftpad (positions off by the padding), the table-length check counted query rows a
non-causal call never rotates, and cache_seqlens=2**40 overflowed inside torch.full."""

import math

import pytest
import torch

from flashtrain.attention import flash_attn_with_kvcache


def _rotate(x, angles, positions):
    """x (S, H, D) float64 rotated GPT-NeoX style (halves) at positions (S,) of angles (L, D/2)."""
    half = angles.shape[1]
    theta = angles.double()[positions][:, None, :]  # (S, 1, D/2)
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat((x1 * theta.cos() - x2 * theta.sin(), x2 * theta.cos() + x1 * theta.sin()), -1)


def _attend(q, keys, values, causal):
    """float64 softmax attention of q (Sq, H, D) on keys, values (L, H, D), bottom-right causal."""
    scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(q.shape[0])[:, None] + keys.shape[0] - q.shape[0]
        scores = scores.masked_fill(torch.arange(keys.shape[0])[None, :] > i, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


@pytest.mark.parametrize("causal", [True, False])
def test_leftpad_rotary_rotates_at_the_absolute_cache_slot(route, causal):
    torch.manual_seed(11)
    sq = snew = 2
    lens, pad = [5, 3], [3, 0]
    q, k_new, v_new = (torch.randn(2, sq, 2, 8) for _ in range(3))
    kc, vc = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    cache0 = kc.clone()
    angles = torch.rand(10, 4) * 2 * math.pi
    out = flash_attn_with_kvcache(
        q, kc, vc, k_new, v_new, rotary_cos=angles.cos(), rotary_sin=angles.sin(),
        cache_seqlens=torch.tensor(lens, dtype=torch.int32), rotary_interleaved=False,
        cache_leftpad=torch.tensor(pad, dtype=torch.int32), causal=causal,
    )  # fmt: skip
    for b, (n, p) in enumerate(zip(lens, pad)):
        slots = torch.arange(n, n + snew)
        k_rot = _rotate(k_new[b], angles, slots)
        torch.testing.assert_close(kc[b, n : n + snew].double(), k_rot, atol=1e-6, rtol=0)
        q_at = slots if causal else torch.full((sq,), n)
        q_rot = _rotate(q[b], angles, q_at)
        keys = torch.cat((cache0[b, p:n].double(), k_rot))  # slots p .. n + snew - 1
        ref = _attend(q_rot, keys, vc[b, p : n + snew].double(), causal)
        torch.testing.assert_close(out[b].double(), ref, atol=2e-5, rtol=0)


def _rotary_call(table_len, lens, *, causal, seqlen_q=4, seqlen_new=2):
    q, k, v = torch.randn(1, seqlen_q, 1, 8), torch.randn(1, seqlen_new, 1, 8), torch.randn(1, seqlen_new, 1, 8)  # fmt: skip
    kc, vc = torch.zeros(1, 8, 1, 8), torch.zeros(1, 8, 1, 8)
    angles = torch.rand(table_len, 4)
    return flash_attn_with_kvcache(
        q, kc, vc, k, v, rotary_cos=angles.cos(), rotary_sin=angles.sin(), causal=causal,
        cache_seqlens=torch.tensor([lens], dtype=torch.int32),
    )  # fmt: skip


@pytest.mark.single_route
def test_rotary_table_bound_is_the_largest_position_used():
    """Cache of 8, 2 new keys at slots 6, 7. Non-causal: 4 queries all at 6, so a table of 8
    (the cache's length) fits and one of 7 does not. Causal, cache_seqlens 4: queries at 4..7,
    fits 8; cache_seqlens 5: queries at 5..8, one past it."""
    assert _rotary_call(8, 6, causal=False).shape == (1, 4, 1, 8)
    with pytest.raises(ValueError, match="rotary_cos has 7 positions but this call rotates up to position 7"):  # fmt: skip
        _rotary_call(7, 6, causal=False)
    assert _rotary_call(8, 4, causal=True).shape == (1, 4, 1, 8)
    with pytest.raises(ValueError, match="rotary_cos has 8 positions but this call rotates up to position 8"):  # fmt: skip
        _rotary_call(8, 5, causal=True)


@pytest.mark.single_route
@pytest.mark.parametrize(
    "cache_seqlens", [2**40, 2**31, 9, -1, 8], ids=["2^40", "2^31", "past", "negative", "full+new"]
)
def test_out_of_range_int_cache_seqlens_is_one_value_error(cache_seqlens):
    q, k = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    kc, vc = torch.zeros(2, 8, 2, 8), torch.zeros(2, 8, 2, 8)
    with pytest.raises(ValueError) as refused:
        flash_attn_with_kvcache(q, kc, vc, k, k, cache_seqlens=cache_seqlens)
    message = str(refused.value)
    assert f"cache_seqlens={cache_seqlens}" in message and "[0, 7]" in message, message
    assert not kc.any()


@pytest.mark.single_route
def test_int32_cache_seqlens_near_2_31_is_refused_not_wrapped():
    """2^31 - 1 + seqlen_new wraps in int32 arithmetic: the range check is done in int64."""
    q, k = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    kc, vc = torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 2, 8)
    lens = torch.tensor([2**31 - 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cache_seqlens \+ seqlen_new must lie in \[0, 8\]"):
        flash_attn_with_kvcache(q, kc, vc, k, k, cache_seqlens=lens)
