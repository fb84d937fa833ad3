"""Memory-linear attention in plain PyTorch: the CPU path when the Triton interpreter is off.

Calls that ATen's fused CPU flash kernel covers exactly go there (flashtrain.attention.cpu_flash);
everything else (low precision, dropout, windows, block masks, softcap, ALiBi, causal with
seqlen_q != seqlen_k, empty sequences) runs here.

The same algorithm as the kernels, at the granularity of query chunks: the forward keeps only
the output and the log-sum-exp; the backward recomputes each chunk's probabilities from them.
A chunk of CHUNK query rows visits only the key columns its window lets any of its rows see (a
block-sparse chunk, one layout block row, only the keys of its kept blocks), and builds its masks
for that (rows, cols) block alone, so the largest temporary is one
(B, H, CHUNK, cols) score block, never (Sq, Sk). Dropout regenerates its keep-mask per chunk
from (seed, chunk index), so the backward sees the forward's exact mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtrain.attention import cpu_flash
from flashtrain.attention.reference import alibi_distance, allowed_mask, positions

# Query rows per chunk: a (B, H, CHUNK, cols) float32 block is the largest temporary.
CHUNK = 256


@dataclass(frozen=True)
class AttentionOptions:
    """Everything besides q, k, v that decides the scores, for one dense (B, S, H, D) call.

    window: (left, right) with causal folded in and sides >= seqlen_k already -1 (unbounded).
    alibi_slopes: None or float32 (B, Hq). block_mask: None or bool (Hm, nq, nk), Hm in {1, Hq},
    at block_size tokens, True = computed.
    """

    scale: float
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None
    dropout_p: float = 0.0
    block_mask: torch.Tensor | None = None
    block_size: int = 0


def _chunks(seqlen_q: int, seqlen_k: int, opts: AttentionOptions):
    """Yield (index, rows, cols): a chunk of query rows and the key columns any of them may see.

    Dense: CHUNK rows, cols the slice their window allows. Block-sparse: one layout block row of
    queries, cols only the keys of the blocks some head keeps for it (a 1-D position tensor,
    or a slice when they are contiguous), so the work follows the kept blocks, not S^2.
    """
    left, right = opts.window
    diag = seqlen_k - seqlen_q
    rows_per_chunk = opts.block_size if opts.block_mask is not None else CHUNK
    for index, start in enumerate(range(0, seqlen_q, rows_per_chunk)):
        stop = min(start + rows_per_chunk, seqlen_q)
        lo = 0 if left < 0 else min(max(start + diag - left, 0), seqlen_k)
        hi = seqlen_k if right < 0 else min(max(stop + diag + right, lo), seqlen_k)
        cols = slice(lo, hi)
        if opts.block_mask is not None:
            cols = _kept_columns(opts.block_mask, start // opts.block_size, opts.block_size, cols)
        yield index, slice(start, stop), cols


def _kept_columns(block_mask: torch.Tensor, row_block: int, block_size: int, band: slice):
    """Key positions in `band` whose layout block some head keeps for `row_block`."""
    kept_blocks = block_mask[:, row_block].any(0)  # (nk,)
    kept = kept_blocks.repeat_interleave(block_size)[band]
    cols = kept.nonzero().flatten() + band.start
    if cols.numel() == 0:
        return slice(band.start, band.start)
    first, last = int(cols[0]), int(cols[-1])
    return slice(first, last + 1) if last - first + 1 == cols.numel() else cols


def _keep_probs(seed: int, chunk_index: int, shape, dropout_p: float, device) -> torch.Tensor:
    """Bool keep-mask for one chunk, a pure function of (seed, chunk_index, shape)."""
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + chunk_index) % (2**63 - 1))
    return torch.rand(shape, generator=gen, device=device) >= dropout_p


def _chunk_allowed(opts: AttentionOptions, rows, cols, seqlen_q, seqlen_k, heads_kv, device):
    """Bool mask broadcastable to (B, Hkv, G, r, c) for this block, or None if all is allowed."""
    keep = None
    if opts.window != (-1, -1):
        keep = allowed_mask(seqlen_q, seqlen_k, opts.window, rows=rows, cols=cols, device=device)
    if opts.block_mask is not None:
        row_blocks = positions(rows, seqlen_q, device) // opts.block_size
        col_blocks = positions(cols, seqlen_k, device) // opts.block_size
        blocks = opts.block_mask[:, row_blocks][:, :, col_blocks]  # (Hm, r, c)
        if blocks.shape[0] == 1:
            blocks = blocks[0]
        else:
            blocks = blocks.view(heads_kv, -1, *blocks.shape[1:])  # (Hkv, G, r, c)
        keep = blocks if keep is None else keep & blocks
    return keep


def _chunk_scores(qg, kf, opts: AttentionOptions, rows, cols, seqlen_q, seqlen_k):
    """Scores (B, Hkv, G, r, c) float32 with disallowed entries at -inf, the softcap's
    derivative d(capped)/d(raw) for the backward (None without softcap), and the bool mask of
    allowed entries (broadcastable to the scores; None when all are allowed)."""
    s = torch.einsum("bhgqd,bhkd->bhgqk", qg[..., rows, :], kf[:, :, cols]) * opts.scale
    cap_grad = None
    if opts.softcap > 0.0:
        t = torch.tanh(s / opts.softcap)
        s = opts.softcap * t
        cap_grad = 1.0 - t * t
    if opts.alibi_slopes is not None:
        b, hkv, g = s.shape[:3]
        slopes = opts.alibi_slopes.view(b, hkv, g, 1, 1)
        s = s - slopes * alibi_distance(seqlen_q, seqlen_k, rows=rows, cols=cols, device=s.device)
    keep = _chunk_allowed(opts, rows, cols, seqlen_q, seqlen_k, kf.shape[1], s.device)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s, cap_grad, keep


def _nonfinite(x: torch.Tensor) -> torch.Tensor | None:
    """Bool like x where it holds NaN or +-inf; None when it holds none (the usual case: one
    pass over x, against the chunks' S^2 work)."""
    bad = ~torch.isfinite(x)
    return bad if bool(bad.any()) else None


def _seen_nonfinite(keep, scores_shape, v_bad_cols: torch.Tensor) -> torch.Tensor:
    """Bool (B, Hkv, G, r, D): where a row may see a non-finite value of V (v_bad_cols
    (B, Hkv, c, D)). Masked entries never contribute (docs/attention_semantics.md): V's
    non-finite values are zeroed before p @ V, so a row with p = 0 there is not NaN, and
    put back as NaN here for the rows that see them."""
    seen = torch.ones(scores_shape) if keep is None else torch.broadcast_to(keep, scores_shape)
    return torch.einsum("bhgqk,bhkd->bhgqd", seen.float(), v_bad_cols.float()) > 0


def _softmax(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities like s and the log-sum-exp (B, Hkv, G, r); rows that see nothing get
    lse = -inf and probabilities 0."""
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0)[..., None]), lse


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


def attention_forward(q, k, v, opts: AttentionOptions, seed: int = 0):
    """q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D) -> out like q, lse (B, Hq, Sq) float32."""
    if cpu_flash.eligible(q, k, v, opts):
        return cpu_flash.forward(q, k, v, scale=opts.scale, window=opts.window)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    qg, kf, vf = _prepare(q, k, v)
    v_bad = _nonfinite(vf)  # (B, Hkv, Sk, D) or None
    if v_bad is not None:
        vf = vf.masked_fill(v_bad, 0.0)
    out = torch.empty_like(qg)
    lse = torch.empty(qg.shape[:-1], dtype=torch.float32, device=q.device)  # (B, Hkv, G, Sq)
    for index, rows, cols in _chunks(seqlen_q, seqlen_k, opts):
        s, _, keep = _chunk_scores(qg, kf, opts, rows, cols, seqlen_q, seqlen_k)
        p, chunk_lse = _softmax(s)
        if opts.dropout_p > 0.0:
            keep = _keep_probs(seed, index, p.shape, opts.dropout_p, p.device)
            p = p * keep / (1.0 - opts.dropout_p)
        out[..., rows, :] = torch.einsum("bhgqk,bhkd->bhgqd", p, vf[:, :, cols])
        if v_bad is not None:
            seen_bad = _seen_nonfinite(keep, s.shape, v_bad[:, :, cols])
            out[..., rows, :] = out[..., rows, :].masked_fill(seen_bad, float("nan"))
        lse[..., rows] = chunk_lse
    batch, heads_q = q.shape[0], q.shape[2]
    return _merge_heads(out).to(q.dtype), lse.reshape(batch, heads_q, seqlen_q)


def attention_backward(dout, q, k, v, out, lse, opts: AttentionOptions, seed: int = 0):
    """Gradients (dq, dk, dv) by recomputing each chunk's probabilities from lse."""
    if cpu_flash.eligible(q, k, v, opts):
        return cpu_flash.backward(dout, q, k, v, out, lse, scale=opts.scale, window=opts.window)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    heads_kv = k.shape[2]
    qg, kf, vf = _prepare(q, k, v)
    dog = _split_heads(dout, heads_kv)
    delta = (dog * _split_heads(out, heads_kv)).sum(-1)  # (B, Hkv, G, Sq) = rowsum(dO * O)
    lse = lse.view(qg.shape[:-1])
    # Masked entries never contribute: dp is NaN where V (or dO) is, so ds is masked below, and
    # dQ multiplies ds = 0 by K, so K's non-finite values are zeroed for it (a row that sees
    # one has ds = NaN there already). Only when there are any: one pass over each.
    guard_ds = _nonfinite(vf) is not None or _nonfinite(dog) is not None
    k_bad = _nonfinite(kf)
    kf_dq = kf if k_bad is None else kf.masked_fill(k_bad, 0.0)
    dq = torch.empty_like(qg)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    for index, rows, cols in _chunks(seqlen_q, seqlen_k, opts):
        s, cap_grad, keep = _chunk_scores(qg, kf, opts, rows, cols, seqlen_q, seqlen_k)
        chunk_lse = lse[..., rows]
        # Rows that saw no key get +inf so their probabilities (and gradients) are exactly 0.
        chunk_lse = chunk_lse.masked_fill(chunk_lse == float("-inf"), float("inf"))
        p = torch.exp(s - chunk_lse[..., None])  # (B, Hkv, G, r, c)
        do = dog[..., rows, :]
        dp = torch.einsum("bhgqd,bhkd->bhgqk", do, vf[:, :, cols])
        if opts.dropout_p > 0.0:
            keep = _keep_probs(seed, index, p.shape, opts.dropout_p, p.device)
            keep = keep / (1.0 - opts.dropout_p)
            dv[:, :, cols] += torch.einsum("bhgqk,bhgqd->bhkd", p * keep, do)
            dp = dp * keep
        else:
            dv[:, :, cols] += torch.einsum("bhgqk,bhgqd->bhkd", p, do)
        ds = p * (dp - delta[..., rows, None])  # gradient of the final (capped, biased) scores
        if cap_grad is not None:
            ds = ds * cap_grad
        if guard_ds and keep is not None:
            ds = ds.masked_fill(~keep, 0.0)
        dq[..., rows, :] = torch.einsum("bhgqk,bhkd->bhgqd", ds, kf_dq[:, :, cols]) * opts.scale
        dk[:, :, cols] += torch.einsum("bhgqk,bhgqd->bhkd", ds, qg[..., rows, :]) * opts.scale
    return (
        _merge_heads(dq).to(q.dtype),
        dk.transpose(1, 2).to(k.dtype),
        dv.transpose(1, 2).to(v.dtype),
    )


def dropout_keep_mask(opts: AttentionOptions, seed: int, q_shape, k_shape, device):
    """Bool (B, Hq, Sq, Sk): the keep-mask this path's dropout uses for a call with these shapes.

    Keys outside every chunk's window band are never drawn and read as kept (they are masked).
    """
    batch, seqlen_q, heads_q, _ = q_shape
    seqlen_k, heads_kv = k_shape[1], k_shape[2]
    group = heads_q // heads_kv
    mask = torch.ones(batch, heads_kv, group, seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    for index, rows, cols in _chunks(seqlen_q, seqlen_k, opts):
        cols_count = len(positions(cols, seqlen_k, device))
        shape = (batch, heads_kv, group, rows.stop - rows.start, cols_count)
        mask[..., rows, cols] = _keep_probs(seed, index, shape, opts.dropout_p, device)
    return mask.view(batch, heads_q, seqlen_q, seqlen_k)


def attention_probs(q, k, opts: AttentionOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs, allowed), both (B, Hq, Sq, Sk): the softmax probabilities before dropout (float32)
    and where attention is allowed at all. For return_attn_probs, so small sizes only."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    qg, kf, _ = _prepare(q, k, k)
    probs = torch.zeros(*qg.shape[:-1], seqlen_k, dtype=torch.float32, device=q.device)
    allowed = torch.zeros(probs.shape, dtype=torch.bool, device=q.device)
    for _, rows, cols in _chunks(seqlen_q, seqlen_k, opts):
        s, _, _ = _chunk_scores(qg, kf, opts, rows, cols, seqlen_q, seqlen_k)
        probs[..., rows, cols] = _softmax(s)[0]
        allowed[..., rows, cols] = s > float("-inf")
    shape = (q.shape[0], q.shape[2], seqlen_q, seqlen_k)
    return probs.view(shape), allowed.view(shape)
