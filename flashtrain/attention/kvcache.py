"""flash_attn_with_kvcache: flash-attn's decode API on the project's split-KV kernel.

Validates, appends the new keys and values to the cache in place (rotated first when rotary
tables are given), then runs the kvcache_attention op. Nothing here reads a device value on a
GPU (the value checks run on CPU tensors, or with FLASHTRAIN_CHECK_INPUTS=1), so a decode step
can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch

from flashtrain.attention import validation
from flashtrain.attention.kvcache_op import kvcache_attention
from flashtrain.attention.reference import fold_window
from flashtrain.attention.rotary import apply_rotary_at, check_rotary_tables
from flashtrain.attention.route import choose_route


def _index_tensor(name: str, t, batch: int, device) -> torch.Tensor:
    """An int32 (batch,) table, contiguous (validation.index_table: the kernel reads entry b at
    `table + b`, so a strided view is copied)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (batch,):
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be an int32 tensor of shape ({batch},), got {got}")
    return validation.index_table(t, name, device, f"shape ({batch},)")


def _check_cache(q, k_cache, v_cache, k, v) -> None:
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must be a 4-dim tensor (batch, seqlen, heads, head_dim), got {got}"
            )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_cache_len(t.shape[1], f"{name} has seqlen {t.shape[1]}")
    # dtypes, devices, head_dim, GQA, int32 limits (the cache's batch is its own: cache_batch_idx)
    validation.check_qkv(q[:0], k_cache[:0], v_cache[:0])
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name} must have a contiguous last dimension (it is written in place)"
            )
    if (k is None) != (v is None):
        raise ValueError(
            "k and v must be given together (new keys and values to append) or not at all"
        )
    if k is not None:
        new_len = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1
        want = (q.shape[0], new_len, *k_cache.shape[2:])
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4 or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} must be (batch, seqlen_new, heads_kv, head_dim) = (batch={q.shape[0]}, "
                    f"seqlen_new, {k_cache.shape[2]}, {k_cache.shape[3]}) like the cache, got {got}"
                )
            if t.dtype != k_cache.dtype or t.device != k_cache.device:
                raise ValueError(
                    f"{name} must match the cache's dtype and device ({k_cache.dtype}, "
                    f"{k_cache.device}), got {t.dtype}, {t.device}"
                )


def _check_cache_len(cache_len: int, what: str) -> None:
    """Key positions stay int32 in the kernel (docs/attention_semantics.md, "Size limits")."""
    if cache_len > validation.MAX_SEQLEN:
        raise ValueError(
            f"{what}; the kernels allow up to {validation.MAX_SEQLEN} (2^30 - 1) keys per "
            "cache entry"
        )


def _cache_seqlens_tensor(cache_seqlens, batch: int, device, cache_len: int, new_len: int):
    """The int32 (batch,) table; an int is range-checked here (free: no device value), before
    torch.full could overflow on it."""
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise ValueError(
            f"cache_seqlens must be an int or an int32 tensor ({batch},), got "
            f"{type(cache_seqlens).__name__}"
        )
    if isinstance(cache_seqlens, int):
        if not 0 <= cache_seqlens <= cache_len - new_len:
            raise ValueError(
                f"cache_seqlens={cache_seqlens} is out of range: with seqlen_new={new_len} new "
                f"keys it must lie in [0, {cache_len - new_len}] (the cache holds {cache_len})"
            )
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    return _index_tensor("cache_seqlens", cache_seqlens, batch, device)


def _block_table(block_table, batch: int, device, cache_batch_idx) -> torch.Tensor:
    """The int32 (batch, pages) table, contiguous (the kernel reads a row with stride 1)."""
    if (
        not isinstance(block_table, torch.Tensor)
        or block_table.dtype != torch.int32
        or (block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0)
    ):
        got = (
            f"{block_table.dtype} {tuple(block_table.shape)}"
            if isinstance(block_table, torch.Tensor)
            else type(block_table).__name__
        )
        raise ValueError(f"block_table must be an int32 tensor ({batch}, pages >= 1), got {got}")
    if cache_batch_idx is not None:
        raise ValueError(
            "a paged cache (block_table) names each entry's pages: drop cache_batch_idx"
        )
    return validation.index_table(block_table, "block_table", device, "pages", dims=2)


