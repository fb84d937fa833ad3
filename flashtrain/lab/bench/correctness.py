"""Correctness of the attention ops at real sizes, for the GPU suite: output and every gradient
against float32 math, with the project's tolerance rule (error at most 2x that of the same math
done in PyTorch in the input's precision, plus a small floor)."""

from __future__ import annotations

import contextlib
import math
import zlib
from dataclasses import dataclass, replace

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
    group: int = 2  # gqa: query heads per kv head


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def default_cases(dry_run: bool) -> list[Case]:
    """Exactly what the defaults run: the training dtype (bf16; fp32 in the CPU dry run), the
    load path the config picks, hd 64 and 128 causal and not, GQA, varlen and block-sparse, the
    default backward (atomic dQ) and the deterministic one."""
    dt = torch.float32 if dry_run else torch.bfloat16
    size = {"batch": 1, "seqlen": 48, "heads": 2} if dry_run else {}
    sparse = dict(size, seqlen=200) if dry_run else size  # the layouts' block sizes need room
    small, large = (16, 32) if dry_run else (64, 128)
    name = _dtype_name(dt)
    out = [
        Case(f"{name} hd{d} {'causal' if c else 'full'}", dt, d, c, **size)
        for d in (large, small)
        for c in (False, True)
    ]
    out += [
        Case(f"{name} gqa", dt, large, True, "gqa", **size),
        Case(f"{name} varlen", dt, large, True, "varlen", **size),
        Case(f"{name} blocksparse", dt, large, False, "blocksparse", **sparse),
        Case(f"{name} blocksparse causal", dt, large, True, "blocksparse", **sparse),
    ]
    for kind, sized in (("dense", size), ("varlen", size), ("blocksparse", sparse)):
        out.append(Case(f"{name} {kind} deterministic", dt, large, True, kind,
                        deterministic=True, **sized))  # fmt: skip
    return out


def descriptor_cases(dry_run: bool) -> list[Case]:
    """The same kernels with descriptor (TMA) loads forced on, whatever a table says: what the
    sweep must pass before it may put `"tma": true` into a per-GPU table."""
    return [
        replace(case, name=f"{case.name} descriptor loads", loads="descriptor")
        for case in default_cases(dry_run)
    ]


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


def case_inputs(case: Case, device):
    """The case's generator (seeded by its name) and its q, k, v leaves: the same on every call."""
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.name.encode()))
    kv_heads = case.heads // case.group if case.kind == "gqa" else case.heads
    shape_q = (case.batch, case.seqlen, case.heads, case.head_dim)
    shape_kv = (case.batch, case.seqlen, kv_heads, case.head_dim)
    q, k, v = (
        torch.randn(s, generator=gen, device=device, dtype=case.dtype).requires_grad_()
        for s in (shape_q, shape_kv, shape_kv)
    )
    return gen, q, k, v


def run_ours(case: Case, gen, q, k, v):
    """Our op's [out, dq, dk, dv], dout, and what the reference needs (mask, kwargs, cuts)."""
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
        dout = torch.randn(out.shape, generator=gen, device=q.device, dtype=case.dtype)
        ours = [out, *torch.autograd.grad(out, (q, k, v), dout)]
    return ours, dout, mask, kwargs, cuts


def launch_once(case: Case, device) -> None:
    """Our op's forward and backward of the case, once: the launches check_case makes, so the
    first one compiles every kernel it runs (the GPU suite's compile phase)."""
    run_ours(case, *case_inputs(case, device))


def check_case(case: Case, device) -> dict:
    """Output and dq/dk/dv errors of ours and of low-precision PyTorch, both vs float32 math."""
    gen, q, k, v = case_inputs(case, device)
    ours, dout, mask, kwargs, cuts = run_ours(case, gen, q, k, v)
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
        ok &= within_tolerance(err, base)
    row["passed"] = bool(ok)
    return row


def within_tolerance(err: float, torch_err: float) -> bool:
    """The rule: at most 2x the error of PyTorch's low-precision math, plus FLOOR; never NaN."""
    return err <= 2 * torch_err + FLOOR and math.isfinite(err)


def tolerance_failures(row: dict) -> list[str]:
    """What of a check_case row breaks the rule, e.g. ["dq err 0.31 > 2 x 0.012 + 0.001"]."""
    return [
        f"{name} err {row[f'{name}_err']:.3g} > 2 x {row[f'{name}_torch_err']:.3g} + {FLOOR:g}"
        for name in ("out", "dq", "dk", "dv")
        if not within_tolerance(row[f"{name}_err"], row[f"{name}_torch_err"])
    ]
