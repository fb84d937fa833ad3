"""Host-side count of the key tiles the forward kernel streams, for cost accounting on machines
without a GPU (a 64K-token launch is far too slow for the interpreter). The arithmetic mirrors
flashtrain.kernels.band.key_block_range; tests check it against the kernel's own COUNT_VISITS output."""

from flashtrain.kernels.common import UNBOUNDED


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def key_tiles_for_query_tile(m0, seqlen_q, seqlen_k, left, right, block_m, block_n) -> int:
    diag = seqlen_k - seqlen_q
    lo = max(m0 + diag - left, 0) // block_n * block_n
    hi = max(min(seqlen_k, m0 + block_m + diag + right), lo)
    full_lo = _cdiv(max(m0 + block_m - 1 + diag - left, 0), block_n) * block_n
    full_hi = min(max(m0 + diag + right + 1, 0) // block_n * block_n, seqlen_k // block_n * block_n)
    full_lo = min(max(full_lo, lo), hi)
    full_hi = min(max(full_hi, full_lo), hi)
    return (
        _cdiv(full_lo - lo, block_n) + (full_hi - full_lo) // block_n + _cdiv(hi - full_hi, block_n)
    )


def key_blocks_visited(
    seqlen_q, seqlen_k, *, window_left=-1, window_right=-1, causal=False, block_m=128, block_n=64
) -> int:
    """Key tiles streamed by all query tiles of one (batch, head); -1 = unbounded side."""
    left = UNBOUNDED if window_left < 0 else window_left
    right = UNBOUNDED if window_right < 0 else window_right
    if causal:
        right = min(right, 0)
    return sum(
        key_tiles_for_query_tile(m0, seqlen_q, seqlen_k, left, right, block_m, block_n)
        for m0 in range(0, seqlen_q, block_m)
    )