def _check_values(cache_seqlens, new_len, cache_len, cache_batch_idx, cache_rows, leftpad,
                  block_table=None, *, appends: bool = False) -> None:  # fmt: skip
    """Index values that would otherwise write or read outside the cache, or (appends: k, v
    given) write two entries' keys into one cache row (CPU tensors, or
    FLASHTRAIN_CHECK_INPUTS=1: reading them costs a host sync on a GPU)."""
    if not validation.values_checked(cache_seqlens.device):
        return
    lens = cache_seqlens.cpu().long()  # int64: an int32 2^31 - 1 + seqlen_new would wrap
    if bool((lens < 0).any()) or bool((lens + new_len > cache_len).any()):
        raise ValueError(
            f"cache_seqlens + seqlen_new must lie in [0, {cache_len}] (the cache's length); got "
            f"cache_seqlens={lens.tolist()}, seqlen_new={new_len}"
        )
    if cache_batch_idx is not None:
        idx = cache_batch_idx.cpu()
        if bool((idx < 0).any()) or bool((idx >= cache_rows).any()):
            raise ValueError(
                f"cache_batch_idx must index the cache's {cache_rows} rows, got {idx.tolist()}"
            )
        if appends:
            _check_unique_rows(idx)
    if block_table is not None:
        pages = block_table.cpu()
        if bool((pages < 0).any()) or bool((pages >= cache_rows).any()):
            raise ValueError(
                f"block_table must index the cache's {cache_rows} pages, got {pages.tolist()}"
            )
    if leftpad is not None:
        pad = leftpad.cpu()
        if bool((pad < 0).any()) or bool((pad > lens).any()):
            raise ValueError(
                f"cache_leftpad must lie in [0, cache_seqlens]; got {pad.tolist()} with "
                f"cache_seqlens={lens.tolist()}"
            )


def _check_unique_rows(cache_batch_idx: torch.Tensor) -> None:
    """flash-attn's contract: entries that append k, v name distinct cache rows. Two entries
    of one row would write their keys into the same slots, each attending the other's (the
    last write wins here; a race in a fused kernel). Reading one row from several entries,
    without k, v, is fine."""
    rows, counts = cache_batch_idx.unique(return_counts=True)
    repeated = counts > 1
    if bool(repeated.any()):
        row, times = int(rows[repeated][0]), int(counts[repeated][0])
        raise ValueError(
            f"cache_batch_idx names cache row {row} for {times} entries while k, v "
            f"are appended (got {cache_batch_idx.tolist()}): entries that append must use "
            "distinct rows (repeated rows are allowed only without k, v)"
        )


