"""Correctness of the warp-specialized Gluon backward (kernels/hopper/flash_bwd_ws.py) for the
GPU suite's hopper section: output and every gradient of flash_attn_func and
flash_attn_varlen_func under the config that asks for it, vs float32 math with the rule of
bench/correctness.py; a masked non-finite case; and the small cases the guard child launches
first. Every row says which backward ran (ws_route): on a GPU a row the route did not give to the
Gluon kernel fails, so a silent fallback to the Triton kernels cannot pass as a check of it.
"""

from __future__ import annotations

import torch

from flashtrain.kernels import tuning
from flashtrain.kernels.hopper import route
from flashtrain.kernels.tuning import TileConfig
from flashtrain.lab.bench import correctness, ws_route
from flashtrain.lab.bench.correctness import Case

LENGTHS = (4096, 16384)
GROUP = 4  # query heads per kv head in the grouped-query cases
NONFINITE_TOL = 1e-2  # relative: the atomic dQ adds in another order from run to run


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _size(seqlen: int, dry: bool, group: int = 1) -> dict:
    """batch and heads of a case. The float32 reference holds a few (B, Hq, S, S) tensors: at 16K
    one sequence, 2 heads (GQA: 2 kv heads of `group`, 8 GiB a score matrix at group 4)."""
    if dry or seqlen > 4096:
        return {"batch": 1, "seqlen": seqlen, "heads": 2 * group}
    return {"batch": 2, "seqlen": seqlen, "heads": 2 * group if group > 1 else 4}


def cases(dry: bool) -> list[Case]:
    """bf16 (float32 in the CPU dry run) hd 128 and 64, causal and full, at 4K and 16K; GQA
    (GROUP query heads a kv head) and varlen (packed documents of odd lengths) at hd 128 and 64
    at 4K and hd 128 at 16K; one fp16 case."""
    dt = torch.float32 if dry else torch.bfloat16
    large, small = (32, 16) if dry else (128, 64)
    lengths = (48,) if dry else LENGTHS
    name = _dtype_name(dt)
    out = [
        Case(f"{name} hd{d} {'causal' if c else 'full'} S={s}", dt, d, c, **_size(s, dry))
        for s in lengths
        for d in (large, small)
        for c in (False, True)
    ]
    grouped = list(dict.fromkeys([(lengths[0], large), (lengths[0], small), (lengths[-1], large)]))
    for s, d in grouped:
        out.append(Case(f"{name} hd{d} causal gqa S={s}", dt, d, True, "gqa", group=GROUP,
                        **_size(s, dry, GROUP)))  # fmt: skip
    for s, d in grouped:
        out.append(Case(f"{name} hd{d} causal varlen S={s}", dt, d, True, "varlen",
                        **_size(s, dry)))  # fmt: skip
    fp16 = torch.float16
    out.append(Case(f"float16 hd{large} causal S={lengths[0]}", fp16, large, True,
                    **_size(lengths[0], dry)))  # fmt: skip
    return out


def guard_cases(dry: bool) -> list[Case]:
    """What the guard child launches first, small: per head_dim (64, then 128) causal, full, GQA
    (2 kv heads of GROUP), varlen and a length no tile divides (1000: tail tiles, the NaN case's
    shape), bf16; then fp16: every kernel form (constexprs) the section launches later. 1024
    tokens: a multiple of 16, as the measured lengths are (Triton specializes on it). The dry
    run: float32 at toy sizes."""
    dt = torch.float32 if dry else torch.bfloat16
    dims, seqlen, tail = ((16, 32), 48, 41) if dry else ((64, 128), 1024, 1000)
    name = _dtype_name(dt)
    small = {"batch": 1, "seqlen": seqlen, "heads": 2}
    out = []
    for d in dims:
        out += [
            Case(f"{name} hd{d} causal S={seqlen}", dt, d, True, **small),
            Case(f"{name} hd{d} full S={seqlen}", dt, d, False, **small),
            Case(f"{name} hd{d} causal gqa S={seqlen}", dt, d, True, "gqa", group=GROUP,
                 **dict(small, heads=2 * GROUP)),
            Case(f"{name} hd{d} causal varlen S={seqlen}", dt, d, True, "varlen",
                 **dict(small, batch=2)),
            Case(f"{name} hd{d} causal S={tail}", dt, d, True, **dict(small, seqlen=tail)),
        ]  # fmt: skip
    return out + [Case(f"float16 hd{dims[-1]} causal S={seqlen}", torch.float16, dims[-1], True,
                       **small)]  # fmt: skip


