"""Correctness of the attention ops at real sizes, for the GPU suite: output and every gradient
against float32 math, with the project's tolerance rule (error at most 2x that of the same math
done in PyTorch in the input's precision, plus a small floor), and dropout's keep rate."""

from __future__ import annotations

import contextlib
import math
import zlib
from dataclasses import dataclass

import torch

from flashtrain.attention import (
    blocksparse_attn_func,
    flash_attn_func,
    flash_attn_varlen_func,
    sparsity,
)
from flashtrain.attention.reference import attention_reference, expand_block_mask
from flashtrain.kernels import tuning

FLOOR = 1e-3  # absolute slack: errors of both sides can be ~0 at some elements


@dataclass(frozen=True)
class Case:
    name: str
    dtype: torch.dtype
    head_dim: int
    causal: bool = False
    kind: str = "dense"  # dense | gqa | window | varlen | blocksparse
    batch: int = 2
    seqlen: int = 1024
    heads: int = 4
    loads: str = "table"  # table (the config's choice) | descriptor | pointer
    deterministic: bool = False  # True: the two-kernel backward (no atomics)


def cases(dry_run: bool) -> list[Case]:
    """fp16 and bf16 (fp32 and fp16 on CPU), hd 64/128/256, causal and not, and each feature."""
    dtypes = (torch.float32, torch.float16) if dry_run else (torch.float16, torch.bfloat16)
    size = {"batch": 1, "seqlen": 48, "heads": 2} if dry_run else {}
    head_dims = (16, 32) if dry_run else (64, 128, 256)
    out = [
        Case(f"{str(dt)[6:]} hd{d} {'causal' if c else 'full'}", dt, d, c, **size)
        for dt in dtypes
        for d in head_dims
        for c in (False, True)
    ]
    for kind in ("gqa", "window", "varlen", "blocksparse"):
        for dt in dtypes:
            sized = dict(size, seqlen=200) if dry_run and kind == "blocksparse" else size
            out.append(Case(f"{str(dt)[6:]} {kind}", dt, head_dims[-2], True, kind, **sized))
    # Both load paths whatever the table chose (descriptors only where the GPU has them), and
    # the deterministic backward, on the last dtype (bf16 on a GPU)
    dt, d = dtypes[-1], head_dims[-2]
    for loads in ("descriptor", "pointer"):
        for kind in ("dense", "gqa", "varlen", "blocksparse"):
            sized = dict(size, seqlen=200) if dry_run and kind == "blocksparse" else size
            out.append(Case(f"{str(dt)[6:]} {kind} {loads} loads", dt, d, True, kind, loads=loads,
                            **sized))  # fmt: skip
        out.append(Case(f"{str(dt)[6:]} hd{head_dims[0]} full {loads} loads", dt, head_dims[0],
                        False, loads=loads, **size))  # fmt: skip
    for kind in ("dense", "varlen"):
        out.append(Case(f"{str(dt)[6:]} {kind} deterministic", dt, d, True, kind,
                        deterministic=True, **size))  # fmt: skip
    return out


