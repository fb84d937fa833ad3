"""FlashAttention-2 backward by recomputation: P is rebuilt tile by tile from Q, K and the saved
log-sum-exp; nothing of size seqlen_q x seqlen_k is ever stored.

deterministic=True, three launches: delta = rowsum(dO * O) (here); dK/dV with a key tile held
per program (flashtrain.kernels.flash_bwd_dkdv); dQ with a query tile held
(flashtrain.kernels.flash_bwd_dq). No atomics anywhere, so repeated runs are bitwise identical.
deterministic=False: delta, then dK/dV with dQ accumulated by fp32 atomics in the same pass (5
matmuls per tile instead of 7), then dQ = scale * accumulator in dq's dtype; the order of the
atomic adds varies, so dQ may differ in the last bits between runs.
Block-sparse launches stream only the blocks in the layout's tables (transposed for dK/dV).
"""

import torch
import triton
import triton.language as tl

from flashtrain.kernels.common import (
    dot_precision,
    heavy_first,
    load_rows,
    locate_program,
    seq_strides,
    tile_grid,
)
from flashtrain.kernels.dropout import seed_args
from flashtrain.kernels.flash_bwd_dkdv import flash_backward_dkdv_kernel
from flashtrain.kernels.flash_bwd_dq import flash_backward_dq_kernel
from flashtrain.kernels.hopper.route import ws_backward_blocker
from flashtrain.kernels.launch_args import call_shapes, score_args, sparse_args
from flashtrain.kernels.program import head_rows
from flashtrain.kernels.scratch import provide_scratch_allocator
from flashtrain.kernels.tma import reduces_through_descriptors, use_descriptors
from flashtrain.kernels.tuning import (
    atomic_dq_exact,
    builtin_config,
    config,
    launch_fitted,
    split_group,
)


@triton.jit
def flash_backward_preprocess(
    O, DO, DELTA, CU_SEQLENS_Q,
    stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh, stride_lb, stride_lh,
    seqlen_q_fixed, heads_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """delta = rowsum(dO * O) in float32, laid out like the lse."""
    pid_m, b, h, q_start, seqlen_q, _, _ = locate_program(
        CU_SEQLENS_Q, CU_SEQLENS_Q, seqlen_q_fixed, seqlen_q_fixed, heads_q, IS_VARLEN, False)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    offs_m = m0 + tl.arange(0, BLOCK_M)
    o_src = head_rows(O, (stride_ob, stride_om, stride_oh), b, q_start, h, seqlen_q,
                      HEAD_DIM, BLOCK_M, BLOCK_D, False)
    do_src = head_rows(DO, (stride_dob, stride_dom, stride_doh), b, q_start, h, seqlen_q,
                       HEAD_DIM, BLOCK_M, BLOCK_D, False)
    o = load_rows(o_src, m0, True, HEAD_DIM, BLOCK_M, BLOCK_D, False)
    do = load_rows(do_src, m0, True, HEAD_DIM, BLOCK_M, BLOCK_D, False)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start + offs_m, delta,
             mask=offs_m < seqlen_q)


