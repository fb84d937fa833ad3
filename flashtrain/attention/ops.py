"""The attention custom ops: one forward and one backward, registered with torch.library so
torch.compile treats them as opaque nodes (no graph break), tied together by register_autograd.

Both run the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1) or the PyTorch path, with
identical semantics. Packed (varlen) inputs are (total, H, D) with cu_seqlens; dense inputs
(B, S, H, D) with cu_seqlens None. Block-sparse calls pass the bool block_mask (Hm, nq, nk)
for the PyTorch path (None on CUDA, where only the kernels run) and the layout's compiled
tables (BlockTables.as_list()) for the kernels; other calls pass None, [], 0.

Nothing here synchronises with a CUDA device: the dropout seed is drawn on the device and stays
there, and every returned tensor lives on q's device (so CUDA graphs can capture a call).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashtrain.attention import torch_path, torch_varlen
from flashtrain.attention.route import route_for


class AttentionArgs(NamedTuple):
    """The forward op's inputs by name, in the op's positional order. Built by keyword in api.py;
    the backward op takes (dout, out, lse, seed, *AttentionArgs)."""

    q: torch.Tensor  # (B, Sq, Hq, D), or (total_q, Hq, D) packed
    k: torch.Tensor  # (B, Sk, Hkv, D), or (total_k, Hkv, D) packed
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor | None  # int32 (B + 1,) when packed
    cu_seqlens_k: torch.Tensor | None
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float
    window_left: int  # -1 = unbounded; causal and sides >= seqlen_k already folded in
    window_right: int
    dropout_p: float
    softcap: float  # 0 = off
    alibi_slopes: torch.Tensor | None  # float32 (B, Hq), contiguous
    deterministic: bool  # the backward must be bitwise repeatable
    block_mask: torch.Tensor | None  # bool (Hm, nq, nk), PyTorch path only
    block_tables: list[torch.Tensor]  # BlockTables.as_list(), kernels only
    block_size: int

    @property
    def packed(self) -> bool:
        return self.cu_seqlens_q is not None


# Inputs that are tensors (or None): saved for the backward with save_for_backward.
_TENSOR_FIELDS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "alibi_slopes", "block_mask")


def _draw_seed(device: torch.device, dropout_p: float) -> torch.Tensor:
    """int64 (1,) on `device`: a fresh dropout seed from the device's default generator (so
    manual_seed replays it), drawn without a host sync; 0 without dropout."""
    if dropout_p == 0.0:
        return torch.zeros(1, dtype=torch.int64, device=device)
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def _lse_shape(q: torch.Tensor, packed: bool) -> tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])


def torch_options(args: AttentionArgs) -> torch_path.AttentionOptions:
    """The PyTorch path's view of a call."""
    return torch_path.AttentionOptions(
        scale=args.softmax_scale,
        window=(args.window_left, args.window_right),
        softcap=args.softcap,
        alibi_slopes=args.alibi_slopes,
        dropout_p=args.dropout_p,
        block_mask=args.block_mask,
        block_size=args.block_size,
    )


def _launch_arguments(args: AttentionArgs, seed: torch.Tensor, *, backward: bool) -> dict:
    """Keyword arguments of flash_forward / flash_backward (flashtrain.kernels)."""
    from flashtrain.kernels.common import UNBOUNDED

    kwargs = dict(
        cu_seqlens_q=args.cu_seqlens_q,
        cu_seqlens_k=args.cu_seqlens_k,
        max_seqlen_q=args.max_seqlen_q,
        max_seqlen_k=args.max_seqlen_k,
        softmax_scale=args.softmax_scale,
        window_left=UNBOUNDED if args.window_left < 0 else args.window_left,
        window_right=UNBOUNDED if args.window_right < 0 else args.window_right,
        dropout_p=args.dropout_p,
        seed=seed,
        tables=args.block_tables,
        block_size=args.block_size,
        softcap=args.softcap,
        alibi_slopes=args.alibi_slopes,
    )
    if backward:
        kwargs["deterministic"] = args.deterministic
    return kwargs


