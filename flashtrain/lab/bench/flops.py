"""FLOP counts for attention, the convention of the FlashAttention papers."""


def attention_flops(
    batch, heads, seqlen_q, seqlen_k, head_dim, *, causal=False, density=1.0, mode="fwd"
) -> float:
    """4*B*H*Sq*Sk*D for the forward (two matmuls), halved for causal, scaled by the fraction
    of kept blocks for block-sparse; the backward is 2.5x the forward (five matmuls)."""
    fwd = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim * density
    if causal:
        fwd /= 2
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd_bwd": 3.5 * fwd}[mode]
