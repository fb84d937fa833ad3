"""Kernel-level test helpers: the launchers called directly (no op layer), and an independent
reference for them written by definition (einsum scores, soft-cap, ALiBi bias, masks,
softmax), in float64 for the truth and in the inputs' precision for the baseline of the
project's tolerance rule (attention_testing.assert_matches_reference)."""

from __future__ import annotations

import torch
from attention_testing import assert_matches_reference

from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.flash_bwd import flash_backward
from flashtrain.kernels.flash_fwd import flash_forward

NAMES = ("out", "lse", "dq", "dk", "dv")


def cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def kernel_window(window, causal) -> tuple[int, int]:
    """The launchers' (left, right): UNBOUNDED for -1, causal folded in as right <= 0."""
    left = UNBOUNDED if window[0] < 0 else window[0]
    right = UNBOUNDED if window[1] < 0 else window[1]
    return left, (min(right, 0) if causal else right)


def run_kernels(
    q,
    k,
    v,
    dout,
    *,
    scale,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    dropout_p=0.0,
    seed=0,
    cu_q=None,
    cu_k=None,
    block_mask=None,
    block_size=0,
    deterministic=True,
):
    """Forward then backward through the launchers; returns (out, lse, dq, dk, dv).
    Dense q (B, Sq, Hq, D) or packed q (total_q, Hq, D) with cu_q / cu_k.
    deterministic=False: the backward's atomic-dQ path."""
    packed = cu_q is not None
    if packed:
        max_q = int((cu_q[1:] - cu_q[:-1]).max())
        max_k = int((cu_k[1:] - cu_k[:-1]).max())
        lse = torch.empty(q.shape[1], q.shape[0])
    else:
        max_q, max_k = q.shape[1], k.shape[1]
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1])
    left, right = kernel_window(window, causal)
    tables = None
    if block_mask is not None:
        from flashtrain.attention.sparsity.layout import BlockSparseLayout

        layout = BlockSparseLayout(block_mask, block_size)
        tables = layout.tables(max_q, max_k, causal, q.device).as_list()
    opts = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                softmax_scale=scale, window_left=left, window_right=right, dropout_p=dropout_p,
                seed=seed, tables=tables, block_size=block_size, softcap=softcap,
                alibi_slopes=alibi_slopes)  # fmt: skip
    out = torch.empty_like(q)
    flash_forward(q, k, v, out, lse, **opts)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    flash_backward(dout, q, k, v, out, lse, dq, dk, dv, deterministic=deterministic, **opts)
    return out, lse, dq, dk, dv


def allowed_elements(seqlen_q, seqlen_k, causal, window, block_mask=None, block_size=0):
    """Bool (Hm or 1, Sq, Sk): the causal / window band (bottom-right aligned) and the block mask."""
    i = torch.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k)[None, :]
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    left, right = window
    if causal:
        keep &= j <= i
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    keep = keep[None]
    if block_mask is not None:
        expanded = block_mask.repeat_interleave(block_size, -2).repeat_interleave(block_size, -1)
        keep = keep & expanded[:, :seqlen_q, :seqlen_k]
    return keep


def attention_by_definition(
    q,
    k,
    v,
    *,
    scale,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    keep_mask=None,
    dropout_p=0.0,
    block_mask=None,
    block_size=0,
):
    """Dense attention computed in q's dtype. q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D),
    alibi_slopes (B, Hq), keep_mask (B, Hq, Sq, Sk) dropout keep. Returns out, lse (B, Hq, Sq)."""
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(heads_q // heads_kv, dim=2)
    v = v.repeat_interleave(heads_q // heads_kv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (B, H, Sq, Sk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        distance = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q - torch.arange(seqlen_k)
        s = s - alibi_slopes.to(s.dtype)[:, :, None, None] * distance.abs().to(s.dtype)
    allowed = allowed_elements(seqlen_q, seqlen_k, causal, window, block_mask, block_size)
    allowed = allowed[None].expand(batch, heads_q, seqlen_q, seqlen_k)
    empty = ~allowed.any(-1, keepdim=True)
    s = s.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, dim=-1)
    lse = lse.masked_fill(empty[..., 0], float("-inf"))
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    if keep_mask is not None:
        p = p.masked_fill(~keep_mask, 0.0) / (1.0 - dropout_p)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def reference_grads(
    q, k, v, dout, dtype, *, cu_q=None, cu_k=None, alibi_slopes=None, keep_mask=None, **opts
):
    """(out, lse, dq, dk, dv) of the definition computed in `dtype`, in the kernels' layouts.
    Packed inputs run sequence by sequence (alibi_slopes row b, keep_mask[b] cropped)."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    if cu_q is None:
        out, lse = attention_by_definition(
            q, k, v, alibi_slopes=alibi_slopes, keep_mask=keep_mask, **opts
        )
    else:
        outs, lses = [], []
        for b in range(len(cu_q) - 1):
            rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            n_q, n_k = rq.stop - rq.start, rk.stop - rk.start
            o, s = attention_by_definition(
                q[None, rq], k[None, rk], v[None, rk],
                alibi_slopes=None if alibi_slopes is None else alibi_slopes[b : b + 1],
                keep_mask=None if keep_mask is None else keep_mask[b : b + 1, :, :n_q, :n_k],
                **opts,
            )  # fmt: skip
            outs.append(o[0])
            lses.append(s[0])
        out, lse = torch.cat(outs), torch.cat(lses, dim=-1)
    out.backward(dout.to(dtype))
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def check_kernels_against_definition(q, k, v, *, seed_dout=0, **opts):
    """Run the launchers and compare out, lse and every gradient with the float64 definition
    under the tolerance rule (baseline: the definition in the inputs' own precision)."""
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed_dout)).to(q.dtype)
    kernel_opts = {k_: v_ for k_, v_ in opts.items() if k_ != "keep_mask"}
    got = run_kernels(q, k, v, dout, **kernel_opts)
    ref_opts = {k_: v_ for k_, v_ in opts.items() if k_ not in ("seed", "deterministic")}
    truth = reference_grads(q, k, v, dout, torch.float64, **ref_opts)
    low = reference_grads(q, k, v, dout, q.dtype, **ref_opts)
    assert_matches_reference(got, truth, low, q.dtype, names=NAMES)
    return got
