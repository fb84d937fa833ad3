"""Correctness of the Gluon kernels for Hopper (the backward, kernels/hopper/flash_bwd_ws.py,
issue 43; the forward, flash_fwd_ws.py, issue 46) for the GPU suite's hopper section: output and
every gradient of flash_attn_func and flash_attn_varlen_func under the configs that ask for them
(the backward alone, the forward alone with the built-in backward, both), vs float32 math with
the rule of bench/correctness.py; a masked non-finite case for each; and the small cases the
guard child launches first. Every row says which forward and which backward ran (ws_route): on
a GPU a row the route did not give to the Gluon kernels it checks fails, so a silent fallback to
the Triton kernels cannot pass as a check of them. A guard result far from the built-in
kernels' (beyond the sweep's agreement gate, tile_sweep.AGREEMENT) or NaN is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from flashtrain.kernels.hopper import route
from flashtrain.kernels.tuning import TileConfig
from flashtrain.lab.bench import correctness, tile_sweep, ws_route
from flashtrain.lab.bench.correctness import Case

LENGTHS = (4096, 16384)
GROUP = 4  # query heads per kv head in the grouped-query cases
NONFINITE_TOL = 1e-2  # relative: the atomic dQ adds in another order from run to run
BACKWARD, FORWARD, BOTH = ("dkdv",), ("fwd",), ("fwd", "dkdv")  # the Gluon kernels of a check
TAGS = {BACKWARD: "", FORWARD: " (Gluon fwd)", BOTH: " (Gluon fwd+bwd)"}  # in its case's name
RESULTS = ("out", "dq", "dk", "dv")  # of a guard launch, in run_ours' order
# The guard's shapes, (the dry run's stand-ins, float32 at toy head dims: no Gluon kernel runs on
# a CPU, so they check the code paths only). seqlen: 1024, a multiple of 16 as the measured
# lengths are (Triton specializes on it); tail: 1000 = 7 x 128 + 104, a last 128-row query tile
# whose second 64-row half is partly past the end (the NaN check's shape); past_half: 1064 =
# 8 x 128 + 40, one whose second half is wholly past it (the Gluon forward's Q halves and the
# backward's K / V halves load nothing there); many: (seqlen, heads) of B=1 with 32 x 16 = 512
# work items of 128 query rows, over 3x the H200's SMs, so that every persistent program takes
# several items (the Q buffers' parity wraps, the counters carry across items) and 16 heads, as
# the timed 16K shapes' (Triton specializes on a multiple of 16). The stand-ins for the tails
# are their last tiles (104 and 40 rows), for `many` 128 tokens of 16 heads.
GUARD_SHAPES = {
    False: {"seqlen": 1024, "tail": 1000, "past_half": 1064, "many": (4096, 16)},
    True: {"seqlen": 48, "tail": 104, "past_half": 40, "many": (128, 16)},
}


@dataclass(frozen=True)
class Check:
    """A case of the section's correctness: the Gluon kernels in force for it (kinds: fwd, dkdv;
    the others run the configs in force, by default the built-in ones) and, for a masked
    non-finite case, the tensors that get NaN keys (k, v)."""

    case: Case
    kinds: tuple[str, ...] = BACKWARD
    nan_in: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.case.name

    def overrides(self) -> dict[str, TileConfig]:
        return ws_route.variant_configs(*self.kinds)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _size(seqlen: int, dry: bool, group: int = 1) -> dict:
    """batch and heads of a case. The float32 reference holds a few (B, Hq, S, S) tensors: at 16K
    one sequence, 2 heads (GQA: 2 kv heads of `group`, 8 GiB a score matrix at group 4)."""
    if dry or seqlen > 4096:
        return {"batch": 1, "seqlen": seqlen, "heads": 2 * group}
    return {"batch": 2, "seqlen": seqlen, "heads": 2 * group if group > 1 else 4}


def _grid(dry: bool):
    """(dtype, dtype name, (large, small) head dims, (short, long) lengths) of the checks."""
    dt = torch.float32 if dry else torch.bfloat16
    return dt, _dtype_name(dt), (32, 16) if dry else (128, 64), (48,) if dry else LENGTHS


def _dense(name, dt, d, causal, s, dry, tag="") -> Case:
    return Case(f"{name} hd{d} {'causal' if causal else 'full'} S={s}{tag}", dt, d, causal,
                **_size(s, dry))  # fmt: skip


def _gqa(name, dt, d, s, dry, tag="") -> Case:
    return Case(f"{name} hd{d} causal gqa S={s}{tag}", dt, d, True, "gqa", group=GROUP,
                **_size(s, dry, GROUP))  # fmt: skip


def _varlen(name, dt, d, s, dry, tag="") -> Case:
    return Case(f"{name} hd{d} causal varlen S={s}{tag}", dt, d, True, "varlen", **_size(s, dry))


def _fp16(d, s, dry, tag="") -> Case:
    return Case(f"float16 hd{d} causal S={s}{tag}", torch.float16, d, True, **_size(s, dry))


def cases(dry: bool) -> list[Case]:
    """The Gluon backward's: bf16 (float32 in the CPU dry run) hd 128 and 64, causal and full, at
    4K and 16K; GQA (GROUP query heads a kv head) and varlen (packed documents of odd lengths)
    at hd 128 and 64 at 4K and hd 128 at 16K; one fp16 case."""
    dt, name, (large, small), lengths = _grid(dry)
    out = [_dense(name, dt, d, c, s, dry) for s in lengths for d in (large, small)
           for c in (False, True)]  # fmt: skip
    grouped = list(dict.fromkeys([(lengths[0], large), (lengths[0], small), (lengths[-1], large)]))
    out += [_gqa(name, dt, d, s, dry) for s, d in grouped]
    out += [_varlen(name, dt, d, s, dry) for s, d in grouped]
    return out + [_fp16(large, lengths[0], dry)]


def _unique(found: list[Case]) -> list[Case]:
    """The cases by name, once (the dry run's one length makes some of them the same case)."""
    return list({case.name: case for case in found}.values())


def forward_cases(dry: bool) -> list[Case]:
    """The Gluon forward's, with the built-in backward (its gradients use the forward's lse):
    hd 128 and 64, causal and full, at 4K; GQA, varlen and fp16 at hd 128 at 4K; one 16K case a
    head dim (hd 128 full, hd 64 causal: each mask at the long length)."""
    dt, name, (large, small), lengths = _grid(dry)
    short, long = lengths[0], lengths[-1]
    tag = TAGS[FORWARD]
    out = [_dense(name, dt, d, c, short, dry, tag) for d in (large, small) for c in (False, True)]
    out += [_gqa(name, dt, large, short, dry, tag), _varlen(name, dt, large, short, dry, tag),
            _fp16(large, short, dry, tag), _dense(name, dt, large, False, long, dry, tag),
            _dense(name, dt, small, True, long, dry, tag)]  # fmt: skip
    return _unique(out)


def pair_cases(dry: bool) -> list[Case]:
    """Both Gluon kernels in one call (the backward reads the Gluon forward's out and lse), at
    4K: hd 128 causal, hd 64 full, GQA at hd 64, varlen at hd 128."""
    dt, name, (large, small), lengths = _grid(dry)
    s, tag = lengths[0], TAGS[BOTH]
    return [_dense(name, dt, large, True, s, dry, tag), _dense(name, dt, small, False, s, dry, tag),
            _gqa(name, dt, small, s, dry, tag), _varlen(name, dt, large, s, dry, tag)]  # fmt: skip


def nonfinite_case(dry: bool, kinds: tuple[str, ...] = BACKWARD) -> Case:
    """Small, causal, a length no tile divides (a tail tile)."""
    dt = torch.float32 if dry else torch.bfloat16
    d, seqlen = (32, 48) if dry else (128, 1000)
    name = f"{_dtype_name(dt)} hd{d} causal S={seqlen} NaN keys past the diagonal{TAGS[kinds]}"
    return Case(name, dt, d, True, batch=1, seqlen=seqlen, heads=2)


def checks(dry: bool) -> list[Check]:
    """Every check of the section, in order: the Gluon backward's (with a NaN-key case: NaN in K
    and V), the Gluon forward's (NaN in V alone: the keys P V must skip), both kernels'."""
    return [
        *[Check(case) for case in cases(dry)],
        Check(nonfinite_case(dry), BACKWARD, ("k", "v")),
        *[Check(case, FORWARD) for case in forward_cases(dry)],
        Check(nonfinite_case(dry, FORWARD), FORWARD, ("v",)),
        *[Check(case, BOTH) for case in pair_cases(dry)],
    ]


def guard_cases(dry: bool, tag: str = "") -> list[Case]:
    """What the guard child launches first, small (GUARD_SHAPES): per head_dim (64, then 128)
    causal, full, GQA (2 kv heads of GROUP), varlen (its last document, 683 tokens, leaves a
    whole 64-row half of its last tile past the end; one document is a single token) and two
    lengths no tile divides (1000: a partly filled last half, the NaN case's shape; 1064: a last
    half wholly past the end), bf16; then fp16: every kernel form (constexprs) the section
    launches later; then many work items (B=1, 4096 tokens, 16 heads: 512 items of the
    persistent forward), hd 128 causal and hd 64 full. The dry run: float32 at toy sizes. tag:
    appended to each name (TAGS)."""
    dt = torch.float32 if dry else torch.bfloat16
    dims = (16, 32) if dry else (64, 128)
    shapes = GUARD_SHAPES[dry]
    name = _dtype_name(dt)
    small = {"batch": 1, "seqlen": shapes["seqlen"], "heads": 2}
    s = small["seqlen"]
    out = []
    for d in dims:
        out += [
            Case(f"{name} hd{d} causal S={s}{tag}", dt, d, True, **small),
            Case(f"{name} hd{d} full S={s}{tag}", dt, d, False, **small),
            Case(f"{name} hd{d} causal gqa S={s}{tag}", dt, d, True, "gqa", group=GROUP,
                 **dict(small, heads=2 * GROUP)),
            Case(f"{name} hd{d} causal varlen S={s}{tag}", dt, d, True, "varlen",
                 **dict(small, batch=2)),
        ]  # fmt: skip
        for tail in (shapes["tail"], shapes["past_half"]):
            out.append(Case(f"{name} hd{d} causal S={tail}{tag}", dt, d, True,
                            **dict(small, seqlen=tail)))  # fmt: skip
    out.append(Case(f"float16 hd{dims[-1]} causal S={s}{tag}", torch.float16, dims[-1], True,
                    **small))  # fmt: skip
    many, heads = shapes["many"]
    for d, causal in ((dims[-1], True), (dims[0], False)):
        mask = "causal" if causal else "full"
        out.append(Case(f"{name} hd{d} {mask} S={many} H={heads}{tag}", dt, d, causal, batch=1,
                        seqlen=many, heads=heads))  # fmt: skip
    return out


def _tile_case(first: Case, d: int, tile: str, tag: str) -> Case:
    name = f"{_dtype_name(first.dtype)} hd{d} causal S={first.seqlen} {tile}{tag}"
    return Case(name, first.dtype, d, True, batch=1, seqlen=first.seqlen, heads=2)


def guard_plan(dry: bool) -> list[tuple[Case, dict[str, TileConfig]]]:
    """What the guard child launches, each case with the configs in force for it (kind ->
    TileConfig): the Gluon forward's first (guard_cases under its section config, then its other
    ring depths, route.FWD_STAGES, causal at their head dims), then the Gluon backward's
    (guard_cases under ws_route.variant_config, then the sweep's other Gluon tiles, route.TILES:
    more ring stages, 128-row query tiles), which later calls launch without a guard of their
    own. The dry run's toy head dims stand in for 64 and 128."""
    stand_in = {64: 16, 128: 32} if dry else {64: 64, 128: 128}
    forward = ws_route.forward_variant_config()
    plan = [(case, {"fwd": forward}) for case in guard_cases(dry, TAGS[FORWARD])]
    first = plan[0][0]
    for head_dim, depths in route.FWD_STAGES.items():
        for stages in depths:
            if stages != forward.num_stages:
                case = _tile_case(first, stand_in[head_dim], f"{stages} stages", TAGS[FORWARD])
                plan.append((case, {"fwd": ws_route.forward_variant_config(stages)}))
    default = ws_route.variant_config()
    backward = [(case, {"dkdv": default}) for case in guard_cases(dry)]
    for head_dim, tiles in route.TILES.items():
        for block_m, stages in tiles:
            if (block_m, stages) != (default.block_m, default.num_stages):
                tile = f"{block_m}-row tiles, {stages} stages"
                case = _tile_case(first, stand_in[head_dim], tile, "")
                backward.append((case, {"dkdv": route.ws_backward_config(block_m, stages)}))
    return plan + backward


def case_routes(case: Case, device) -> dict[str, tuple[str, str | None]]:
    """The forward and backward the case's call takes under the configs in force
    (ws_route.routes: kind -> (kernel, why not Gluon))."""
    _, q, k, v = correctness.case_inputs(case, device)
    if case.kind == "varlen":  # the op gets the batch packed: (total, H, D)
        flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
        return ws_route.routes(*flat, causal=case.causal, packed=True)
    return ws_route.routes(q, k, v, causal=case.causal)


def declined(row: dict) -> str | None:
    """The first Gluon kernel of a row (check, guard_result) the route did not take, labelled
    ("forward: triton (route: ...)"), or None."""
    for kind in row["gluon"]:
        what = ws_route.KERNELS[kind][0]
        kernel, reason = row[f"{what}_kernel"], row[f"{what}_route"]
        if kernel != ws_route.GLUON:
            return f"{what}: {ws_route.label(kernel, reason)}"
    return None


def _with_route(row: dict, routes: dict, kinds, seen, wrong: list[str], require_gluon) -> dict:
    """row with which kernels ran (ws_route.route_fields, kernels_seen: the attention kernels a
    GPU trace shows) and, unless it passed, why not ("wrong: ..." for numbers)."""
    failures = [f"wrong: {'; '.join(wrong)}"] if wrong else []
    for kind in kinds:
        failures += ws_route.route_failures(*routes[kind], seen, require_gluon=require_gluon,
                                            kind=kind)  # fmt: skip
    return dict(row, **ws_route.route_fields(routes, kinds), kernels_seen=seen,
                failure="; ".join(failures) or None, passed=not failures)  # fmt: skip


def check(case: Case, device, *, require_gluon: bool, kinds: tuple[str, ...] = BACKWARD) -> dict:
    """correctness.check_case's row under the Gluon configs of `kinds` (fwd, dkdv), with which
    kernels ran (kernel and route: "gluon", "triton" or "torch", and why not Gluon; per kind as
    well: ws_route.route_fields), kernels_seen (the attention kernels a GPU trace shows) and
    failure (a result past the tolerance or, where require_gluon, another kernel)."""
    with ws_route.overridden(ws_route.variant_configs(*kinds)):
        routes = case_routes(case, device)
        row, seen = ws_route.launched_kernels(lambda: correctness.check_case(case, device), device)
    return _with_route(row, routes, kinds, seen, correctness.tolerance_failures(row),
                       require_gluon)  # fmt: skip


def run(check_: Check, device, *, require_gluon: bool) -> dict:
    """The row of one Check (check or check_masked_nonfinite)."""
    if check_.nan_in:
        return check_masked_nonfinite(check_.case, device, require_gluon=require_gluon,
                                      kinds=check_.kinds, nan_in=check_.nan_in)  # fmt: skip
    return check(check_.case, device, require_gluon=require_gluon, kinds=check_.kinds)


def _out_and_dq(q, k, v, dout):
    """(out, dq) of causal flash_attn_func; the backward computes dk and dv as well."""
    out = correctness.flash_attn_func(q, k, v, causal=True)
    return out, torch.autograd.grad(out, (q, k, v), dout)[0]


def _relative_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| relative to want's largest magnitude (NaN where got is)."""
    got, want = got.detach().float(), want.detach().float()
    scale = max(float(want.abs().max()), 1e-6)
    return float((got - want).abs().max()) / scale


def check_masked_nonfinite(case: Case, device, *, require_gluon: bool,
                           kinds: tuple[str, ...] = BACKWARD,
                           nan_in: tuple[str, ...] = ("k", "v")) -> dict:  # fmt: skip
    """NaN in `nan_in` (K and V; V alone for the forward, whose P V product meets them with
    P = 0) at every key from `first` = seqlen // 2 + 1 on, under the Gluon configs of `kinds`:
    the causal rows before `first` cannot see them, so their out and dq must be finite and equal
    (within NONFINITE_TOL: the atomic dQ's order of adds) to those of the same call on finite
    inputs (docs/attention_semantics.md "Masked entries never contribute"); every later row sees
    one and must not be finite (the planted NaN reached the kernel)."""
    first = case.seqlen // 2 + 1  # inside a key tile: its diagonal tile is partly masked
    gen, q, k, v = correctness.case_inputs(case, device)
    dout = torch.randn(q.shape, generator=gen, device=q.device, dtype=q.dtype)
    planted = {"k": k, "v": v}
    for name in nan_in:
        planted[name] = planted[name].detach().clone()
        planted[name][:, first:] = float("nan")
        planted[name].requires_grad_()
    with ws_route.overridden(ws_route.variant_configs(*kinds)):
        routes = ws_route.routes(q, k, v, causal=True)
        clean_out, clean_dq = _out_and_dq(q, k, v, dout)
        (out, dq), seen = ws_route.launched_kernels(
            lambda: _out_and_dq(q, planted["k"], planted["v"], dout), device
        )
    blind = slice(0, first)  # (B, S, H, D): the rows that cannot see a NaN key
    row = {
        "case": case.name, "kind": "nonfinite", "dtype": str(case.dtype),
        "head_dim": case.head_dim, "causal": True, "first_nan_key": first, "nan_in": list(nan_in),
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
    return _with_route(row, routes, kinds, seen, failures, require_gluon)


def builtin_results(case: Case, device) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of the case with the built-in kernels (no Gluon config in force)."""
    return correctness.run_ours(case, *correctness.case_inputs(case, device))[0]


def guard_launch(case: Case, overrides: dict[str, TileConfig], device):
    """One guard launch: the case's forward and backward under `overrides` (kind -> TileConfig;
    traced on a GPU). ([out, dq, dk, dv], the route's kernels (ws_route.routes), the trace's)."""
    with ws_route.overridden(overrides):
        routes = case_routes(case, device)
        (ours, *_), seen = ws_route.launched_kernels(
            lambda: correctness.run_ours(case, *correctness.case_inputs(case, device)), device
        )
    return ours, routes, seen


def guard_row(case: Case, overrides: dict[str, TileConfig], ours, routes, seen,
              builtin: list[torch.Tensor]) -> dict:  # fmt: skip
    """A guard launch's row: which kernels ran, each result's difference from `builtin`
    (builtin_results) relative to its largest magnitude, and `wrong`: the first result past the
    sweep's agreement gate (tile_sweep.AGREEMENT) or NaN, said as "dq: 0.31 off the built-in
    kernels' (gate 0.05)" or "dq: NaN (gate 0.05)", or None (within it, the numbers are checked
    at full size later)."""
    diffs = {name: _relative_diff(a, b) for name, a, b in zip(RESULTS, ours, builtin)}
    diff = max(diffs.values())
    diff = float("nan") if any(d != d for d in diffs.values()) else diff  # NaN sticks
    wrong = next((_off(name, d) for name, d in diffs.items() if not d <= tile_sweep.AGREEMENT),
                 None)  # fmt: skip
    return {"case": case.name, **ws_route.route_fields(routes, ws_route.gluon_kinds(overrides)),
            "kernels_seen": seen, "max_diff_vs_builtin": diff, "diffs": diffs,
            "wrong": wrong}  # fmt: skip


def _off(name: str, diff: float) -> str:
    """ "dq: 0.31 off the built-in kernels' (gate 0.05)", or "dq: NaN (gate 0.05)"."""
    what = "NaN" if diff != diff else f"{diff:.3g} off the built-in kernels'"
    return f"{name}: {what} (gate {tile_sweep.AGREEMENT:g})"


def guard_result(case: Case, overrides: dict[str, TileConfig], device,
                 builtin: list[torch.Tensor]) -> dict:  # fmt: skip
    """guard_launch's row (guard_row)."""
    return guard_row(case, overrides, *guard_launch(case, overrides, device), builtin)


