"""The KV-cache attention op: attention of a few query rows against a cache, registered with
torch.library (an opaque node for torch.compile), inference only (no autograd).

It runs the split-KV Triton kernel (flashtrain.kernels.flash_decode; CUDA, or CPU under
TRITON_INTERPRET=1) or, on CPU otherwise, the PyTorch path below with the same semantics.
The cache itself is not written here: flash_attn_with_kvcache appends new keys before the call.
"""

from __future__ import annotations

import torch

from flashtrain.attention.route import route_for

# Query rows per chunk of the PyTorch path: a (B, H, CHUNK, S_cache) float32 block is its
# largest temporary.
CHUNK = 256


def _torch_chunk(q, k, v, v_bad, seqlens_k, leftpad, slopes, scale, left, right, softcap, rows):
    """(out (B, Sq_chunk, Hq, D), lse (B, Hq, Sq_chunk)) of query rows `rows` (a slice).
    v_bad: None, or bool like v where v held a non-finite value (v holds 0 there)."""
    batch, seqlen_q, heads_q, _ = q.shape
    cache_len = k.shape[1]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc = q[:, rows].to(dtype)  # (B, r, Hq, D)
    s = torch.einsum("bqhd,bkhd->bhqk", qc, k.to(dtype)) * scale  # (B, Hq, r, S)
    if softcap > 0.0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(seqlen_q, device=q.device)[rows]
    pos = i[None, :] + (seqlens_k.long() - seqlen_q)[:, None]  # (B, r) key position of each query
    j = torch.arange(cache_len, device=q.device)
    distance = (pos[:, :, None] - j[None, None, :]).abs().to(dtype)  # (B, r, S)
    if slopes is not None:
        s = s - slopes.to(dtype)[:, :, None, None] * distance[:, None]
    jj = j[None, None, :]
    keep = (jj < seqlens_k.long()[:, None, None]).expand(batch, pos.shape[1], cache_len)
    if leftpad is not None:
        keep = keep & (jj >= leftpad.long()[:, None, None])
    if right >= 0:
        keep = keep & (jj <= pos[:, :, None] + right)
    if left >= 0:
        keep = keep & (jj >= pos[:, :, None] - left)  # (B, r, S)
    s = s.masked_fill(~keep[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, Hq, r)
    p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    out = torch.einsum("bhqk,bkhd->bqhd", p, v.to(dtype))
    if v_bad is not None:  # NaN back where a row sees a non-finite value (keep: (B, r, S))
        seen_bad = torch.einsum("bqk,bkhd->bqhd", keep.to(dtype), v_bad.to(dtype)) > 0
        out = out.masked_fill(seen_bad, float("nan"))
    return out, lse.float()


def torch_kvcache_attention(q, k_cache, v_cache, seqlens_k, cache_batch_idx, cache_leftpad,
                            block_table, slopes, scale, left, right, softcap):  # fmt: skip
    """The PyTorch path: q (B, Sq, Hq, D) against the first seqlens_k[b] keys of cache row
    cache_batch_idx[b] (or of entry b's pages, block_table); window sides -1 = unbounded.
    Returns (out like q, lse (B, Hq, Sq))."""
    if block_table is not None:  # (B, pages, page_size, Hkv, D) -> (B, pages x page_size, Hkv, D)
        k = k_cache[block_table.long()].flatten(1, 2)
        v = v_cache[block_table.long()].flatten(1, 2)
    else:
        k = k_cache[cache_batch_idx.long()] if cache_batch_idx is not None else k_cache
        v = v_cache[cache_batch_idx.long()] if cache_batch_idx is not None else v_cache
    # Masked entries never contribute (docs/attention_semantics.md): p = 0 on unused slots, the
    # left padding and keys outside the band would still give p x NaN = NaN, so V's non-finite
    # values are zeroed here and put back as NaN per row where the row sees them. K needs
    # nothing: its NaN scores are masked to -inf. One isfinite pass; nothing more if all finite.
    v_bad = ~torch.isfinite(v)
    if bool(v_bad.any()):
        v = v.masked_fill(v_bad, 0.0)
    else:
        v_bad = None
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)  # (B, S, Hq, D)
    if v_bad is not None:
        v_bad = v_bad.repeat_interleave(group, dim=2)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    for start in range(0, q.shape[1], CHUNK):
        rows = slice(start, min(start + CHUNK, q.shape[1]))
        o, chunk_lse = _torch_chunk(
            q, k, v, v_bad, seqlens_k, cache_leftpad, slopes, scale, left, right, softcap, rows
        )
        out[:, rows] = o.to(q.dtype)
        lse[..., rows] = chunk_lse
    return out, lse


# fmt: off
@torch.library.custom_op("flashtrain::kvcache_attention", mutates_args=())
def kvcache_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens_k: torch.Tensor,
    cache_batch_idx: torch.Tensor | None, cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None, alibi_slopes: torch.Tensor | None,
    softmax_scale: float, window_left: int,
    window_right: int, softcap: float, num_splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out like q, lse (B, Hq, Sq) float32). seqlens_k int32 (B,): keys per entry;
    block_table int32 (B, pages) or None: a paged cache (num_pages, page_size, Hkv, D);
    window sides -1 = unbounded (causal folded in as right = 0); alibi_slopes float32 (B, Hq)."""
    if route_for(q) == "triton":
        from flashtrain.kernels.common import UNBOUNDED
        from flashtrain.kernels.flash_decode import flash_decode

        out = torch.empty_like(q)
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        flash_decode(
            q, k_cache, v_cache, out, lse, seqlens_k, cache_batch_idx=cache_batch_idx,
            softmax_scale=softmax_scale,
            window_left=UNBOUNDED if window_left < 0 else window_left,
            window_right=UNBOUNDED if window_right < 0 else window_right,
            softcap=softcap, alibi_slopes=alibi_slopes, num_splits=num_splits,
            cache_leftpad=cache_leftpad, block_table=block_table,
        )
        return out, lse
    return torch_kvcache_attention(
        q, k_cache, v_cache, seqlens_k, cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
        softmax_scale, window_left, window_right, softcap,
    )


@kvcache_attention.register_fake
def _(q, *_):
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
# fmt: on
