"""The hopper section: the Gluon kernels for Hopper, the warp-specialized backward
(kernels/hopper/flash_bwd_ws.py, issue 43) and the warp-specialized, persistent forward
(flash_fwd_ws.py, issue 46), checked in one call of their own (`--sections hopper --budget-min 6`,
docs/gpu_session.md), with issue 30's plain-Triton forward variants timed beside them, in the
order in which things must happen:

    guard        their first launches, small, in a child process with limits, the forward's
                 first (bench/hopper_guard.py), ConSan beside it: a hang, a CUDA fault, a result
                 off the built-in kernels', a declined route or a race there fails this section
                 ("failed: guard hung: ...") before anything of it runs in the suite's process;
                 the suite goes on
    compile      every launch the section times, at once (Section.compile), a pass per set of
                 configs (tuning.overridden is process-wide): the Gluon backward's, the Gluon
                 forward's, each issue-30 variant's, then today's default
    correctness  output and every gradient vs float32 math (bench/hopper_checks.py): the Gluon
                 backward at 4K and 16K, GQA, varlen, fp16; the Gluon forward (with the built-in
                 backward) at 4K, GQA, varlen, fp16 and one 16K case a head dim; both at 4K; and
                 NaN keys that causal rows cannot see (K and V for the backward, V for the
                 forward); a wrong row fails its measurement ("failed: wrong: dq err ...")
    timing       fwd, bwd and fwd+bwd at 4K and 16K, hd 128 and 64, full and causal: SDPA's cuDNN
                 first, the Gluon backward, the Gluon forward, both, today's default, issue 30's
                 warp-specialized and persistent forwards, SDPA's FA2 (bench/hopper_timing.py)
    table        per dkdv/<head_dim>/<dtype>: the Gluon backward; per fwd/<head_dim>/<dtype>:
                 the Gluon forward at each ring depth and issue 30's two variants, the fastest
                 that agrees with the built-in config and beats it; written into the per-GPU
                 table (merged with what is there), a Gluon config only if every correctness
                 check of the section passed
    flex         FlexAttention on the dense masks, last: each shape is a compile of its own, so
                 one is skipped (budget) when less than FLEX_COMPILE_S is left

Every measurement has a limit (LIMITS_S, by kind; Section.measure's watchdog): one past it ends
the call as "failed: hung: <name> (past its limit of N s)", since a kernel hung in this process
cannot be interrupted. On the GPU, a measurement that the route does not give to the Gluon
kernels it asks for fails; in the dry run (CPU: the route declines them, Gluon kernels do not
run there) the rows say which forward and backward ran and why, and the check is of the code
paths only.
"""

from __future__ import annotations

import time
from functools import partial

import torch

from flashtrain.kernels import tuning
from flashtrain.lab.bench import (
    baselines,
    correctness,
    hopper_checks,
    hopper_guard,
    hopper_timing,
    tile_sweep,
    ws_route,
)
from flashtrain.lab.bench.attention_rows import random_qkv
from flashtrain.lab.gpu_suite.record import Section, SectionFailed
from flashtrain.lab.gpu_suite.suite import Suite

GUARD = "guard (child process)"
# per shape, cuDNN first: the ratios' denominator is on record before the rows it divides
METHODS = ("sdpa_cudnn_attention", hopper_timing.GLUON_METHOD, hopper_timing.GLUON_FWD_METHOD,
           hopper_timing.GLUON_BOTH_METHOD, "flashtrain", *hopper_timing.ISSUE30,
           "sdpa_flash_attention")  # fmt: skip
FLEX = ("flex",)
FLEX_COMPILE_S = 60.0  # FlexAttention's forward and backward compile at a new shape (H100, warm)
TABLE_KINDS = ("dkdv", "fwd")  # the table's measurements, a key each per head_dim
# Each kind of measurement's limit on an H200, about 3x what it should take at worst: the guard
# its child's timeout and the kill and pipe waits after it; a compile pass its first launches
# side by side (cold Gluon kernels 5-30 s each, Triton's 2-5 s, front ends sharing the GIL:
# 30-90 s); a check or a timed method compiled kernels (a form the compile phase missed
# compiles cold) and a float32 reference (1-2 s at 16K) or rep timed calls; a table key up to
# four candidates each judged and timed at 4K; a FlexAttention shape its torch.compile (60 s).
LIMITS_S = {"guard": hopper_guard.LIMITS.timeout_s + 60.0, "compile": 240.0, "check": 90.0,
            "timing": 90.0, "table": 180.0, "flex": 240.0}  # fmt: skip
