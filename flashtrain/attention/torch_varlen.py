"""Packed (varlen) calls on the PyTorch path: each sequence runs alone through torch_path.

q: (total_q, Hq, D), k/v: (total_k, Hkv, D), cu_seqlens int32 (B + 1,) on the CPU. Sequence i
uses dropout seed `seed + i` and row i of the ALiBi slopes (B, Hq).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from flashtrain.attention import torch_path
from flashtrain.attention.torch_path import AttentionOptions


def _sequences(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, opts: AttentionOptions):
    """Yield (index, q rows, k rows, the sequence's options)."""
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(bounds_q) - 1):
        own = opts
        if opts.alibi_slopes is not None:
            own = replace(opts, alibi_slopes=opts.alibi_slopes[i : i + 1])
        yield i, slice(bounds_q[i], bounds_q[i + 1]), slice(bounds_k[i], bounds_k[i + 1]), own


def attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, seed: int, out, lse) -> None:
    """Writes out (total_q, Hq, D) and lse (Hq, total_q) float32 in place."""
    for i, rq, rk, own in _sequences(cu_seqlens_q, cu_seqlens_k, opts):
        o_i, lse_i = torch_path.attention_forward(
            q[None, rq], k[None, rk], v[None, rk], own, seed + i
        )
        out[rq] = o_i[0]
        lse[:, rq] = lse_i[0]


def attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, opts, seed: int):
    """Gradients (dq, dk, dv) like q, k, v; keys of a sequence without queries get 0."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i, rq, rk, own in _sequences(cu_seqlens_q, cu_seqlens_k, opts):
        g = torch_path.attention_backward(
            dout[None, rq], q[None, rq], k[None, rk], v[None, rk], out[None, rq],
            lse[None, :, rq], own, seed + i,
        )  # fmt: skip
        dq[rq], dk[rk], dv[rk] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def _padded(cu_seqlens_q, heads_q, max_seqlen_q, max_seqlen_k, fill, dtype, device):
    """A (B, Hq, max_seqlen_q, max_seqlen_k) tensor filled with `fill`."""
    shape = (cu_seqlens_q.numel() - 1, heads_q, max_seqlen_q, max_seqlen_k)
    return torch.full(shape, fill, dtype=dtype, device=device)


def _corner(i: int, rq: slice, rk: slice):
    """Where sequence i sits in a padded (B, H, max_seqlen_q, max_seqlen_k) tensor."""
    return i, slice(None), slice(0, rq.stop - rq.start), slice(0, rk.stop - rk.start)


def attention_probs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opts):
    """(probs, allowed), each (B, Hq, max_seqlen_q, max_seqlen_k) with sequence i in the top-left
    corner of batch entry i: probabilities before dropout, and where attention is allowed."""
    probs = _padded(
        cu_seqlens_q, q.shape[1], max_seqlen_q, max_seqlen_k, 0.0, torch.float32, q.device
    )
    allowed = torch.zeros_like(probs, dtype=torch.bool)
    for i, rq, rk, own in _sequences(cu_seqlens_q, cu_seqlens_k, opts):
        p_i, allowed_i = torch_path.attention_probs(q[None, rq], k[None, rk], own)
        probs[_corner(i, rq, rk)], allowed[_corner(i, rq, rk)] = p_i[0], allowed_i[0]
    return probs, allowed


def dropout_keep_mask(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opts, seed):
    """Bool (B, Hq, max_seqlen_q, max_seqlen_k): the keep-mask this path's dropout used, laid out
    like attention_probs (True outside the sequences)."""
    keep = _padded(cu_seqlens_q, q.shape[1], max_seqlen_q, max_seqlen_k, True, torch.bool, q.device)
    for i, rq, rk, own in _sequences(cu_seqlens_q, cu_seqlens_k, opts):
        q_i, k_i = q[None, rq], k[None, rk]
        keep[_corner(i, rq, rk)] = torch_path.dropout_keep_mask(
            own, seed + i, q_i.shape, k_i.shape, q.device
        )[0]
    return keep
