"""The causal/window band: which keys a query row may see, and which tiles a loop must visit.

Query row i (0-based within its sequence) sits at key position i + diag, diag = seqlen_k -
seqlen_q (bottom-right alignment). It may attend key j when
    i + diag - left <= j <= i + diag + right   and   j < seqlen_k,
with causal folded in on the host as right = min(right, 0); an unbounded side is UNBOUNDED.
`band` is the tuple (diag, left, right).
"""

import triton
import triton.language as tl


@triton.jit
def allowed(rows, cols, seqlen_k, band):
    """Bool tile, True where query `rows` may attend key `cols` (both already broadcast)."""
    diag, left, right = band
    pos = rows + diag
    return (cols < seqlen_k) & (cols <= pos + right) & (cols >= pos - left)


@triton.jit
def finite_keys(x):
    """For a tile of values x (BLOCK_N, BLOCK_D): x with its NaN/inf entries zeroed, so that a
    row's p = 0 on a key it cannot see gives 0 and not 0 * NaN, and the bool (BLOCK_N,) of the
    keys that had one. The caller writes NaN into the scores of the rows that see such a key,
    so those rows (and only those) become NaN through the softmax: no (BLOCK_M, BLOCK_N) mask
    stays live past the scores."""
    finite = tl.abs(x.to(tl.float32)) < float("inf")  # False for NaN and +-inf
    key_bad = tl.max(tl.where(finite, 0, 1), 1) > 0  # (BLOCK_N,)
    return tl.where(finite, x, 0.0).to(x.dtype), key_bad


@triton.jit
def key_block_range(m0, seqlen_k, band, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key range a query tile [m0, m0 + BLOCK_M) must visit, split for masking.

    Returns (lo, full_lo, full_hi, hi): blocks in [full_lo, full_hi) are allowed everywhere and
    need no element mask; [lo, full_lo) and [full_hi, hi) need it. lo, full_lo, full_hi are
    multiples of BLOCK_N; hi is an element bound. Blocks wholly outside the band are never visited.
    """
    diag, left, right = band
    lo = tl.maximum(m0 + diag - left, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(seqlen_k, m0 + BLOCK_M + diag + right)
    hi = tl.maximum(hi, lo)
    first_full = tl.maximum(m0 + BLOCK_M - 1 + diag - left, 0)
    full_lo = (first_full + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    full_hi = tl.maximum(m0 + diag + right + 1, 0) // BLOCK_N * BLOCK_N
    full_hi = tl.minimum(full_hi, seqlen_k // BLOCK_N * BLOCK_N)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_block_range(n0, seqlen_q, seqlen_k, band, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query range that sees any key of the tile [n0, n0 + BLOCK_N), split like key_block_range.

    Full query blocks also lie wholly inside seqlen_q and need a key tile wholly inside seqlen_k.
    """
    diag, left, right = band
    lo = tl.maximum(n0 - diag - right, 0) // BLOCK_M * BLOCK_M
    hi = tl.minimum(seqlen_q, n0 + BLOCK_N - diag + left)
    hi = tl.maximum(hi, lo)
    first_full = tl.maximum(n0 + BLOCK_N - 1 - diag - right, 0)
    full_lo = (first_full + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    full_hi = tl.maximum(n0 - diag + left + 1, 0) // BLOCK_M * BLOCK_M
    full_hi = tl.minimum(full_hi, seqlen_q // BLOCK_M * BLOCK_M)
    if n0 + BLOCK_N > seqlen_k:
        full_hi = 0
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi
