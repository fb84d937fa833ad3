"""Attention scores of a tile, with flash-attn's optional soft-capping and ALiBi bias.

    s = q.k * scale
    s = softcap * tanh(s / softcap)                  if SOFTCAP
    s = s - slope[b, h] * |i + Sk - Sq - j|          if ALIBI (i, j positions within the sequence)
then the causal/window/block masks and the softmax. The kernels work in base 2, so a tile's
scores are s * log2(e); `scores` is the tuple
    (scale_log2, softcap_scale, softcap_log2, alibi_log2)
    = (scale * log2(e), scale / softcap, softcap * log2(e), -slope[b, h] * log2(e)).
Without either feature a loop does not call tile_scores: it keeps q.k and folds scale_log2
into its next multiply-add (one FMA per element, the code before the features existed);
`pending_scale` is the factor it owes. The backward needs d(capped)/d(q.k * scale) =
1 - tanh^2, so tile_scores also returns the tanh.
"""

import triton
import triton.language as tl

from flashtrain.kernels.common import LOG2E


@triton.jit
def tanh(x):
    """tanh through exp2, which both the interpreter and every GPU have: 1 - 2 / (e^2x + 1).
    Exact at +-inf (1 and -1); absolute error ~1e-7 near 0, below the scores' own rounding."""
    return 1.0 - 2.0 / (tl.math.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def program_scores(scale_log2, softcap_scale, softcap_log2, ALIBI_SLOPES, b, h,
                   stride_ab, stride_ah, ALIBI: tl.constexpr):
    """The `scores` tuple of query head h of batch b (the ALiBi slope is read once per program)."""
    if ALIBI:
        alibi_log2 = -tl.load(ALIBI_SLOPES + b * stride_ab + h * stride_ah) * LOG2E
    else:
        alibi_log2 = 0.0
    return scale_log2, softcap_scale, softcap_log2, alibi_log2


@triton.jit
def pending_scale(scores, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """The factor a loop multiplies its scores by: scale_log2 for plain q.k (fused into its
    FMA), 1 for tile_scores' complete ones."""
    if SOFTCAP or ALIBI:
        factor = 1.0
    else:
        factor = scores[0]
    return factor


@triton.jit
def tile_scores(qk, q_pos, k_pos, diag, scores, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """Complete base-2 scores of a tile from qk = q.k (fp32), for SOFTCAP or ALIBI calls; q_pos
    and k_pos are the broadcast positions of the tile's queries and keys within their sequence.

    Returns (scores, t) with t = tanh(q.k * scale / softcap) when SOFTCAP (else qk, unused)."""
    scale_log2, softcap_scale, softcap_log2, alibi_log2 = scores
    if SOFTCAP:
        t = tanh(qk * softcap_scale)
        s = t * softcap_log2
    else:
        t = qk
        s = qk * scale_log2
    if ALIBI:
        s += alibi_log2 * tl.abs(q_pos + diag - k_pos).to(tl.float32)
    return s, t