def _forward(case: Case, q, k, v):
    """(out of our op, the float32 reference's element mask or None, kwargs for the reference)."""
    if case.kind == "window":
        window = (case.seqlen // 8, 0)
        return (
            flash_attn_func(q, k, v, causal=True, window_size=window),
            None,
            {"window_size": window},
        )
    if case.kind == "blocksparse":
        block = 64 if case.seqlen < 1024 else 128  # the layouts' allowed block sizes
        layout = sparsity.PATTERNS["local"](case.seqlen, block_size=block, window_blocks=1)
        mask = expand_block_mask(layout.block_mask, block, case.seqlen, case.seqlen)
        out = blocksparse_attn_func(q, k, v, layout, causal=case.causal,
                                    deterministic=case.deterministic)  # fmt: skip
        return out, mask[None] if mask.dim() == 3 else mask, {}
    return flash_attn_func(q, k, v, causal=case.causal, deterministic=case.deterministic), None, {}


def _varlen(case: Case, q, k, v):
    """Packed sequences of unequal lengths: our varlen op vs the reference per sequence."""
    total = case.batch * case.seqlen
    cuts = sorted({0, total, total // 3, total // 3 + 1, (2 * total) // 3})
    cu = torch.tensor(cuts, dtype=torch.int32, device=q.device)
    lens = [b - a for a, b in zip(cuts, cuts[1:])]
    flat = [t.reshape(total, *t.shape[2:]) for t in (q, k, v)]
    out = flash_attn_varlen_func(*flat, cu, cu, max(lens), max(lens), causal=case.causal,
                                 deterministic=case.deterministic)  # fmt: skip
    return out.reshape(q.shape), cuts


def _reference(case: Case, q, k, v, mask, kwargs, upcast: bool, cuts=None):
    if cuts is None:
        return attention_reference(
            q, k, v, causal=case.causal, element_mask=mask, upcast=upcast, **kwargs
        )[0]
    flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    pieces = [
        attention_reference(*(t[a:b][None] for t in flat), causal=case.causal, upcast=upcast)[0][0]
        for a, b in zip(cuts, cuts[1:])
    ]
    return torch.cat(pieces).reshape(q.shape)


def check_case(case: Case, device) -> dict:
    """Output and dq/dk/dv errors of ours and of low-precision PyTorch, both vs float32 math."""
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.name.encode()))
    kv_heads = case.heads // 2 if case.kind == "gqa" else case.heads
    shape_q = (case.batch, case.seqlen, case.heads, case.head_dim)
    shape_kv = (case.batch, case.seqlen, kv_heads, case.head_dim)
    q, k, v = (
        torch.randn(s, generator=gen, device=device, dtype=case.dtype).requires_grad_()
        for s in (shape_q, shape_kv, shape_kv)
    )
    cuts = None
    loads = (
        contextlib.nullcontext()
        if case.loads == "table"
        else tuning.forced_tma(case.loads == "descriptor")
    )
    with loads:
        if case.kind == "varlen":
            out, cuts = _varlen(case, q, k, v)
            mask, kwargs = None, {}
        else:
            out, mask, kwargs = _forward(case, q, k, v)
        dout = torch.randn(out.shape, generator=gen, device=device, dtype=case.dtype)
        ours = [out, *torch.autograd.grad(out, (q, k, v), dout)]
    results = {}
    for upcast in (True, False):
        ref_out = _reference(case, q, k, v, mask, kwargs, upcast, cuts)
        grads = torch.autograd.grad(ref_out, (q, k, v), dout)
        results[upcast] = [ref_out, *grads]
    row = {
        "case": case.name,
        "kind": case.kind,
        "dtype": str(case.dtype),
        "head_dim": case.head_dim,
    }
    row["causal"] = case.causal
    row["loads"] = case.loads
    row["deterministic"] = case.deterministic
    ok = True
    for name, mine, exact, lowp in zip(
        ("out", "dq", "dk", "dv"), ours, results[True], results[False]
    ):
        err = (mine.float() - exact.float()).abs().max().item()
        base = (lowp.float() - exact.float()).abs().max().item()
        row[f"{name}_err"], row[f"{name}_torch_err"] = err, base
        ok &= err <= 2 * base + FLOOR and math.isfinite(err)
    row["passed"] = bool(ok)
    return row


def dropout_keep_rate(device, dtype, *, dry_run: bool, p: float = 0.17) -> dict:
    """q = k = 0 gives uniform attention and v = 1 makes each output the kept fraction of its
    row / (1 - p): the mean keep rate over all rows must be 1 - p within 6 standard errors."""
    batch, seqlen, heads, head_dim = (1, 64, 2, 16) if dry_run else (2, 2048, 8, 64)
    q = torch.zeros(batch, seqlen, heads, head_dim, device=device, dtype=dtype)
    v = torch.ones_like(q)
    torch.manual_seed(1234)
    out = flash_attn_func(q, q, v, dropout_p=p)
    kept = out.float()[..., 0].mean().item() * (1 - p)
    rows = batch * seqlen * heads
    stderr = math.sqrt(p * (1 - p) / (rows * seqlen))
    return {
        "case": f"dropout p={p} {str(dtype)[6:]}",
        "kind": "dropout",
        "keep_rate": kept,
        "expected": 1 - p,
        "z": (kept - (1 - p)) / stderr,
        "passed": abs(kept - (1 - p)) <= 6 * stderr + 1e-3,
    }