def _check_rotary_length(seqlen_ro: int, start: torch.Tensor, new_len: int, q_rows: int) -> None:
    """The tables must hold the largest position rotated: start (B,) + the longer of the new
    keys and the query rows rotated one apart (q_rows: 1 where every row sits at start)."""
    if not validation.values_checked(start.device):
        return
    last = start + max(new_len, q_rows) - 1  # (B,)
    if bool((last >= seqlen_ro).any()):
        raise ValueError(
            f"rotary_cos has {seqlen_ro} positions but this call rotates up to position "
            f"{int(last.max())} (cache_seqlens + max(seqlen_new, rotated query rows) - 1)"
        )


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
):
    """Attention of q against a KV cache, appending new keys and values first (flash-attn's
    positional order and names).

    q: (B, Sq, Hq, D); k_cache, v_cache: (B_cache, S_cache, Hkv, D), Hq % Hkv == 0, written in
    place when k, v are given. fp16, bf16 or fp32; head_dim 1..256.
    k, v: None, or (B, Snew, Hkv, D) new keys and values, stored at positions
        cache_seqlens[b] .. cache_seqlens[b] + Snew - 1 of cache row cache_batch_idx[b].
    rotary_cos, rotary_sin: None, or (seqlen_ro, rotary_dim / 2) tables (needs k, v): new key i
        is rotated at its absolute cache slot cache_seqlens[b] + i, query row i there too when
        causal or windowed, else every query row at cache_seqlens[b] (flash-attn's rule; with
        cache_leftpad too: positions are slots, not counted from the padding). seqlen_ro must
        exceed the largest position rotated.
        rotary_interleaved: pairs (2j, 2j+1) (GPT-J) if True, halves (GPT-NeoX, Llama) if False.
    cache_seqlens: int or int32 (B,): keys already in the cache per batch entry, 0 ..
        S_cache - Snew; None: the whole cache (then k, v cannot be appended). Batch b attends
        the first cache_seqlens[b] + Snew keys.
    cache_batch_idx: int32 (B,): the cache row of each batch entry (None: row b, B_cache == B).
    cache_leftpad: int32 (B,): keys before it are padding (never attended); None: 0.
    block_table: int32 (B, pages): a paged cache. k_cache, v_cache are then a pool
        (num_pages, page_size, Hkv, D) and entry b's key j lives at row j % page_size of page
        block_table[b, j // page_size] (any page_size; flash-attn asks for multiples of 256);
        not with cache_batch_idx.
    causal: aligned bottom-right per entry (query i sees keys j <= i + seqlen_k[b] - Sq), so
        Sq > 1 works for chunked prefill and speculative decoding.
    window_size, softcap, alibi_slopes, softmax_scale: as flash_attn_func.
    num_splits: splits of the cache's sequence axis over programs (merged exactly through the
        LSE); 0 chooses from batch x heads x cache length to fill the GPU; 1 never splits.
    Returns out (B, Sq, Hq, D), and with return_softmax_lse also lse (B, Hq, Sq) float32.
    """
    _check_cache(q, k_cache, v_cache, k, v)
    validation.check_scale(softmax_scale)
    validation.check_softcap(softcap)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(
            f"num_splits must be an int >= 0 (0 = chosen from the shape), got {num_splits!r}"
        )
    batch, seqlen_q, heads_q, head_dim = q.shape
    cache_rows, cache_len = k_cache.shape[:2]
    device = q.device
    if block_table is not None:
        block_table = _block_table(block_table, batch, device, cache_batch_idx)
        cache_len = block_table.shape[1] * k_cache.shape[1]  # an entry's pages hold this many keys
        _check_cache_len(
            cache_len, f"block_table gives each entry {block_table.shape[1]} pages x "
            f"{k_cache.shape[1]} keys = {cache_len} keys"
        )  # fmt: skip
    elif cache_batch_idx is not None:
        cache_batch_idx = _index_tensor("cache_batch_idx", cache_batch_idx, batch, device)
    elif cache_rows != batch:
        raise ValueError(
            f"the cache has {cache_rows} rows but q has batch {batch}: pass cache_batch_idx "
            "(int32 (batch,)) to say which row each batch entry uses"
        )
    if cache_leftpad is not None:
        cache_leftpad = _index_tensor("cache_leftpad", cache_leftpad, batch, device)
    new_len = 0 if k is None else k.shape[1]
    if cache_seqlens is None:
        if k is not None or cache_leftpad is not None:
            raise ValueError(
                "appending k, v or cache_leftpad needs cache_seqlens (where each entry's keys end)"
            )
        lens = torch.full((batch,), cache_len, dtype=torch.int32, device=device)
    else:
        lens = _cache_seqlens_tensor(cache_seqlens, batch, device, cache_len, new_len)
    _check_values(lens, new_len, cache_len, cache_batch_idx, cache_rows, cache_leftpad, block_table,
                  appends=k is not None)  # fmt: skip
    slopes = validation.check_alibi_slopes(alibi_slopes, batch, heads_q, device)
    left, right = fold_window(validation.check_window(window_size), causal, cache_len)
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary and k is None:
        raise ValueError("rotary_cos / rotary_sin rotate the appended k (and q): pass k and v too")
    choose_route(q)  # its refusal (bfloat16 on a forced interpreter route) before the append

    q = q if q.stride(-1) == 1 else q.contiguous()
    if k is not None:
        # flash-attn's positions (FA2's seqlen_k_cache + leftpad_k; FA3's rotary_seqlens =
        # cache_seqlens): new key i sits, and is rotated, at the absolute cache slot
        # cache_seqlens[b] + i; cache_leftpad moves neither.
        start = lens.long()  # (B,)
        steps = torch.arange(max(new_len, seqlen_q), device=device)
        if rotary:
            if rotary_cos is None or rotary_sin is None:
                raise ValueError("rotary_cos and rotary_sin must be given together")
            check_rotary_tables(rotary_cos, rotary_sin, head_dim, device)
            # query rows at start + i with causal or a window, else all at start (flash-attn)
            every_row = causal or left >= 0 or right >= 0
            _check_rotary_length(rotary_cos.shape[0], start, new_len, seqlen_q if every_row else 1)
            k = apply_rotary_at(
                k, rotary_cos, rotary_sin, start[:, None] + steps[:new_len], rotary_interleaved
            )
            q_pos = start[:, None] + (steps[:seqlen_q] if every_row else 0 * steps[:seqlen_q])
            q = apply_rotary_at(q, rotary_cos, rotary_sin, q_pos, rotary_interleaved)
        at = lens.long()[:, None] + steps[None, :new_len]  # (B, Snew) key positions
        if block_table is not None:  # page and row within it of each new key
            page_size = k_cache.shape[1]
            rows, at = block_table.long().gather(1, at // page_size), at % page_size
        elif cache_batch_idx is not None:
            rows = cache_batch_idx.long()[:, None]
        else:
            rows = torch.arange(batch, device=device)[:, None]
        k_cache[rows, at] = k
        v_cache[rows, at] = v
        lens = lens + new_len
    scale = float(1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale)
    out, lse = kvcache_attention(
        q, k_cache, v_cache, lens, cache_batch_idx, cache_leftpad, block_table, slopes, scale,
        left, right,
        float(softcap), int(num_splits),
    )  # fmt: skip
    return (out, lse) if return_softmax_lse else out
