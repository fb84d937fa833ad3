"""The dropout keep-mask the attention kernels draw for a seed, written out in full.

For tests and flash-attn-style `return_attn_probs` at small sizes: it calls the kernels' own
flashtrain.kernels.dropout helpers (same per-(batch, head) seed, same Philox counters), so it
is exactly the mask the forward applied and the backward regenerates. Runs where the kernels
run: CUDA, or CPU under TRITON_INTERPRET=1.
"""

import torch
import triton
import triton.language as tl

from flashtrain.kernels.common import locate_program, tile_grid
from flashtrain.kernels.dropout import dropout_keep, head_seed, seed_args
from flashtrain.kernels.scratch import provide_scratch_allocator

_BLOCK = 64


@triton.jit(do_not_specialize=["seed"])
def dropout_mask_kernel(
    MASK, CU_SEQLENS_Q, CU_SEQLENS_K, SEED,
    stride_mb, stride_mh, stride_mm, seqlen_q_fixed, seqlen_k_fixed, heads, dropout_p, seed,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr,
    SEED_IN_MEMORY: tl.constexpr,
):
    pid_m, b, h, _, seqlen_q, _, seqlen_k = locate_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q_fixed, seqlen_k_fixed, heads, IS_VARLEN, False)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    seed_bh = head_seed(SEED, seed, b, h, heads, SEED_IN_MEMORY)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    base = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    for n0 in range(0, seqlen_k, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        keep = dropout_keep(seed_bh, offs_m[:, None], offs_n[None, :], seqlen_k, dropout_p)
        inside = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
        tl.store(base + offs_m[:, None] * stride_mm + offs_n[None, :], keep.to(tl.int8), mask=inside)


def dropout_keep_mask(seed, batch, heads, seqlen_q, seqlen_k, dropout_p, device,
                      cu_seqlens_q=None, cu_seqlens_k=None) -> torch.Tensor:
    """bool (batch, heads, seqlen_q, seqlen_k), True where the kernels keep a probability.

    seed: the int or int64 tensor the forward was launched with; heads: query heads.
    Packed (varlen) calls pass cu_seqlens (int32, batch + 1) and seqlen_q / seqlen_k = the
    max lengths: sequence b's mask is [b, :, :len_q(b), :len_k(b)], False elsewhere (the
    layout of flash-attn's S_dmask). Every in-sequence entry is a draw, whether or not the
    causal/window/block masks let that query see that key.
    """
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    is_varlen = cu_seqlens_q is not None
    if is_varlen != (cu_seqlens_k is not None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (varlen) or not at all")
    if is_varlen and not (cu_seqlens_q.numel() == cu_seqlens_k.numel() == batch + 1):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have batch + 1 = {batch + 1} entries")
    keep = torch.zeros(batch, heads, seqlen_q, seqlen_k, dtype=torch.int8, device=device)
    seed_ptr, seed_value, seed_in_memory = seed_args(seed, keep.device, keep)
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if is_varlen else (keep, keep)  # placeholders
    grid = tile_grid(triton.cdiv(seqlen_q, _BLOCK), batch, heads, False)
    provide_scratch_allocator()  # in this thread: autograd's backward runs on its own
    dropout_mask_kernel[grid](
        keep, cu_q, cu_k, seed_ptr, keep.stride(0), keep.stride(1), keep.stride(2),
        seqlen_q, seqlen_k, heads, dropout_p, seed_value,
        BLOCK_M=_BLOCK, BLOCK_N=_BLOCK, IS_VARLEN=is_varlen, SEED_IN_MEMORY=seed_in_memory,
    )
    return keep.view(torch.bool)
