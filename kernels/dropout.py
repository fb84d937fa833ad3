"""Fused attention dropout: one Philox keep-mask formula for the forward, the backward and
flashtrain.kernels.dropout_mask (which hands the same mask to tests).

The call's seed is a Python int passed by value or a 1-element int64 tensor read on the device
(no host synchronisation); either way it is widened to int64 before use, so the stream depends
only on the seed's value. Each (batch b, query head h) gets the stream seed + b * heads_q + h,
and element (i, j) of it, i and j positions within the sequence, the counter i * seqlen_k + j.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def head_seed(SEED, seed, b, h, heads_q, SEED_IN_MEMORY: tl.constexpr):
    """Philox key of (batch b, query head h), int64. SEED_IN_MEMORY: the call's seed is at
    SEED[0] (a device tensor); else it is the scalar `seed`."""
    if SEED_IN_MEMORY:
        call_seed = tl.load(SEED)
    else:
        call_seed = seed
    return call_seed.to(tl.int64) + (b * heads_q + h)


@triton.jit
def dropout_keep(seed_bh, rows, cols, seqlen_k, dropout_p):
    """Bool tile of kept probabilities: Philox keyed on seed_bh, counter row * seqlen_k + col.

    The counter is int64 (Philox takes its high word too), so it stays unique past
    seqlen_q * seqlen_k = 2**32; below that it draws what an int32 counter drew.
    """
    offsets = rows.to(tl.int64) * seqlen_k + cols
    return tl.rand(seed_bh, offsets) >= dropout_p


def seed_args(seed, device: torch.device, placeholder: torch.Tensor):
    """Kernel arguments (SEED, seed, SEED_IN_MEMORY) for a seed given as an int or a tensor."""
    if isinstance(seed, torch.Tensor):
        if seed.numel() != 1 or seed.dtype != torch.int64 or seed.device != device:
            raise ValueError(
                "seed must be a Python int or a 1-element int64 tensor on the inputs' device "
                f"({device}), got a {seed.dtype} tensor of shape {tuple(seed.shape)} on {seed.device}"
            )
        return seed, 0, True
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63) or an int64 tensor, got {seed!r}")
    return placeholder, seed, False
