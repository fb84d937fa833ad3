"""Device helpers shared by the forward and backward kernels.

Masking convention: query row i (0-based within its sequence) sits at key position
i + diag, diag = seqlen_k - seqlen_q (bottom-right alignment). It may attend key j when
    i + diag - left <= j <= i + diag + right   and   j < seqlen_k,
with causal folded in on the host as right = min(right, 0); an unbounded side is UNBOUNDED.
"""

import torch
import triton
import triton.language as tl

# Stands for "no limit" on a window side: large enough that no index reaches it, small enough
# that i + diag + UNBOUNDED stays inside int32.
UNBOUNDED = 1 << 30


@triton.jit
def sequence_bounds(CU_SEQLENS, b, fixed_len, IS_VARLEN: tl.constexpr):
    """(start, length) of sequence b: from cu_seqlens when packed, else (0, fixed_len)."""
    if IS_VARLEN:
        start = tl.load(CU_SEQLENS + b)
        length = tl.load(CU_SEQLENS + b + 1) - start
    else:
        start = 0
        length = fixed_len
    return start, length


@triton.jit
def allowed(rows, cols, seqlen_k, diag, window_left, window_right):
    """Bool tile, True where query `rows` may attend key `cols` (both already broadcast)."""
    pos = rows + diag
    return (cols < seqlen_k) & (cols <= pos + window_right) & (cols >= pos - window_left)


@triton.jit
def dropout_keep(seed, rows, cols, seqlen_k, dropout_p):
    """Bool tile of kept probabilities: Philox keyed on (seed, row * seqlen_k + col).

    The counter wraps modulo 2**32, which stays unique for seqlen_q * seqlen_k <= 2**32.
    """
    offsets = rows * seqlen_k + cols
    return tl.rand(seed, offsets) >= dropout_p


@triton.jit
def key_block_range(
    m0, seqlen_k, diag, window_left, window_right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Key range a query tile [m0, m0 + BLOCK_M) must visit, split for masking.

    Returns (lo, full_lo, full_hi, hi): blocks in [full_lo, full_hi) are allowed everywhere and
    need no element mask; [lo, full_lo) and [full_hi, hi) need it. lo, full_lo, full_hi are
    multiples of BLOCK_N; hi is an element bound. Blocks wholly outside the band are never visited.
    """
    lo = tl.maximum(m0 + diag - window_left, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(seqlen_k, m0 + BLOCK_M + diag + window_right)
    hi = tl.maximum(hi, lo)
    first_full = tl.maximum(m0 + BLOCK_M - 1 + diag - window_left, 0)
    full_lo = (first_full + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    full_hi = tl.maximum(m0 + diag + window_right + 1, 0) // BLOCK_N * BLOCK_N
    full_hi = tl.minimum(full_hi, seqlen_k // BLOCK_N * BLOCK_N)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_block_range(
    n0,
    seqlen_q,
    seqlen_k,
    diag,
    window_left,
    window_right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Query range that sees any key of the tile [n0, n0 + BLOCK_N), split like key_block_range.

    Full query blocks also lie wholly inside seqlen_q and need a key tile wholly inside seqlen_k.
    """
    lo = tl.maximum(n0 - diag - window_right, 0) // BLOCK_M * BLOCK_M
    hi = tl.minimum(seqlen_q, n0 + BLOCK_N - diag + window_left)
    hi = tl.maximum(hi, lo)
    first_full = tl.maximum(n0 + BLOCK_N - 1 - diag - window_right, 0)
    full_lo = (first_full + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    full_hi = tl.maximum(n0 - diag + window_left + 1, 0) // BLOCK_M * BLOCK_M
    full_hi = tl.minimum(full_hi, seqlen_q // BLOCK_M * BLOCK_M)
    if n0 + BLOCK_N > seqlen_k:
        full_hi = 0
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


def seq_strides(t4: torch.Tensor, is_varlen: bool) -> tuple[int, int, int]:
    """(batch, seq, head) strides of a (B, S, H, D) view; packed tensors have no batch stride
    (a sequence is found by its cu_seqlens offset along the seq axis)."""
    return (0 if is_varlen else t4.stride(0)), t4.stride(1), t4.stride(2)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products (no silent TF32); fp16/bf16 use the tensor cores."""
    return "ieee" if dtype == torch.float32 else "tf32"
