"""Sliding-window (local) attention against the float64 reference, with and without causal."""

import pytest
import torch
from attention_testing import (
    assert_matches_reference,
    forward_backward,
    random_qkv,
    reference_results,
)

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func


@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, window, causal",
    [
        (97, 97, (16, 16), False),
        (97, 97, (8, -1), True),
        (64, 100, (0, 0), False),  # each query sees exactly its diagonal key
        (100, 64, (20, 5), False),  # rows near the top see nothing
        (81, 81, (-1, 3), False),
        (81, 81, (40, 10), True),  # causal wins over the right side
    ],
)
def test_window_matches_reference(route, seqlen_q, seqlen_k, window, causal):
    torch.manual_seed(seqlen_q * 7 + window[0])
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, 2, 1, 32, torch.float32)
    dout = torch.randn_like(q)
    got = forward_backward(
        lambda a, b, c: flash_attn_func(
            a, b, c, causal=causal, window_size=window, return_lse=True
        ),
        q,
        k,
        v,
        dout,
    )
    truth, low = reference_results(q, k, v, dout, causal=causal, window_size=window)
    assert_matches_reference(got, truth, low, torch.float32)


@pytest.mark.single_route
def test_key_blocks_outside_the_band_are_skipped():
    """The launch visits only blocks that intersect the band: count them with the same range
    arithmetic the kernel uses, and check cost grows linearly in seqlen for a fixed window."""
    from flashtrain.kernels.visit_counts import key_blocks_visited

    dense = [key_blocks_visited(s, s) for s in (4096, 8192)]
    local = [key_blocks_visited(s, s, window_left=256, causal=True) for s in (4096, 8192)]
    assert dense[1] == 4 * dense[0]  # quadratic
    assert local[1] == pytest.approx(2 * local[0], rel=0.05)  # linear


@pytest.mark.single_route
@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, window, causal",
    [
        (97, 97, (-1, -1), False),
        (97, 97, (-1, -1), True),
        (130, 70, (9, 2), False),
        (70, 130, (20, -1), True),
    ],
)
def test_visit_count_mirror_matches_the_kernel(seqlen_q, seqlen_k, window, causal):
    """The kernel's own count of streamed key tiles equals the host-side mirror."""
    from flashtrain.kernels.common import UNBOUNDED
    from flashtrain.kernels.flash_fwd import flash_forward
    from flashtrain.kernels.tuning import forward_config
    from flashtrain.kernels.visit_counts import key_blocks_visited

    q, k, v = random_qkv(1, seqlen_q, seqlen_k, 1, 1, 16, torch.float32)
    cfg = forward_config(16, torch.float32, q.device)
    tiles_m = -(-seqlen_q // cfg.block_m)
    visits = torch.zeros(tiles_m, dtype=torch.int32)
    left = UNBOUNDED if window[0] < 0 else window[0]
    right = UNBOUNDED if window[1] < 0 else window[1]
    if causal:
        right = min(right, 0)
    flash_forward(
        q,
        k,
        v,
        torch.empty_like(q),
        torch.empty(1, 1, seqlen_q),
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=seqlen_q,
        max_seqlen_k=seqlen_k,
        softmax_scale=0.25,
        window_left=left,
        window_right=right,
        dropout_p=0.0,
        seed=0,
        visits=visits,
    )
    expected = key_blocks_visited(
        seqlen_q,
        seqlen_k,
        window_left=window[0],
        window_right=window[1],
        causal=causal,
        block_m=cfg.block_m,
        block_n=cfg.block_n,
    )
    assert int(visits.sum()) == expected
    full = -(-seqlen_k // cfg.block_n) * tiles_m
    assert expected <= full


@pytest.mark.parametrize(
    "window, unbounded, causal",
    [
        ((-1, 2**31 - 1), (-1, -1), False),
        ((2**31 - 1, 2**40), (-1, -1), True),
        ((9, 9), (-1, -1), False),  # a side equal to seqlen_k
        ((12, 3), (-1, 3), True),
        ((2, 2**31 - 1), (2, -1), False),
    ],
)
def test_sides_of_at_least_seqlen_k_are_unbounded(window, unbounded, causal):
    """As in flash-attn. seqlen_q > 2 * seqlen_k: a finite right side >= seqlen_k taken literally
    would still hide keys from the first rows, so this checks the rule, not only no overflow."""
    torch.manual_seed(8)
    q, k, v = random_qkv(1, 40, 9, 2, 1, 16, torch.float32)
    got = flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    want = flash_attn_func(q, k, v, causal=causal, window_size=unbounded, return_lse=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if not causal and unbounded == (-1, -1):
        assert torch.isfinite(got[1]).all()  # every row sees every key
    cu_q, cu_k = (torch.tensor([0, n], dtype=torch.int32) for n in (40, 9))
    packed = flash_attn_varlen_func(
        q[0], k[0], v[0], cu_q, cu_k, 40, 9, causal=causal, window_size=window
    )
    assert torch.equal(packed, want[0][0])
