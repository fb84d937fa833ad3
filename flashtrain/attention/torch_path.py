"""Memory-linear attention in plain PyTorch: the CPU path when the Triton interpreter is off.

Calls that ATen's fused CPU flash kernel covers exactly go there (flashtrain.attention.cpu_flash);
everything else (dropout, windows, block masks, causal with seqlen_q != seqlen_k) runs here.

The same algorithm as the kernels, at the granularity of query chunks: the forward keeps only
the output and the log-sum-exp; the backward recomputes each chunk's probabilities from them.
Peak extra memory is one (B, H, chunk, Sk) score block, never (Sq, Sk) for all queries at once.
Dropout regenerates its keep-mask per chunk from (seed, chunk index), so the backward sees the
forward's exact mask.
"""

from __future__ import annotations

import torch

from flashtrain.attention import cpu_flash
from flashtrain.attention.reference import allowed_mask

# Query rows per chunk: a (B, H, CHUNK, Sk) float32 block is the largest temporary.
CHUNK = 256


def _keep_probs(seed: int, chunk_index: int, shape, dropout_p: float, device) -> torch.Tensor:
    """Bool keep-mask for one chunk, a pure function of (seed, chunk_index)."""
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + chunk_index) % (2**63 - 1))
    return torch.rand(shape, generator=gen, device=device) >= dropout_p


def _chunk_scores(q_chunk, k, scale, rows, seqlen_q, seqlen_k, window, block_mask, block_size):
    """Scores (B, Hkv, G, c, Sk) in float32 with disallowed entries at -inf.

    block_mask: None, or bool (Hm, nq, nk) expanded here for this chunk's rows only.
    """
    s = torch.einsum("bhgqd,bhkd->bhgqk", q_chunk, k) * scale
    keep = allowed_mask(seqlen_q, seqlen_k, window_size=window, device=s.device)[rows]  # (c, Sk)
    if block_mask is not None:
        row_blocks = torch.arange(rows.start, rows.stop, device=s.device) // block_size
        col_blocks = torch.arange(seqlen_k, device=s.device) // block_size
        chunk = block_mask[:, row_blocks][:, :, col_blocks]  # (Hm, c, Sk)
        hkv, g = s.shape[1], s.shape[2]
        keep = keep & (chunk[0] if chunk.shape[0] == 1 else chunk.view(hkv, g, *chunk.shape[1:]))
    return s.masked_fill(~keep, float("-inf"))


def _split_heads(x: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(B, S, Hq, D) -> (B, Hkv, G, S, D) float32: query heads grouped under their kv head."""
    b, s, hq, d = x.shape
    return x.float().view(b, s, heads_kv, hq // heads_kv, d).permute(0, 2, 3, 1, 4)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, Hkv, G, S, D) -> (B, S, Hkv*G, D)."""
    b, hk, g, s, d = x.shape
    return x.permute(0, 3, 1, 2, 4).reshape(b, s, hk * g, d)


def _prepare(q, k, v):
    heads_kv = k.shape[2]
    qg = _split_heads(q, heads_kv)  # (B, Hkv, G, Sq, D)
    kf = k.float().transpose(1, 2)  # (B, Hkv, Sk, D)
    vf = v.float().transpose(1, 2)
    return qg, kf, vf


def attention_forward(
    q, k, v, *, scale, window, dropout_p=0.0, seed=0, block_mask=None, block_size=0
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D) -> out like q, lse (B, Hq, Sq) float32.

    window: (left, right) with causal already folded in (right = 0); -1 = unbounded.

    block_mask: optional bool (Hm, nq, nk) at block_size tokens, Hm in {1, Hq}: True = computed.
    """
    if cpu_flash.eligible(q, k, window=window, dropout_p=dropout_p, block_mask=block_mask):
        return cpu_flash.forward(q, k, v, scale=scale, window=window)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    qg, kf, vf = _prepare(q, k, v)
    out = torch.empty_like(qg)
    lse = torch.empty(qg.shape[:-1], dtype=torch.float32, device=q.device)  # (B, Hkv, G, Sq)
    for index, start in enumerate(range(0, seqlen_q, CHUNK)):
        rows = slice(start, min(start + CHUNK, seqlen_q))
        s = _chunk_scores(
            qg[..., rows, :], kf, scale, rows, seqlen_q, seqlen_k, window, block_mask, block_size
        )
        chunk_lse = torch.logsumexp(s, dim=-1)  # (B, Hkv, G, c); -inf for rows that see nothing
        p = torch.exp(s - chunk_lse.masked_fill(chunk_lse == float("-inf"), 0.0)[..., None])
        if dropout_p > 0.0:
            p = p * _keep_probs(seed, index, p.shape, dropout_p, p.device) / (1.0 - dropout_p)
        out[..., rows, :] = torch.einsum("bhgqk,bhkd->bhgqd", p, vf)
        lse[..., rows] = chunk_lse
    batch, heads_q = q.shape[0], q.shape[2]
    return _merge_heads(out).to(q.dtype), lse.reshape(batch, heads_q, seqlen_q)


def attention_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    *,
    scale,
    window,
    dropout_p=0.0,
    seed=0,
    block_mask=None,
    block_size=0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) by recomputing each chunk's probabilities from lse."""
    if cpu_flash.eligible(q, k, window=window, dropout_p=dropout_p, block_mask=block_mask):
        return cpu_flash.backward(dout, q, k, v, out, lse, scale=scale, window=window)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    heads_kv = k.shape[2]
    qg, kf, vf = _prepare(q, k, v)
    dog = _split_heads(dout, heads_kv)
    delta = (dog * _split_heads(out, heads_kv)).sum(-1)  # (B, Hkv, G, Sq) = rowsum(dO * O)
    lse = lse.view(qg.shape[:-1])
    dq = torch.empty_like(qg)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    for index, start in enumerate(range(0, seqlen_q, CHUNK)):
        rows = slice(start, min(start + CHUNK, seqlen_q))
        s = _chunk_scores(
            qg[..., rows, :], kf, scale, rows, seqlen_q, seqlen_k, window, block_mask, block_size
        )
        chunk_lse = lse[..., rows]
        # Rows that saw no key get +inf so their probabilities (and gradients) are exactly 0.
        chunk_lse = chunk_lse.masked_fill(chunk_lse == float("-inf"), float("inf"))
        p = torch.exp(s - chunk_lse[..., None])  # (B, Hkv, G, c, Sk)
        do = dog[..., rows, :]
        dp = torch.einsum("bhgqd,bhkd->bhgqk", do, vf)
        if dropout_p > 0.0:
            keep = _keep_probs(seed, index, p.shape, dropout_p, p.device) / (1.0 - dropout_p)
            dv += torch.einsum("bhgqk,bhgqd->bhkd", p * keep, do)
            dp = dp * keep
        else:
            dv += torch.einsum("bhgqk,bhgqd->bhkd", p, do)
        ds = p * (dp - delta[..., rows, None])
        dq[..., rows, :] = torch.einsum("bhgqk,bhkd->bhgqd", ds, kf) * scale
        dk += torch.einsum("bhgqk,bhgqd->bhkd", ds, qg[..., rows, :]) * scale
    return (
        _merge_heads(dq).to(q.dtype),
        dk.transpose(1, 2).to(k.dtype),
        dv.transpose(1, 2).to(v.dtype),
    )