def flash_backward(dout, q, k, v, out, lse, dq, dk, dv, *, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
                   dropout_p, seed, tables=None, block_size=0, softcap=0.0, alibi_slopes=None,
                   deterministic=True):
    """Launch the backward; shapes and arguments as flashtrain.kernels.flash_fwd.flash_forward
    (the same seed, softcap and alibi_slopes as the forward). Writes dq, dk, dv.
    deterministic: True = the atomics-free, bitwise repeatable path; False = dQ by fp32 atomics
    inside the dK/dV kernel (faster; extra memory: a float32 copy of dq) where that is exact on a
    GPU (tuning.atomic_dq_exact: head_dim <= 128; above, the dQ kernel runs either way)."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be a bool, got {deterministic!r}")
    shapes = call_shapes(q, k, lse, cu_seqlens_q, cu_seqlens_k, v, out, dout, dq, dk, dv)
    q4, k4, v4, o4, do4, dq4 = shapes.views(q, k, v, out, dout, dq)
    dk4, dv4 = shapes.views(dk, dv)
    is_varlen = shapes.is_varlen
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if is_varlen else (lse, lse)  # placeholders
    slopes, score_scalars, score_flags = score_args(softmax_scale, softcap, alibi_slopes, shapes,
                                                    q.device, lse)
    seed_ptr, seed_value, seed_in_memory = seed_args(seed, q.device, lse)
    dkdv_cfg = config("dkdv", shapes.head_dim, q.dtype, q.device, block_size)
    sparse = bool(tables)
    # the warp-specialized Gluon backward where the config asks for it and covers the call
    # (kernels/hopper/route.py); elsewhere the Triton kernels, with the built-in tiles
    warp_specialized = dkdv_cfg.gluon and ws_backward_blocker(
        dkdv_cfg, q4=q4, k4=k4, v4=v4, do4=do4, dk4=dk4, dv4=dv4, lse=lse, dropout_p=dropout_p,
        softcap=softcap, alibi_slopes=alibi_slopes, window_left=window_left,
        window_right=window_right, sparse=sparse, deterministic=deterministic) is None
    if dkdv_cfg.gluon and not warp_specialized:
        dkdv_cfg = builtin_config("dkdv", shapes.head_dim, q.dtype, q.device, block_size)
    kv_tables, kv_table_strides = sparse_args(tables[:4] if sparse else None, lse)
    q_tables, q_table_strides = sparse_args(tables[4:] if sparse else None, lse)
    block_d = dkdv_cfg.block_d

    delta = lse.new_empty(lse.shape)
    preprocess_rows = 64
    provide_scratch_allocator()  # in this thread: autograd's backward runs on its own
    preprocess_grid = tile_grid(triton.cdiv(max_seqlen_q, preprocess_rows), shapes.batch, shapes.heads_q, False)
    flash_backward_preprocess[preprocess_grid](
        o4, do4, delta, cu_q, *seq_strides(o4, is_varlen), *seq_strides(do4, is_varlen),
        *shapes.lse_strides, max_seqlen_q, shapes.heads_q,
        HEAD_DIM=shapes.head_dim, BLOCK_D=block_d, BLOCK_M=preprocess_rows, IS_VARLEN=is_varlen,
    )
    if warp_specialized:  # dK, dV and dS K (into a float32 accumulator) in one pass
        from flashtrain.kernels.hopper.flash_bwd_ws import flash_backward_ws

        dq_acc = torch.zeros(dq4.shape, dtype=torch.float32, device=q.device)  # (B, S, Hq, D)
        flash_backward_ws(
            q4, k4, v4, do4, lse, delta, dq_acc, dk4, dv4, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            softmax_scale=softmax_scale, window_right=window_right, heads_q=shapes.heads_q,
            heads_kv=shapes.heads_kv, batch=shapes.batch, lse_strides=shapes.lse_strides,
            block_m=dkdv_cfg.block_m, stages=dkdv_cfg.num_stages,
        )
        dq4.copy_(dq_acc.mul_(softmax_scale))
        return
    constexprs = dict(
        GROUP=shapes.heads_q // shapes.heads_kv, HEAD_DIM=shapes.head_dim, BLOCK_D=block_d,
        PRECISION=dot_precision(q.dtype), IS_VARLEN=is_varlen,
        SPARSE=sparse, SPARSE_BLOCK=block_size if sparse else 1,
        **score_flags, HAS_DROPOUT=dropout_p > 0.0, SEED_IN_MEMORY=seed_in_memory,
    )
    scalars = (window_left, window_right, softmax_scale, *score_scalars, dropout_p, seed_value)
    atomic_dq = not deterministic and atomic_dq_exact(block_d)
    # (B, S, Hq, D) float32, zeroed: rows no key reaches keep dQ = 0
    dq_acc = torch.zeros(dq4.shape, dtype=torch.float32, device=q.device) if atomic_dq else dq4

    # Grouped-query dK/dV per query head into float32 partials (B, Sk, Hq, D), summed per group
    # below, where the group loop would spill (tuning.split_group).
    split = shapes.heads_q != shapes.heads_kv and split_group(block_d, q.device)
    if split:
        dk_out = torch.empty((*dk4.shape[:2], shapes.heads_q, dk4.shape[3]), dtype=torch.float32,
                             device=q.device)  # fmt: skip
        dv_out = torch.empty_like(dk_out)
    else:
        dk_out, dv_out = dk4, dv4

    def launch_dkdv(cfg):
        heads = shapes.heads_q if split else shapes.heads_kv
        grid = tile_grid(triton.cdiv(max_seqlen_k, cfg.block_n), shapes.batch, heads, False)
        flash_backward_dkdv_kernel[grid](
            q4, k4, v4, do4, lse, delta, dk_out, dv_out, dq_acc, cu_q, cu_k, slopes, seed_ptr,
            *q_tables,
            *seq_strides(q4, is_varlen), *seq_strides(k4, is_varlen), *seq_strides(v4, is_varlen),
            *seq_strides(do4, is_varlen), *seq_strides(dk_out, is_varlen),
            *seq_strides(dv_out, is_varlen),
            *seq_strides(dq_acc, is_varlen), *shapes.lse_strides, *q_table_strides,
            max_seqlen_q, max_seqlen_k, shapes.heads_kv, *scalars,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ATOMIC_DQ=atomic_dq,
            TMA=use_descriptors(cfg, q.device, q4, k4, v4, do4, dk_out, dv_out),
            DQ_TMA=atomic_dq and reduces_through_descriptors(q.device, dq_acc),
            SPLIT_GROUP=split, **constexprs,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )

    launch_fitted("dkdv", dkdv_cfg, launch_dkdv)
    if split:  # the group's shares in a fixed order: deterministic
        dk4.copy_(dk_out.unflatten(2, (shapes.heads_kv, -1)).sum(3))
        dv4.copy_(dv_out.unflatten(2, (shapes.heads_kv, -1)).sum(3))
    if atomic_dq:  # the conversion: dQ = softmax_scale * (dS K), in dq's dtype
        dq4.copy_(dq_acc.mul_(softmax_scale))
        return
    heavy = heavy_first(window_left, window_right)

    def launch_dq(cfg):
        grid = tile_grid(triton.cdiv(max_seqlen_q, cfg.block_m), shapes.batch, shapes.heads_q, heavy)
        flash_backward_dq_kernel[grid](
            q4, k4, v4, do4, lse, delta, dq4, cu_q, cu_k, slopes, seed_ptr, *kv_tables,
            *seq_strides(q4, is_varlen), *seq_strides(k4, is_varlen), *seq_strides(v4, is_varlen),
            *seq_strides(do4, is_varlen), *seq_strides(dq4, is_varlen),
            *shapes.lse_strides, *kv_table_strides,
            max_seqlen_q, max_seqlen_k, shapes.heads_q, *scalars,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAVY_FIRST=heavy,
            TMA=use_descriptors(cfg, q.device, q4, k4, v4, do4, dq4), **constexprs,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )

    launch_fitted("dq", config("dq", shapes.head_dim, q.dtype, q.device, block_size), launch_dq)