def consan_plan(dry: bool) -> list[tuple[str, Case, dict[str, TileConfig]]]:
    """What ConSan (Triton's concurrency sanitizer) checks, once each in a child of its own
    (hopper_guard): the guard's smallest case under the Gluon forward (the forward alone), and
    under the Gluon backward (its forward not instrumented). (what, case, configs)."""
    first = guard_cases(dry)[0]
    forward, backward = ws_route.variant_configs("fwd"), ws_route.variant_configs("dkdv")
    return [("forward", replace(first, name=f"{first.name}{TAGS[FORWARD]}"), forward),
            ("backward", first, backward)]  # fmt: skip


def consan_launch(what: str, case: Case, overrides: dict[str, TileConfig], device,
                  instrumented) -> dict:  # fmt: skip
    """A consan_plan case, `instrumented` (a context giving the instrumentation mode in force)
    around its Gluon kernel's launch alone: the forward's (no backward), or the backward's (its
    forward before, outside it). Synchronized inside, so ConSan's report (a device-side assert)
    is raised here. The row's route fields (ws_route.route_fields) say which kernels ran, and
    instrumentation_mode under which mode."""
    _, q, k, v = correctness.case_inputs(case, device)
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    with ws_route.overridden(overrides):
        routes = ws_route.routes(q, k, v, causal=case.causal)
        if what == "forward":
            with instrumented as mode:
                correctness.flash_attn_func(q, k, v, causal=case.causal)
                synchronize()
        else:
            out = correctness.flash_attn_func(q, k, v, causal=case.causal)
            synchronize()
            with instrumented as mode:
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
                synchronize()
    return {"case": case.name, **ws_route.route_fields(routes, ws_route.gluon_kinds(overrides)),
            "instrumentation_mode": mode}  # fmt: skip
