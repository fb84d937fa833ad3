"""The attention implementations a benchmark compares, each as a forward closure over the same
inputs: ours, torch SDPA pinned to each backend, and FlexAttention (compiled) with a BlockMask."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from flashtrain.attention import blocksparse_attn_func, flash_attn_func

SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, name)


def _raise_recompile_limit(limit: int = 4096) -> None:
    """Every shape of a sweep compiles FlexAttention anew (dynamic=False); past dynamo's default
    limit (8) it would fall back to eager and be timed as such."""
    import torch._dynamo.config as dynamo_config

    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))


def _flex():
    """Compiled flex_attention, or None where this torch has none."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return None
    _raise_recompile_limit()
    return torch.compile(flex_attention, dynamic=False)


_FLEX = None


def flex_attention_fn():
    global _FLEX
    if _FLEX is None:
        _FLEX = _flex()
    return _FLEX


def dense_block_mask(
    causal: bool, seqlen_q: int, seqlen_k: int, window: int | None = None, device="cuda"
):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= 0  # all True, in the mask_mod's own tensor type
        if causal:
            keep = keep & (kv_idx <= q_idx + (seqlen_k - seqlen_q))
        if window is not None:
            keep = keep & (kv_idx >= q_idx + (seqlen_k - seqlen_q) - window)
        return keep

    return create_block_mask(
        mask_mod, B=None, H=None, Q_LEN=seqlen_q, KV_LEN=seqlen_k, device=device
    )


def math_fits(batch, heads, seqlen_q, seqlen_k, dtype) -> bool:
    """The MATH backend materialises scores, probabilities and their gradients: ~4 (Sq, Sk) buffers."""
    need = 4 * batch * heads * seqlen_q * seqlen_k * torch.finfo(dtype).bits // 8
    if not torch.cuda.is_available():
        return True  # the suite's dry run: toy sizes on CPU
    free, _ = torch.cuda.mem_get_info()
    return need < 0.6 * free


Method = tuple  # (forward closure, the input tensors it differentiates) or a skip reason (str)


def flex_or_reason(device: torch.device):
    """(compiled flex_attention, None) or (None, why it is skipped)."""
    if device.type != "cuda":  # inductor's CPU flex compile takes minutes on a small machine
        return None, "skipped: FlexAttention is compared on CUDA only"
    flex = flex_attention_fn()
    return (flex, None) if flex is not None else (None, "skipped: this torch has no FlexAttention")


def dense_methods(q, k, v, *, causal: bool, names=None) -> dict[str, Method | str]:
    """name -> (forward closure, inputs) or a string saying why it was skipped; names: only
    these (nothing else is built: no FlexAttention block mask where none is compared).
    q/k/v: (B, S, H, D) leaves that require grad; SDPA and Flex get (B, H, S, D) copies."""
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    methods: dict[str, Method | str] = {
        "flashtrain": (lambda: flash_attn_func(q, k, v, causal=causal), (q, k, v))
    }
    for name in SDPA_BACKENDS:
        if names is not None and f"sdpa_{name.lower()}" not in names:
            continue
        if name == "MATH" and not math_fits(
            q.shape[0], q.shape[2], q.shape[1], k.shape[1], q.dtype
        ):
            methods[f"sdpa_{name.lower()}"] = "skipped: the (S, S) matrices do not fit"
            continue
        backend = sdpa_backend(name)

        def run(backend=backend):
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        methods[f"sdpa_{name.lower()}"] = (run, (qt, kt, vt))
    if names is not None and "flex" not in names:
        return methods
    flex, reason = flex_or_reason(q.device)
    if flex is None:
        methods["flex"] = reason
    else:
        mask = dense_block_mask(causal, q.shape[1], k.shape[1], device=q.device)
        methods["flex"] = (lambda: flex(qt, kt, vt, block_mask=mask), (qt, kt, vt))
    return methods


def flex_block_mask_from_layout(layout, seqlen: int, causal: bool, device=None):
    """The same block layout as a FlexAttention BlockMask on `device` (default: the layout's):
    our partial/full tables become its kv_num_blocks/kv_indices (mask_mod applied) and full_kv_*
    (no mask_mod)."""
    from torch.nn.attention.flex_attention import BlockMask

    device = torch.device(device) if device is not None else layout.block_mask.device
    t = layout.tables(seqlen, seqlen, causal, device)
    # The mask_mod is the layout itself, not only the sequence bounds: a flex_attention that
    # falls back to eager applies mask_mod alone (ignoring the block tables) and would time,
    # and compute, dense attention.
    blocks = layout.block_mask.to(device)  # (heads_mask, n_query_blocks, n_key_blocks) bool
    heads_mask, n_query_blocks, n_key_blocks = blocks.shape
    size = layout.block_size

    def mask_mod(b, h, q_idx, kv_idx):
        in_seq = kv_idx < seqlen
        row = (q_idx // size).clamp(max=n_query_blocks - 1)
        col = (kv_idx // size).clamp(max=n_key_blocks - 1)
        keep = in_seq & blocks[h % heads_mask, row, col]
        return (keep & (kv_idx <= q_idx)) if causal else keep

    return BlockMask.from_kv_blocks(
        t.kv_partial_count[None], t.kv_partial_index[None],
        t.kv_full_count[None], t.kv_full_index[None],
        BLOCK_SIZE=layout.block_size, mask_mod=mask_mod, seq_lengths=(seqlen, seqlen),
    )  # fmt: skip


def blocksparse_methods(q, k, v, layout, *, causal: bool, names=None) -> dict[str, Method | str]:
    """Ours on the layout vs FlexAttention with the same BlockMask. q/k/v: (B, S, H, D); names:
    only these (as dense_methods)."""
    methods: dict[str, Method | str] = {
        "flashtrain": (lambda: blocksparse_attn_func(q, k, v, layout, causal=causal), (q, k, v))
    }
    if names is not None and "flex" not in names:
        return methods
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    flex, reason = flex_or_reason(q.device)
    if flex is None:
        methods["flex"] = reason
    else:
        mask = flex_block_mask_from_layout(layout, q.shape[1], causal, q.device)
        methods["flex"] = (lambda: flex(qt, kt, vt, block_mask=mask), (qt, kt, vt))
    return methods


def with_backward(forward: Callable[[], torch.Tensor], inputs) -> Callable[[], None]:
    """forward + backward into `inputs` (no .grad accumulation between repeats)."""

    def run():
        out = forward()
        torch.autograd.grad(out, inputs, torch.ones_like(out))

    return run
