"""LM head + cross-entropy without the logits: z = hidden @ weight.T (+ bias) is only ever a tile.

Per counted token (label != ignore_index), with lse = logsumexp(z), eps = label_smoothing and
lam = z_loss:
    loss = lse - (1 - eps) * z[y] - eps / V * sum_j z[j] + lam * lse**2
    d loss / d z[j] = softmax(z)[j] * (1 + 2 * lam * lse) - (1 - eps) * [j == y] - eps / V
(torch's label smoothing; lam * lse**2 is PaLM's z-loss). Ignored tokens give 0 and no gradient;
a label outside [0, V) that is not ignore_index gives a NaN loss (a visible failure, no sync).

Forward: a program owns BLOCK_M token rows and streams the vocabulary tiles of one split past
them (each tile z = H_rows @ W_tile^T, a BLOCK_K loop over the hidden dim), keeping per row an
online log-sum-exp, the target logit, the logit sum (label smoothing) and, when asked, the first
argmax. Splits of the vocabulary keep the GPU busy when there are few token tiles; the combine
kernel merges their partials per row into the loss and the lse saved for the backward.

Backward: the logits are recomputed tile by tile from the saved lse, in two kernels, so that
every fp32 gradient row has exactly one writer and no atomics are needed (bitwise repeatable):
  grad_hidden: a program owns BLOCK_M token rows, streams vocabulary tiles, dH_rows += G @ W_tile;
  grad_weight: a program owns BLOCK_V vocabulary rows, streams token tiles, dW_rows += G^T @ H_tile
               (and grad_bias += column sums of G).
The owned rows (BLOCK x C, too many for registers) are read-modified-written in fp32 global
memory BLOCK_C columns at a time; they stay in L2. When the owned dimension has too few tiles to
fill the GPU the streamed one is split, each split writing its own fp32 partial, summed in a
fixed order by the launcher; the split depends only on the shapes and the device. Cost: the
logits are computed three times (forward, and once per backward kernel) against twice with
atomics (Cut Cross-Entropy), 5 products of N x V x C instead of 4, for determinism.
"""

import torch
import triton
import triton.language as tl

from flashtrain.kernels.common import dot_precision
from flashtrain.kernels.scratch import provide_scratch_allocator
from flashtrain.kernels.tuning import interpreted, xent_tiles

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # a jit global must be a constexpr


# Under TRITON_INTERPRET=1 (small tiles: flashtrain.kernels.tuning.xent_tiles) splits are made
# until there are this many programs: several splits and masked tails at test sizes.
INTERPRETER_PROGRAMS = 6


def _target_programs(device: torch.device) -> int:
    """Enough programs for two per SM (device properties are cached: no sync)."""
    if interpreted() or device.type != "cuda":
        return INTERPRETER_PROGRAMS
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def _split(owned_tiles: int, streamed_tiles: int, target: int) -> tuple[int, int]:
    """(splits, streamed tiles per split) so that owned_tiles * splits reaches `target`."""
    want = max(1, min(streamed_tiles, triton.cdiv(target, owned_tiles)))
    per_split = triton.cdiv(streamed_tiles, want)
    return triton.cdiv(streamed_tiles, per_split), per_split


# ---- device helpers ------------------------------------------------------------------------


@triton.jit
def _split_range(split, tiles_per_split, total, BLOCK: tl.constexpr):
    lo = split * tiles_per_split * BLOCK
    return lo, tl.minimum(total, lo + tiles_per_split * BLOCK)


