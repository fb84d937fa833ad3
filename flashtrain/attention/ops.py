"""The attention custom ops: one forward and one backward, registered with torch.library so
torch.compile treats them as opaque nodes (no graph break), tied together by register_autograd.

Both run the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1) or the PyTorch path, with
identical semantics. Packed (varlen) inputs are (total, H, D) with cu_seqlens; dense inputs
(B, S, H, D) with cu_seqlens None. Block-sparse calls pass the bool block_mask (Hm, nq, nk)
for the PyTorch path and the layout's compiled tables (BlockTables.as_list()) for the kernels;
other calls pass None, [], 0.
"""

from __future__ import annotations

import torch

from flashtrain.attention import torch_path
from flashtrain.attention.backend import use_triton

UNBOUNDED = 1 << 30  # mirrors flashtrain.kernels.common.UNBOUNDED without importing triton here


def _kernel_window(left: int, right: int) -> tuple[int, int]:
    return (UNBOUNDED if left < 0 else left), (UNBOUNDED if right < 0 else right)


def _draw_seed(device: torch.device) -> int:
    """A fresh dropout seed from torch's default generator of `device` (so manual_seed replays it)."""
    return int(torch.randint(0, 2**62, (1,), device=device).item())


def _per_sequence(cu_q: torch.Tensor, cu_k: torch.Tensor):
    """Yield (index, q slice, k slice) per packed sequence."""
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bounds_q) - 1):
        yield i, slice(bounds_q[i], bounds_q[i + 1]), slice(bounds_k[i], bounds_k[i + 1])


def _lse_shape(q: torch.Tensor, packed: bool) -> tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])


# fmt: off
@torch.library.custom_op("flashtrain::attention_forward", mutates_args=())
def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
    window_left: int, window_right: int, dropout_p: float,
    block_mask: torch.Tensor | None, block_tables: list[torch.Tensor], block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (out like q, lse float32 (B, H, Sq) or (H, total_q), seed int64 (1,) on CPU)."""
    packed = cu_seqlens_q is not None
    seed = _draw_seed(q.device) if dropout_p > 0.0 else 0
    out = torch.empty_like(q)
    lse = torch.empty(_lse_shape(q, packed), dtype=torch.float32, device=q.device)
    if use_triton(q.device):
        from flashtrain.kernels.flash_fwd import flash_forward

        left, right = _kernel_window(window_left, window_right)
        flash_forward(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                      softmax_scale=softmax_scale, window_left=left, window_right=right,
                      dropout_p=dropout_p, seed=seed, tables=block_tables, block_size=block_size)
        return out, lse, torch.tensor([seed], dtype=torch.int64)
    opts = dict(scale=softmax_scale, window=(window_left, window_right), dropout_p=dropout_p,
                block_mask=block_mask, block_size=block_size)
    if not packed:
        # Copy into the buffers the fake impl promises: compiled graphs assert their strides.
        o, lse_dense = torch_path.attention_forward(q, k, v, seed=seed, **opts)
        out.copy_(o)
        lse.copy_(lse_dense)
        return out, lse, torch.tensor([seed], dtype=torch.int64)
    for i, rq, rk in _per_sequence(cu_seqlens_q, cu_seqlens_k):
        o_i, lse_i = torch_path.attention_forward(q[None, rq], k[None, rk], v[None, rk],
                                                  seed=seed + i, **opts)
        out[rq] = o_i[0]
        lse[:, rq] = lse_i[0]
    return out, lse, torch.tensor([seed], dtype=torch.int64)


@attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, dropout_p, block_mask, block_tables, block_size):
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return torch.empty_like(q), lse, torch.empty(1, dtype=torch.int64, device="cpu")


@torch.library.custom_op("flashtrain::attention_backward", mutates_args=())
def attention_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out: torch.Tensor, lse: torch.Tensor, seed: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
    window_left: int, window_right: int, dropout_p: float,
    block_mask: torch.Tensor | None, block_tables: list[torch.Tensor], block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dq, dk, dv), recomputing attention from lse (and the dropout mask from seed)."""
    packed = cu_seqlens_q is not None
    seed_value = int(seed.item())
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    if use_triton(q.device):
        from flashtrain.kernels.flash_bwd import flash_backward

        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        left, right = _kernel_window(window_left, window_right)
        flash_backward(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q=cu_seqlens_q,
                       cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                       max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale,
                       window_left=left, window_right=right, dropout_p=dropout_p,
                       seed=seed_value, tables=block_tables, block_size=block_size)
        return dq, dk, dv
    opts = dict(scale=softmax_scale, window=(window_left, window_right), dropout_p=dropout_p,
                block_mask=block_mask, block_size=block_size)
    if not packed:
        grads = torch_path.attention_backward(dout, q, k, v, out, lse, seed=seed_value, **opts)
        # Same strides as the fake impl (empty_like of each input).
        return tuple(torch.empty_like(x).copy_(g) for x, g in zip((q, k, v), grads))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i, rq, rk in _per_sequence(cu_seqlens_q, cu_seqlens_k):
        g = torch_path.attention_backward(dout[None, rq], q[None, rq], k[None, rk], v[None, rk],
                                          out[None, rq], lse[None, :, rq], seed=seed_value + i,
                                          **opts)
        dq[rq], dk[rk], dv[rk] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, window_left, window_right, dropout_p, block_mask, block_tables, block_size):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
# fmt: on


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, left, right, dropout_p, mask, tables, bs = inputs
    out, lse, seed = output
    ctx.save_for_backward(q, k, v, out, lse, seed, cu_q, cu_k, mask, *tables)
    ctx.params = (max_q, max_k, scale, left, right, dropout_p)
    ctx.block_size = bs
    ctx.mark_non_differentiable(lse, seed)


def _backward(ctx, dout, _dlse, _dseed):
    q, k, v, out, lse, seed, cu_q, cu_k, mask, *tables = ctx.saved_tensors
    dq, dk, dv = attention_backward(
        dout, q, k, v, out, lse, seed, cu_q, cu_k, *ctx.params, mask, tables, ctx.block_size
    )
    # No gradient for cu_seqlens .. block_mask (9 inputs), each table, or block_size.
    return (dq, dk, dv, *([None] * 9), [None] * len(tables), None)


attention_forward.register_autograd(_backward, setup_context=_setup_context)
