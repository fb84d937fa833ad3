"""return_attn_probs=True: the attention probabilities with the dropout pattern, for tests.

S_dmask (B, Hq, Sq, Sk) float32 (packed calls: (B, Hq, max_seqlen_q, max_seqlen_k), sequence i
in the top-left corner of entry i, zeros elsewhere) holds P, the softmax probabilities before
dropout and before the 1/(1-p) rescaling (0 where attention is masked, 0 for a row that sees no
key). An allowed entry that dropout dropped holds -P with the sign bit set even when P == 0,
so `torch.signbit(S_dmask)` is exactly the dropped set, `S_dmask.abs()` is P, and
out == (where(signbit, 0, P) / (1 - p)) @ V. Each route reports the mask its own dropout used:
the kernels' Philox mask on the Triton route, torch_path's on the PyTorch path.
It materialises (Sq, Sk) per head, so it is refused above MAX_ELEMENTS entries.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from flashtrain.attention import torch_path, torch_varlen
from flashtrain.attention.ops import AttentionArgs, torch_options
from flashtrain.attention.route import route_for

MAX_ELEMENTS = 1 << 24  # 64 MiB of float32


def check_size(batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> None:
    elements = batch * heads * seqlen_q * seqlen_k
    if elements > MAX_ELEMENTS:
        raise ValueError(
            f"return_attn_probs=True materialises (batch, heads, seqlen_q, seqlen_k) = "
            f"({batch}, {heads}, {seqlen_q}, {seqlen_k}) = {elements} floats; allowed up to "
            f"{MAX_ELEMENTS}: it is a testing aid for small inputs"
        )


def _kernel_keep_mask(args: AttentionArgs, seed: torch.Tensor) -> torch.Tensor:
    """The Triton kernels' own keep-mask, regenerated from the seed (flashtrain.kernels)."""
    from flashtrain.kernels.dropout_mask import dropout_keep_mask

    if args.packed:
        batch, heads = args.cu_seqlens_q.numel() - 1, args.q.shape[1]
    else:
        batch, heads = args.q.shape[0], args.q.shape[2]
    return dropout_keep_mask(
        int(seed.item()), batch, heads, args.max_seqlen_q, args.max_seqlen_k, args.dropout_p,
        args.q.device, cu_seqlens_q=args.cu_seqlens_q, cu_seqlens_k=args.cu_seqlens_k,
    )  # fmt: skip


def _torch_keep_mask(args: AttentionArgs, seed: torch.Tensor) -> torch.Tensor:
    opts, seed_value = torch_options(args), int(seed.item())
    if args.packed:
        return torch_varlen.dropout_keep_mask(
            args.q, args.k, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q,
            args.max_seqlen_k, opts, seed_value,
        )  # fmt: skip
    return torch_path.dropout_keep_mask(opts, seed_value, args.q.shape, args.k.shape, args.q.device)


def attention_probs(args: AttentionArgs, seed: torch.Tensor, block_mask=None) -> torch.Tensor:
    """S_dmask for the call `args` whose forward drew `seed` (see the module docstring).

    block_mask: the layout's bool (Hm, nq, nk) mask for block-sparse calls (args.block_mask is
    None on CUDA, where the op does not need it).
    """
    opts = torch_options(args)
    if block_mask is not None:
        opts = replace(opts, block_mask=block_mask.to(args.q.device))
    if args.packed:
        probs, allowed = torch_varlen.attention_probs(
            args.q, args.k, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q,
            args.max_seqlen_k, opts,
        )  # fmt: skip
    else:
        probs, allowed = torch_path.attention_probs(args.q, args.k, opts)
    if args.dropout_p == 0.0:
        return probs
    keep = (
        _kernel_keep_mask(args, seed)
        if route_for(args.q) == "triton"
        else _torch_keep_mask(args, seed)
    )
    return torch.where(allowed & ~keep, -probs, probs)