def guard_plan(dry: bool) -> list[tuple[Case, TileConfig]]:
    """What the guard child launches, each case with its dK/dV config: guard_cases under the
    section's (ws_route.variant_config), then the sweep's other Gluon tiles (route.TILES: more
    ring stages, 128-row query tiles) causal at their head dims, which a later sweep call
    launches without a guard of its own. The dry run's toy head dims stand in for 64 and 128."""
    default = ws_route.variant_config()
    plan = [(case, default) for case in guard_cases(dry)]
    first = plan[0][0]
    stand_in = {64: 16, 128: 32} if dry else {64: 64, 128: 128}
    for head_dim, tiles in route.TILES.items():
        for block_m, stages in tiles:
            if (block_m, stages) == (default.block_m, default.num_stages):
                continue
            d, tile = stand_in[head_dim], f"{block_m}-row tiles, {stages} stages"
            name = f"{_dtype_name(first.dtype)} hd{d} causal S={first.seqlen} {tile}"
            case = Case(name, first.dtype, d, True, batch=1, seqlen=first.seqlen, heads=2)
            plan.append((case, route.ws_backward_config(block_m=block_m, stages=stages)))
    return plan


def nonfinite_case(dry: bool) -> Case:
    """Small, causal, a length no tile divides (a tail tile)."""
    dt = torch.float32 if dry else torch.bfloat16
    d, seqlen = (32, 48) if dry else (128, 1000)
    name = f"{_dtype_name(dt)} hd{d} causal S={seqlen} NaN keys past the diagonal"
    return Case(name, dt, d, True, batch=1, seqlen=seqlen, heads=2)


def case_route(case: Case, device) -> tuple[str, str | None]:
    """The backward the case's call takes under the config in force (ws_route.backward_route)."""
    _, q, k, v = correctness.case_inputs(case, device)
    if case.kind == "varlen":  # the op gets the batch packed: (total, H, D)
        flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
        return ws_route.backward_route(*flat, causal=case.causal, packed=True)
    return ws_route.backward_route(q, k, v, causal=case.causal)


def _with_route(row: dict, kernel, reason, seen, wrong: list[str], require_gluon) -> dict:
    """row with which backward ran and, unless it passed, why not ("wrong: ..." for numbers)."""
    failures = [f"wrong: {'; '.join(wrong)}"] if wrong else []
    failures += ws_route.route_failures(kernel, reason, seen, require_gluon=require_gluon)
    return dict(row, kernel=kernel, route=reason, kernels_seen=seen,
                failure="; ".join(failures) or None, passed=not failures)  # fmt: skip


def check(case: Case, device, *, require_gluon: bool) -> dict:
    """correctness.check_case's row under the Gluon config, with kernel ("gluon", "triton" or
    "torch"), route (why not Gluon), kernels_seen (the backward kernels a GPU trace shows) and
    failure (a gradient past the tolerance or, where require_gluon, another backward)."""
    with tuning.overridden("dkdv", ws_route.variant_config()):
        kernel, reason = case_route(case, device)
        row, seen = ws_route.launched_kernels(lambda: correctness.check_case(case, device), device)
    return _with_route(row, kernel, reason, seen, correctness.tolerance_failures(row),
                       require_gluon)  # fmt: skip