# The dry run's (CPU, toy sizes: a measurement takes well under a few seconds), generous for a
# loaded machine, where a false hang would end the tests' process
DRY_LIMITS_S = {"guard": hopper_guard.DRY_LIMITS.timeout_s + 60.0, "compile": 300.0,
                "check": 300.0, "timing": 300.0, "table": 300.0, "flex": 300.0}  # fmt: skip


def _shapes(suite: Suite) -> list[tuple[int, bool, int]]:
    """(head_dim, causal, seqlen) in the targets' order: full first (the backward targets), the
    larger head_dim first."""
    z = suite.sizes
    return [(d, c, s) for c in (False, True) for d in z.head_dims for s in z.seqlens]


def _dims(suite: Suite, head_dim: int, seqlen: int) -> tuple[int, int, int, int]:
    """(batch, heads, seqlen, head_dim) as the attention section's: z.tokens a batch."""
    z = suite.sizes
    return max(1, z.tokens // seqlen), z.hidden // head_dim, seqlen, head_dim


def _qkv(suite: Suite, dims):
    batch, heads, seqlen, head_dim = dims
    return random_qkv(batch, seqlen, heads, head_dim, device=suite.device, dtype=suite.sizes.dtype)


def _timing_name(head_dim: int, causal: bool, seqlen: int, method: str) -> str:
    return f"hd{head_dim} {'causal' if causal else 'full'} S={seqlen} {method}"


def _table_keys(suite: Suite) -> list[tuple[str, int]]:
    """(kind, head_dim) of each table measurement: the Gluon backward's, then the forward's."""
    return [(kind, d) for kind in TABLE_KINDS for d in suite.sizes.head_dims]


def _table_shapes(suite: Suite) -> dict:
    """The sweep's inputs (section_sweep's): its length, z.tokens a batch (128 in the dry run)."""
    z = suite.sizes
    return dict(dtype=z.dtype, seqlen=z.sweep_seqlen, tokens=128 if suite.dry else z.tokens,
                device=suite.device)  # fmt: skip


def _limit(suite: Suite, kind: str) -> float:
    """The watchdog's limit of a measurement of `kind` (LIMITS_S)."""
    return (DRY_LIMITS_S if suite.dry else LIMITS_S)[kind]


def _free_cuda() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def section_hopper(suite: Suite, sec: Section) -> None:
    z = suite.sizes
    checks = hopper_checks.checks(suite.dry)
    shapes = _shapes(suite)
    keys = [tuning.table_key(kind, d, z.dtype) for kind, d in _table_keys(suite)]
    sec.plan([GUARD, *[c.name for c in checks],
              *[_timing_name(*shape, m) for shape in shapes for m in METHODS],
              *[f"table {key}" for key in keys],
              *[_timing_name(*shape, m) for shape in shapes for m in FLEX]])  # fmt: skip
    sec.data["checks"] = [c.name for c in checks]  # summary.md's count of checks
    if not _guard(suite, sec):
        return
    _compile(suite, sec, checks, shapes)
    _correctness(suite, sec, checks)
    _timing(suite, sec, shapes, METHODS, "timing")
    _table(suite, sec, checks)
    _timing(suite, sec, shapes, FLEX, "flex", need_s=0.0 if suite.dry else FLEX_COMPILE_S)


def _compile_passes(suite: Suite) -> list[tuple[str, dict, str | None, tuple[str, ...]]]:
    """(tag, configs in force, the Gluon kind whose checks it compiles, the table kinds) of each
    compile pass: the Gluon backward's, the Gluon forward's, each issue-30 variant's (the
    timing's and the table's launches alone), today's default. Both Gluon kernels together
    launch only kernel forms these compile."""
    t = hopper_timing
    return [
        ("gluon bwd", t.method_overrides(t.GLUON_METHOD), "dkdv", ("dkdv",)),
        ("gluon fwd", t.method_overrides(t.GLUON_FWD_METHOD), "fwd", ("fwd",)),
        *[(name, t.method_overrides(name, suite.dry), None, ("fwd",)) for name in t.ISSUE30],
        ("default", {}, None, TABLE_KINDS),
    ]


def _compile(suite: Suite, sec: Section, checks, shapes) -> None:
    """Every launch the section makes, a pass per set of configs (tuning.overridden is
    process-wide: one set in force at a time), each pass's launches side by side."""
    for tag, overrides, kind, table_kinds in _compile_passes(suite):
        mine = [c for c in checks if kind in c.kinds]
        with ws_route.overridden(overrides):
            sec.compile(_launches(suite, mine, shapes, tag, table_kinds), suite.compile_workers,
                        limit_s=_limit(suite, "compile"))  # fmt: skip


def _skip_rest(sec: Section, reason: str) -> None:
    for name in sec.data["planned"]:
        sec.data["measured"].setdefault(name, f"skipped: {reason}")
    sec.record.save()


def _guard(suite: Suite, sec: Section) -> bool:
    """The child's launches: True where it passed; otherwise the rest is skipped, and where it
    hung, faulted, failed, was wrong, declined or raced SectionFailed says so. The outcome is
    not raised inside measure: a CUDA fault's message there would stop the suite, and the fault
    was the child's alone."""
    g = hopper_guard
    limits = g.DRY_LIMITS if suite.dry else g.LIMITS
    row = sec.measure(GUARD, lambda: g.run_guard(
        suite.dry, require_gluon=not suite.dry, limits=limits,
        should_stop=lambda: suite.record.stop_reason), limit_s=_limit(suite, "guard"))  # fmt: skip
    if row is None:  # not started (budget, a stop), or the guard's own error
        why = sec.data["measured"][GUARD]
        _skip_rest(sec, why.removeprefix("skipped: ") if why.startswith("skipped") else "no guard")
        return False
    print(f"  {GUARD}: {row['outcome']}: {row['detail']} in {row['seconds']} s", flush=True)
    if row["outcome"] == "passed":
        return True
    if row["outcome"] == "stopped":
        sec.data["measured"][GUARD] = f"skipped: {suite.record.stop_reason}"
        _skip_rest(sec, suite.record.stop_reason)
        return False
    sec.data["measured"][GUARD] = f"failed: {row['outcome']}: {row['detail']}"
    _skip_rest(sec, f"the guard {row['outcome']}")
    raise SectionFailed(f"guard {row['outcome']}: {row['detail']}")


def _first_launch(suite: Suite, dims, causal: bool) -> None:
    """flashtrain's forward and backward at `dims`, once, under the config in force."""
    forward, inputs = hopper_timing.methods(*_qkv(suite, dims), causal=causal,
                                            names=("flashtrain",))["flashtrain"]  # fmt: skip
    baselines.with_backward(forward, inputs)()


def _launches(suite: Suite, checks, shapes, tag: str, table_kinds) -> dict:
    """Compile-phase launches under the configs in force (the caller's): the checks'
    (correctness.launch_once), every timed shape's, the table's (tile_sweep.builtin_launches
    of table_kinds)."""
    launches = {f"{tag} {c.name}": partial(correctness.launch_once, c.case, suite.device)
                for c in checks}  # fmt: skip
    for head_dim, causal, seqlen in shapes:
        dims = _dims(suite, head_dim, seqlen)
        name = f"{tag} {_timing_name(head_dim, causal, seqlen, f'B{dims[0]} H{dims[1]}')}"
        launches[name] = partial(_first_launch, suite, dims, causal)
    table = tile_sweep.builtin_launches(head_dims=suite.sizes.head_dims, kinds=table_kinds,
                                        **_table_shapes(suite))  # fmt: skip
    for what, launch in table.items():  # "dkdv/128/bfloat16 built-in causal": the config in force
        launches[f"{tag} table {what.replace(' built-in', '')}"] = launch
    return launches


def _kernels(row: dict) -> str:
    """ "fwd gluon, bwd triton (route: ...)": which forward and backward a row ran."""
    fwd = ws_route.label(row["forward_kernel"], row["forward_route"])
    return f"fwd {fwd}, bwd {ws_route.label(row['backward_kernel'], row['backward_route'])}"


def _correctness(suite: Suite, sec: Section, checks) -> None:
    for check in checks:
        row = sec.measure(check.name, lambda check=check: hopper_checks.run(
            check, suite.device, require_gluon=not suite.dry),
            limit_s=_limit(suite, "check"))  # fmt: skip
        if row:
            verdict = "ok" if row["passed"] else f"FAILED: {row['failure']}"
            print(f"  {check.name}: {_kernels(row)}: {verdict}", flush=True)
            if not row["passed"]:  # its figures stay in the rows; the measurement fails
                sec.data["measured"][check.name] = f"failed: {row['failure'][:300]}"
                suite.record.save()
        _free_cuda()


def _timing(suite: Suite, sec: Section, shapes, methods, kind: str, need_s: float = 0.0) -> None:
    """Every method at every shape, a measurement each (limited as `kind`: LIMITS_S); a shape
    whose methods need need_s (a compile) and have less left is skipped (budget), its estimate
    in data["estimates"]."""
    for head_dim, causal, seqlen in shapes:
        names = [_timing_name(head_dim, causal, seqlen, m) for m in methods]
        left = sec.deadline - time.monotonic()
        if sec.why_not() or left < need_s:
            for name in names:
                if sec.why_not():
                    sec.measure(name, lambda: None)  # recorded as skipped, with the reason
                    continue
                sec.data["measured"][name] = "skipped: budget (a compile each, estimated)"
                sec.data.setdefault("estimates", {})[name] = {
                    "estimated_s": need_s, "left_s": round(left, 1)}  # fmt: skip
            suite.record.save()
            continue
        _time_shape(suite, sec, names, methods, _dims(suite, head_dim, seqlen), causal, kind)
        _free_cuda()


def _time_shape(suite: Suite, sec: Section, names, methods, dims, causal: bool,
                kind: str) -> None:  # fmt: skip
    """Every method on the same inputs of `dims`, a measurement each."""
    built = hopper_timing.methods(*_qkv(suite, dims), causal=causal, names=methods)
    for name, method in zip(names, methods):
        rows = sec.measure(name, lambda method=method: hopper_timing.method_rows(
            method, built[method], dims, causal, suite.sizes.rep, suite.device,
            require_gluon=not suite.dry, dry=suite.dry), limit_s=_limit(suite, kind))  # fmt: skip
        if rows:
            print(f"  {name}: fwd {rows[0]['ms']} ms, fwd+bwd {rows[1]['ms']} ms", flush=True)


def _table_rows(suite: Suite, kind: str, head_dim: int, verified: bool) -> list[dict]:
    """The verdicts of one table key: the Gluon backward's (dkdv) or every forward candidate's
    (fwd: hopper_timing.forward_table_check)."""
    common = dict(rep=suite.sizes.rep, require_gluon=not suite.dry, verified=verified,
                  **_table_shapes(suite))  # fmt: skip
    if kind == "dkdv":
        return [hopper_timing.table_check(head_dim, **common)]
    return hopper_timing.forward_table_check(head_dim, dry=suite.dry, **common)


def _table(suite: Suite, sec: Section, checks) -> None:
    """Each key's verdicts, the winners merged into the per-GPU table as they come."""
    verified = all(sec.data["measured"].get(c.name) == "ok" for c in checks)
    name = tile_sweep.device_name(suite.device)
    path = suite.out / tile_sweep.table_file(name)
    sec.data["table_file"] = path.name
    rows = []
    for kind, head_dim in _table_keys(suite):
        key = tuning.table_key(kind, head_dim, suite.sizes.dtype)
        found = sec.measure(f"table {key}", lambda kind=kind, head_dim=head_dim: _table_rows(
            suite, kind, head_dim, verified), limit_s=_limit(suite, "table"))  # fmt: skip
        for row in found or ():
            rows.append(row)
            verdict = "written" if row["winner"] else f"not written {row.get('note', '')}"
            print(f"  table {key}: {row.get('ms')} ms vs built-in {row.get('builtin_ms')} ms: "
                  f"{verdict}", flush=True)  # fmt: skip
        table = hopper_timing.write_winners(path, name, rows)
        if table:
            sec.data["table"] = table
            suite.record.save()