@triton.jit
def _rows_dot(A, B, rows_a, rows_b, stride_a, stride_b, K,
              PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
              BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr):
    """A[rows_a, :] @ B[rows_b, :]^T in fp32, (BLOCK_A, BLOCK_B); rows have unit stride along K.

    rows_a, rows_b must be in range: callers clamp a tail tile's indices to the last row and
    discard those results, which keeps per-element masks (registers) off the operand loads.
    """
    acc = tl.zeros([BLOCK_A, BLOCK_B], dtype=tl.float32)
    a_rows = A + rows_a.to(tl.int64)[:, None] * stride_a
    b_cols = B + rows_b.to(tl.int64)[None, :] * stride_b
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            a = tl.load(a_rows + offs_k[None, :])  # (BLOCK_A, BLOCK_K)
            b = tl.load(b_cols + offs_k[:, None])  # (BLOCK_K, BLOCK_B)
        else:
            a = tl.load(a_rows + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
            b = tl.load(b_cols + offs_k[:, None], mask=offs_k[:, None] < K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _add_product(OUT_ROWS, g, SRC, rows_src, stride_src, C,
                 PRECISION: tl.constexpr, EVEN_C: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT[rows, :] += g @ SRC[rows_src, :] in fp32, BLOCK_C columns at a time.

    OUT_ROWS (R, 1) points at the owned fp32 rows of a buffer padded to whole tiles (no masks);
    rows_src are in range (clamped, with g 0 there); g (R, S) fp32 goes into the product in
    SRC's dtype, as the logits' operands did.
    """
    g = g.to(SRC.dtype.element_ty)
    src_rows = SRC + rows_src.to(tl.int64)[:, None] * stride_src
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        if EVEN_C:
            src = tl.load(src_rows + offs_c[None, :])  # (S, BLOCK_C)
        else:
            src = tl.load(src_rows + offs_c[None, :], mask=offs_c[None, :] < C, other=0.0)
        out = OUT_ROWS + offs_c[None, :]
        tl.store(out, tl.dot(g, src, tl.load(out), input_precision=PRECISION))
    # The next tile reads these rows back, possibly through other threads of the program.
    tl.debug_barrier()


@triton.jit
def _logit_grads(z, lse, gscale, y, cols, col_ok, label_smoothing, z_loss, inv_vocab,
                 SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr):
    """gscale * d loss / d z for a tile. The per-token arguments (lse, gscale, y) and the
    per-column ones (cols, col_ok) come broadcast against z, so one helper serves the
    (tokens, vocab) tiles of the grad_hidden kernel and the (vocab, tokens) tiles of grad_weight."""
    g = tl.where(col_ok, tl.math.exp2((z - lse) * LOG2E), 0.0)
    if Z_LOSS:
        g = g * (1.0 + 2.0 * z_loss * lse)
    g = g - tl.where(cols == y, 1.0 - label_smoothing, 0.0)
    if SMOOTHING:
        g = g - tl.where(col_ok, label_smoothing * inv_vocab, 0.0)
    return g * gscale


@triton.jit
def _token_rows(Y, LSE, GRAD_LOSS, offs_m, rows, stride_y, stride_g, N, ignore_index):
    """Per token row: label, lse and the incoming gradient, 0 for ignored rows and for the tail
    rows past N. Those read the clamped row's label and lse (`rows`), so that their recomputed
    softmax stays finite and times 0 gives 0, never NaN."""
    y = tl.load(Y + rows * stride_y)
    lse = tl.load(LSE + rows)
    grad = tl.load(GRAD_LOSS + rows * stride_g)
    return y, lse, tl.where((offs_m < N) & (y != ignore_index), grad, 0.0)


# ---- kernels ---------------------------------------------------------------------------------


@triton.jit
def xent_forward_kernel(
    H, W, BIAS, Y, PART, ARG_PART,
    N, V, C, stride_h, stride_w, stride_y, tiles_per_split,
    HAS_BIAS: tl.constexpr, SMOOTHING: tl.constexpr, ARGMAX: tl.constexpr,
    PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Partials of one vocabulary split for BLOCK_M rows: PART (4, splits, N) fp32 holds the
    max logit, sum of exp(z - max), target logit and logit sum; ARG_PART (splits, N) int32 the
    first argmax."""
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < N
    rows = tl.minimum(offs_m, N - 1)  # the tail tile repeats the last row; its results are dropped
    y = tl.load(Y + offs_m * stride_y, mask=row_ok, other=-1)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    z_target = tl.zeros([BLOCK_M], dtype=tl.float32)
    z_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    arg = tl.zeros([BLOCK_M], dtype=tl.int32)
    v_lo, v_hi = _split_range(split, tiles_per_split, V, BLOCK_V)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        z = _rows_dot(H, W, rows, tl.minimum(cols, V - 1), stride_h, stride_w, C,
                      PRECISION, EVEN_K, BLOCK_M, BLOCK_V, BLOCK_K)  # (BLOCK_M, BLOCK_V)
        if HAS_BIAS:
            z += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        z = tl.where(col_ok[None, :], z, float("-inf"))
        tile_max = tl.max(z, 1)
        if ARGMAX:  # strictly greater: ties keep the earlier column, as torch.argmax does
            arg = tl.where(tile_max > m_i, tl.argmax(z, 1) + v0, arg)
        m_new = tl.maximum(m_i, tile_max)
        p = tl.math.exp2((z - m_new[:, None]) * LOG2E)
        l_i = l_i * tl.math.exp2((m_i - m_new) * LOG2E) + tl.sum(p, 1)
        m_i = m_new
        z_target += tl.sum(tl.where(cols[None, :] == y[:, None], z, 0.0), 1)
        if SMOOTHING:
            z_sum += tl.sum(tl.where(col_ok[None, :], z, 0.0), 1)
    plane = tl.num_programs(1) * N
    at = split * N + offs_m
    tl.store(PART + at, m_i, mask=row_ok)
    tl.store(PART + plane + at, l_i, mask=row_ok)
    tl.store(PART + 2 * plane + at, z_target, mask=row_ok)
    if SMOOTHING:
        tl.store(PART + 3 * plane + at, z_sum, mask=row_ok)
    if ARGMAX:
        tl.store(ARG_PART + at, arg, mask=row_ok)


@triton.jit
def xent_combine_kernel(
    PART, ARG_PART, Y, LOSS, LSE, ARGMAX_OUT,
    N, V, num_splits, stride_y, ignore_index, label_smoothing, z_loss,
    SMOOTHING: tl.constexpr, ARGMAX: tl.constexpr, BLOCK: tl.constexpr,
):
    """Merge the splits' partials per row into loss (N,), lse (N,) and argmax (N,) int64."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    plane = num_splits * N
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(PART + s * N + offs, mask=ok, other=0.0))
    l_sum = tl.zeros([BLOCK], dtype=tl.float32)
    z_target = tl.zeros([BLOCK], dtype=tl.float32)
    z_sum = tl.zeros([BLOCK], dtype=tl.float32)
    arg = tl.zeros([BLOCK], dtype=tl.int32)
    found = tl.zeros([BLOCK], dtype=tl.int32)
    for s in range(num_splits):
        at = s * N + offs
        m_s = tl.load(PART + at, mask=ok, other=0.0)
        # padding rows read l = 1 so that log(l_sum) stays finite there
        l_sum += tl.load(PART + plane + at, mask=ok, other=1.0) * tl.math.exp2((m_s - m) * LOG2E)
        z_target += tl.load(PART + 2 * plane + at, mask=ok, other=0.0)
        if SMOOTHING:
            z_sum += tl.load(PART + 3 * plane + at, mask=ok, other=0.0)
        if ARGMAX:  # the first split holding the maximum, as torch.argmax picks the first
            first = (m_s == m) & (found == 0)
            arg = tl.where(first, tl.load(ARG_PART + at, mask=ok, other=0), arg)
            found = tl.where(first, 1, found)
    lse = m + tl.log(l_sum)
    y = tl.load(Y + offs * stride_y, mask=ok, other=ignore_index)
    loss = lse - (1.0 - label_smoothing) * z_target + z_loss * lse * lse
    if SMOOTHING:
        loss -= label_smoothing / V * z_sum
    counted = y != ignore_index
    loss = tl.where(counted, loss, 0.0)
    loss = tl.where(counted & ((y < 0) | (y >= V)), float("nan"), loss)
    tl.store(LOSS + offs, loss, mask=ok)
    tl.store(LSE + offs, lse, mask=ok)
    if ARGMAX:
        tl.store(ARGMAX_OUT + offs, arg.to(tl.int64), mask=ok)


@triton.jit
def xent_grad_hidden_kernel(
    H, W, BIAS, Y, LSE, GRAD_LOSS, DH,
    N, V, C, stride_h, stride_w, stride_y, stride_g, stride_split, stride_row, tiles_per_split,
    ignore_index, label_smoothing, z_loss, inv_vocab,
    HAS_BIAS: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr,
    PRECISION: tl.constexpr, EVEN_K: tl.constexpr, EVEN_C: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """DH (splits, N padded to BLOCK_M, C padded to BLOCK_C) fp32, zeroed: split s gets the sum
    over its vocabulary tiles of G @ W."""
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.minimum(offs_m, N - 1)
    y, lse, gscale = _token_rows(Y, LSE, GRAD_LOSS, offs_m, rows, stride_y, stride_g, N, ignore_index)
    dh_rows = DH + split.to(tl.int64) * stride_split + offs_m.to(tl.int64)[:, None] * stride_row
    v_lo, v_hi = _split_range(split, tiles_per_split, V, BLOCK_V)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        cols_in = tl.minimum(cols, V - 1)
        z = _rows_dot(H, W, rows, cols_in, stride_h, stride_w, C,
                      PRECISION, EVEN_K, BLOCK_M, BLOCK_V, BLOCK_K)  # (BLOCK_M, BLOCK_V)
        if HAS_BIAS:
            z += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        g = _logit_grads(z, lse[:, None], gscale[:, None], y[:, None], cols[None, :],
                         col_ok[None, :], label_smoothing, z_loss, inv_vocab, SMOOTHING, Z_LOSS)
        _add_product(dh_rows, g, W, cols_in, stride_w, C, PRECISION, EVEN_C, BLOCK_C)


@triton.jit
def xent_grad_weight_kernel(
    H, W, BIAS, Y, LSE, GRAD_LOSS, DW, DB,
    N, V, C, stride_h, stride_w, stride_y, stride_g, stride_split, stride_row, tiles_per_split,
    ignore_index, label_smoothing, z_loss, inv_vocab,
    HAS_BIAS: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr,
    PRECISION: tl.constexpr, EVEN_K: tl.constexpr, EVEN_C: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """DW (splits, V padded to BLOCK_V, C padded to BLOCK_C) fp32, zeroed: split s gets the sum
    over its token tiles of G^T @ H; DB (splits, V) fp32 the column sums of G (when HAS_BIAS)."""
    pid_v = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < V
    cols_in = tl.minimum(cols, V - 1)
    dw_rows = DW + split.to(tl.int64) * stride_split + cols.to(tl.int64)[:, None] * stride_row
    if HAS_BIAS:
        bias = tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)
    db = tl.zeros([BLOCK_V], dtype=tl.float32)
    m_lo, m_hi = _split_range(split, tiles_per_split, N, BLOCK_M)
    for m0 in range(m_lo, m_hi, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        rows = tl.minimum(offs_m, N - 1)
        y, lse, gscale = _token_rows(Y, LSE, GRAD_LOSS, offs_m, rows, stride_y, stride_g, N,
                                     ignore_index)
        zt = _rows_dot(W, H, cols_in, rows, stride_w, stride_h, C,
                       PRECISION, EVEN_K, BLOCK_V, BLOCK_M, BLOCK_K)  # (BLOCK_V, BLOCK_M)
        if HAS_BIAS:
            zt += bias[:, None]
        gt = _logit_grads(zt, lse[None, :], gscale[None, :], y[None, :], cols[:, None],
                          col_ok[:, None], label_smoothing, z_loss, inv_vocab, SMOOTHING, Z_LOSS)
        if HAS_BIAS:
            db += tl.sum(gt, 1)
        _add_product(dw_rows, gt, H, rows, stride_h, C, PRECISION, EVEN_C, BLOCK_C)
    if HAS_BIAS:
        tl.store(DB + split * V + cols, db, mask=col_ok)


# ---- launchers -------------------------------------------------------------------------------


def _common(hidden, weight, bias, targets):
    """Kernel arguments shared by every launch; bias is passed as a placeholder when absent."""
    if hidden.dtype != weight.dtype or hidden.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("hidden and weight must share a dtype and have unit stride along C")
    return dict(
        bias=bias if bias is not None else weight,
        n=hidden.shape[0], v=weight.shape[0], c=hidden.shape[1],
        strides=(hidden.stride(0), weight.stride(0), targets.stride(0)),
        precision=dot_precision(hidden.dtype),
    )


def xent_forward(hidden, weight, bias, targets, loss, lse, argmax, *, ignore_index,
                 label_smoothing, z_loss):
    """hidden (N, C) and weight (V, C) of one dtype (the products' inputs, fp32 accumulation)
    with unit stride along C, bias (V,) or None, targets (N,) integer. Writes loss (N,) fp32,
    lse (N,) fp32 and, when argmax is not None, the first argmax (N,) int64 of each row."""
    a = _common(hidden, weight, bias, targets)
    n, v, c = a["n"], a["v"], a["c"]
    if n == 0:
        return
    cfg = xent_tiles("forward", hidden.dtype, hidden.device)
    token_tiles = triton.cdiv(n, cfg.block_m)
    splits, per_split = _split(token_tiles, triton.cdiv(v, cfg.block_v), _target_programs(hidden.device))
    part = torch.empty((4, splits, n), dtype=torch.float32, device=hidden.device)
    arg_part = torch.empty((splits, n) if argmax is not None else (1,), dtype=torch.int32,
                           device=hidden.device)
    smoothing, with_argmax = label_smoothing > 0.0, argmax is not None
    provide_scratch_allocator()  # in this thread: autograd's backward runs on its own
    xent_forward_kernel[(token_tiles, splits)](
        hidden, weight, a["bias"], targets, part, arg_part, n, v, c, *a["strides"], per_split,
        HAS_BIAS=bias is not None, SMOOTHING=smoothing, ARGMAX=with_argmax,
        PRECISION=a["precision"], EVEN_K=c % cfg.block_k == 0, BLOCK_M=cfg.block_m,
        BLOCK_V=cfg.block_v, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    block = 16 if interpreted() else 256
    xent_combine_kernel[(triton.cdiv(n, block),)](
        part, arg_part, targets, loss, lse, argmax if with_argmax else lse,
        n, v, splits, targets.stride(0), ignore_index, label_smoothing, z_loss,
        SMOOTHING=smoothing, ARGMAX=with_argmax, BLOCK=block, num_warps=4,
    )


def _padded_zeros(splits, rows, c, block_c, device):
    """fp32 partial buffer (splits, rows, C padded to block_c): whole tiles, no masks."""
    return torch.zeros((splits, rows, triton.cdiv(c, block_c) * block_c), dtype=torch.float32,
                       device=device)


def _sum_splits(part, rows, c):
    """The splits summed in a fixed order, padding dropped: (rows, c) contiguous fp32."""
    total = part[0] if part.shape[0] == 1 else part.sum(0)
    return total[:rows, :c].contiguous()


def _launch_backward(kernel, cfg, grid, per_split, args, outputs, a, flags):
    n, v, c = a["n"], a["v"], a["c"]
    part = outputs[0]
    provide_scratch_allocator()  # in this thread: autograd's backward runs on its own
    kernel[grid](
        *args, *outputs, n, v, c, *a["strides"], args[-1].stride(0), part.stride(0),
        part.stride(1), per_split, *flags["scalars"],
        HAS_BIAS=flags["has_bias"], SMOOTHING=flags["smoothing"], Z_LOSS=flags["z_loss"],
        PRECISION=a["precision"], EVEN_K=c % cfg.block_k == 0, EVEN_C=c % cfg.block_c == 0,
        BLOCK_M=cfg.block_m, BLOCK_V=cfg.block_v, BLOCK_K=cfg.block_k, BLOCK_C=cfg.block_c,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def xent_backward(grad_loss, hidden, weight, bias, targets, lse, *, ignore_index,
                  label_smoothing, z_loss, grad_hidden: bool, grad_weight: bool):
    """Gradients of sum_i grad_loss[i] * loss[i] in fp32: (dH (N, C) or None, dW (V, C) or None,
    dbias (V,) or None; dbias comes with grad_weight when there is a bias). Inputs as for
    xent_forward; grad_loss (N,) fp32 may have any stride (0 for the gradient of a sum)."""
    a = _common(hidden, weight, bias, targets)
    n, v, c = a["n"], a["v"], a["c"]
    device, target = hidden.device, _target_programs(hidden.device)
    args = (hidden, weight, a["bias"], targets, lse, grad_loss)
    flags = dict(has_bias=bias is not None, smoothing=label_smoothing > 0.0, z_loss=z_loss > 0.0,
                 scalars=(ignore_index, label_smoothing, z_loss, 1.0 / v))
    dh = dw = db = None
    if grad_hidden:
        cfg = xent_tiles("grad_hidden", hidden.dtype, device)
        token_tiles = max(1, triton.cdiv(n, cfg.block_m))
        splits, per_split = _split(token_tiles, triton.cdiv(v, cfg.block_v), target)
        part = _padded_zeros(splits, token_tiles * cfg.block_m, c, cfg.block_c, device)
        if n > 0:
            _launch_backward(xent_grad_hidden_kernel, cfg, (token_tiles, splits), per_split, args,
                             (part,), a, flags)
        dh = _sum_splits(part, n, c)
    if grad_weight:
        cfg = xent_tiles("grad_weight", hidden.dtype, device)
        vocab_tiles = triton.cdiv(v, cfg.block_v)
        splits, per_split = _split(vocab_tiles, max(1, triton.cdiv(n, cfg.block_m)), target)
        part = _padded_zeros(splits, vocab_tiles * cfg.block_v, c, cfg.block_c, device)
        part_b = torch.zeros((splits, v) if bias is not None else (1,), dtype=torch.float32,
                             device=device)
        if n > 0:
            _launch_backward(xent_grad_weight_kernel, cfg, (vocab_tiles, splits), per_split, args,
                             (part, part_b), a, flags)
        dw = _sum_splits(part, v, c)
        if bias is not None:
            db = part_b[0] if splits == 1 else part_b.sum(0)
    return dh, dw, db