def _out_and_dq(q, k, v, dout):
    """(out, dq) of causal flash_attn_func; the backward computes dk and dv as well."""
    out = correctness.flash_attn_func(q, k, v, causal=True)
    return out, torch.autograd.grad(out, (q, k, v), dout)[0]


def _relative_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| relative to want's largest magnitude (NaN where got is)."""
    got, want = got.detach().float(), want.detach().float()
    scale = max(float(want.abs().max()), 1e-6)
    return float((got - want).abs().max()) / scale


def check_masked_nonfinite(case: Case, device, *, require_gluon: bool) -> dict:
    """NaN in K and V at every key from `first` = seqlen // 2 + 1 on: the causal rows before
    `first` cannot see them, so their out and dq must be finite and equal (within NONFINITE_TOL:
    the atomic dQ's order of adds) to those of the same call on finite K and V
    (docs/attention_semantics.md "Masked entries never contribute"); every later row sees one
    and must not be finite (the planted NaN reached the kernel)."""
    first = case.seqlen // 2 + 1  # inside a key tile: its diagonal tile is partly masked
    gen, q, k, v = correctness.case_inputs(case, device)
    dout = torch.randn(q.shape, generator=gen, device=q.device, dtype=q.dtype)
    k_nan, v_nan = (t.detach().clone() for t in (k, v))
    k_nan[:, first:], v_nan[:, first:] = float("nan"), float("nan")
    k_nan.requires_grad_(), v_nan.requires_grad_()
    with tuning.overridden("dkdv", ws_route.variant_config()):
        kernel, reason = ws_route.backward_route(q, k, v, causal=True)
        clean_out, clean_dq = _out_and_dq(q, k, v, dout)
        (out, dq), seen = ws_route.launched_kernels(
            lambda: _out_and_dq(q, k_nan, v_nan, dout), device
        )
    blind = slice(0, first)  # (B, S, H, D): the rows that cannot see a NaN key
    row = {
        "case": case.name, "kind": "nonfinite", "dtype": str(case.dtype),
        "head_dim": case.head_dim, "causal": True, "first_nan_key": first,
        "finite": bool(torch.isfinite(out[:, blind]).all() and torch.isfinite(dq[:, blind]).all()),
        "out_diff": _relative_diff(out[:, blind], clean_out[:, blind]),
        "dq_diff": _relative_diff(dq[:, blind], clean_dq[:, blind]),
        "nan_reached": bool((~torch.isfinite(out[:, first:])).any(dim=-1).all()),
    }  # fmt: skip
    failures = [] if row["finite"] else ["non-finite out or dq in rows that see no NaN key"]
    failures += [f"{name} {row[name]:.3g} > {NONFINITE_TOL:g} off the finite-input result"
                 for name in ("out_diff", "dq_diff") if not row[name] <= NONFINITE_TOL]  # fmt: skip
    if not row["nan_reached"]:
        failures.append("a row that sees a NaN key has a finite output")
    return _with_route(row, kernel, reason, seen, failures, require_gluon)


def builtin_results(case: Case, device) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of the case with the built-in kernels (no Gluon config in force)."""
    return correctness.run_ours(case, *correctness.case_inputs(case, device))[0]


def guard_result(case: Case, config: TileConfig, device, builtin: list[torch.Tensor]) -> dict:
    """One guard launch: the case's forward and backward under `config` (traced on a GPU), and
    its largest difference from `builtin` (builtin_results), relative to each result's largest
    magnitude (information: correctness is checked at full size later)."""
    with tuning.overridden("dkdv", config):
        kernel, reason = case_route(case, device)
        (ours, *_), seen = ws_route.launched_kernels(
            lambda: correctness.run_ours(case, *correctness.case_inputs(case, device)), device
        )
    diffs = [_relative_diff(a, b) for a, b in zip(ours, builtin)]
    diff = float("nan") if any(d != d for d in diffs) else max(diffs)  # NaN sticks
    return {"case": case.name, "kernel": kernel, "route": reason, "kernels_seen": seen,
            "max_diff_vs_builtin": diff}  # fmt: skip