def _forward(args: AttentionArgs):
    q = args.q
    seed = _draw_seed(q.device, args.dropout_p)
    out = torch.empty_like(q)
    lse = torch.empty(_lse_shape(q, args.packed), dtype=torch.float32, device=q.device)
    if route_for(q) == "triton":
        from flashtrain.kernels.flash_fwd import flash_forward

        flash_forward(q, args.k, args.v, out, lse, **_launch_arguments(args, seed, backward=False))
    elif args.packed:
        torch_varlen.attention_forward(
            q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, torch_options(args),
            int(seed), out, lse,
        )  # fmt: skip
    else:
        # Copy into the buffers the fake impl promises: compiled graphs assert their strides.
        o, lse_dense = torch_path.attention_forward(
            q, args.k, args.v, torch_options(args), int(seed)
        )
        out.copy_(o)
        lse.copy_(lse_dense)
    return out, lse, seed


def _backward(dout, out, lse, seed, args: AttentionArgs):
    q, k, v = args.q, args.k, args.v
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    if route_for(q) == "triton":
        from flashtrain.kernels.flash_bwd import flash_backward

        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        flash_backward(
            dout, q, k, v, out, lse, dq, dk, dv, **_launch_arguments(args, seed, backward=True)
        )
        return dq, dk, dv
    if args.packed:
        return torch_varlen.attention_backward(
            dout, q, k, v, out, lse, args.cu_seqlens_q, args.cu_seqlens_k, torch_options(args),
            int(seed),
        )  # fmt: skip
    grads = torch_path.attention_backward(dout, q, k, v, out, lse, torch_options(args), int(seed))
    # Same strides as the fake impl (empty_like of each input).
    return tuple(torch.empty_like(x).copy_(g) for x, g in zip((q, k, v), grads))


# fmt: off
@torch.library.custom_op("flashtrain::attention_forward", mutates_args=())
def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
    window_left: int, window_right: int, dropout_p: float, softcap: float,
    alibi_slopes: torch.Tensor | None, deterministic: bool,
    block_mask: torch.Tensor | None, block_tables: list[torch.Tensor], block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (out like q, lse float32 (B, H, Sq) or (H, total_q), seed int64 (1,) on q's device)."""
    return _forward(AttentionArgs(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        window_left, window_right, dropout_p, softcap, alibi_slopes, deterministic,
        block_mask, block_tables, block_size,
    ))


@attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, *_):
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return torch.empty_like(q), lse, q.new_empty(1, dtype=torch.int64)


@torch.library.custom_op("flashtrain::attention_backward", mutates_args=())
def attention_backward(
    dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, seed: torch.Tensor,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
    window_left: int, window_right: int, dropout_p: float, softcap: float,
    alibi_slopes: torch.Tensor | None, deterministic: bool,
    block_mask: torch.Tensor | None, block_tables: list[torch.Tensor], block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dq, dk, dv), recomputing attention from lse (and the dropout mask from seed)."""
    return _backward(dout, out, lse, seed, AttentionArgs(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        window_left, window_right, dropout_p, softcap, alibi_slopes, deterministic,
        block_mask, block_tables, block_size,
    ))


@attention_backward.register_fake
def _(dout, out, lse, seed, q, k, v, *_):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
# fmt: on


def _setup_context(ctx, inputs, output):
    args = AttentionArgs(*inputs)
    out, lse, seed = output
    tensors = [getattr(args, name) for name in _TENSOR_FIELDS]
    ctx.save_for_backward(out, lse, seed, *tensors, *args.block_tables)
    ctx.args = args._replace(**dict.fromkeys(_TENSOR_FIELDS), block_tables=[])
    ctx.mark_non_differentiable(lse, seed)


def _autograd_backward(ctx, dout, _dlse, _dseed):
    out, lse, seed, *saved = ctx.saved_tensors
    count = len(_TENSOR_FIELDS)
    tensors, tables = saved[:count], list(saved[count:])
    args = ctx.args._replace(**dict(zip(_TENSOR_FIELDS, tensors)), block_tables=tables)
    dq, dk, dv = attention_backward(dout, out, lse, seed, *args)
    # Gradients only for q, k, v; None for every other input (and for each block table).
    none = AttentionArgs(*[None] * len(AttentionArgs._fields))
    return tuple(none._replace(q=dq, k=dk, v=dv, block_tables=[None] * len(tables)))


attention_forward.register_autograd(_autograd_backward, setup_context=_setup_context)
