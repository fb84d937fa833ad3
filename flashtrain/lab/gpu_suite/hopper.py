"""The hopper section: the warp-specialized Gluon backward for Hopper (kernels/hopper/
flash_bwd_ws.py, issue 43) checked in one call of its own (`--sections hopper --budget-min 6`,
docs/gpu_session.md), in the order in which things must happen:

    guard        its first launches, small, in a child process with a timeout
                 (bench/hopper_guard.py): a hang, a CUDA fault or a declined route there fails this
                 section ("failed: guard hung: ...") before anything of it runs in the suite's
                 process; the suite goes on
    compile      every launch the section times, at once (Section.compile): under the Gluon
                 config first (tuning.overridden is process-wide), then today's default
    correctness  output and every gradient vs float32 math at 4K and 16K, GQA, varlen, fp16, and
                 NaN keys that causal rows cannot see (bench/hopper_checks.py); a wrong row fails
                 its measurement ("failed: wrong: dq err ...")
    timing       fwd, bwd and fwd+bwd at 4K and 16K, hd 128 and 64, full and causal: the Gluon
                 backward, today's default, SDPA's cuDNN and FA2 backends (bench/hopper_timing.py)
    table        per dkdv/<head_dim>/<dtype>: written into the per-GPU table (merged with what is
                 there) where the Gluon config agrees with the built-in one, beats it on the
                 sweep's measure, and every correctness check of the section passed
    flex         FlexAttention on the dense masks, last: each shape is a compile of its own, so
                 one is skipped (budget) when less than FLEX_COMPILE_S is left

On the GPU, a measurement that the route does not give to the Gluon kernel fails; in the dry run
(CPU: the route declines it, Gluon kernels do not run there) the rows say which backward ran and
why, and the check is of the code paths only.
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
METHODS = ("sdpa_cudnn_attention", hopper_timing.GLUON_METHOD, "flashtrain", "sdpa_flash_attention")
FLEX = ("flex",)
FLEX_COMPILE_S = 60.0  # FlexAttention's forward and backward compile at a new shape (H100, warm)


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


def _table_shapes(suite: Suite) -> dict:
    """The sweep's inputs (section_sweep's): its length, z.tokens a batch (128 in the dry run)."""
    z = suite.sizes
    return dict(dtype=z.dtype, seqlen=z.sweep_seqlen, tokens=128 if suite.dry else z.tokens,
                device=suite.device)  # fmt: skip


def _free_cuda() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def section_hopper(suite: Suite, sec: Section) -> None:
    z = suite.sizes
    checks = [*hopper_checks.cases(suite.dry), hopper_checks.nonfinite_case(suite.dry)]
    shapes = _shapes(suite)
    keys = [tuning.table_key("dkdv", d, z.dtype) for d in z.head_dims]
    sec.plan([GUARD, *[c.name for c in checks],
              *[_timing_name(*shape, m) for shape in shapes for m in METHODS],
              *[f"table {key}" for key in keys],
              *[_timing_name(*shape, m) for shape in shapes for m in FLEX]])  # fmt: skip
    sec.data["checks"] = [c.name for c in checks]  # summary.md's count of checks
    if not _guard(suite, sec):
        return
    with tuning.overridden("dkdv", ws_route.variant_config()):
        sec.compile(_launches(suite, checks, shapes, "gluon"), suite.compile_workers)
    sec.compile(_launches(suite, [], shapes, "default"), suite.compile_workers)
    _correctness(suite, sec, checks)
    _timing(suite, sec, shapes, METHODS)
    _table(suite, sec, checks)
    _timing(suite, sec, shapes, FLEX, need_s=0.0 if suite.dry else FLEX_COMPILE_S)


def _skip_rest(sec: Section, reason: str) -> None:
    for name in sec.data["planned"]:
        sec.data["measured"].setdefault(name, f"skipped: {reason}")
    sec.record.save()


def _guard(suite: Suite, sec: Section) -> bool:
    """The child's launches: True where it passed; otherwise the rest is skipped, and where it
    hung, faulted, failed or was declined SectionFailed says so. The outcome is not raised
    inside measure: a CUDA fault's message there would stop the suite, and the fault was the
    child's alone."""
    g = hopper_guard
    limits = (g.DRY_RUN_TIMEOUT_S, g.DRY_RUN_IDLE_S) if suite.dry else (g.TIMEOUT_S, g.IDLE_S)
    timeout, idle = limits
    row = sec.measure(GUARD, lambda: g.run_guard(
        suite.dry, require_gluon=not suite.dry, timeout_s=timeout, idle_s=idle,
        should_stop=lambda: suite.record.stop_reason))  # fmt: skip
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


def _launches(suite: Suite, checks, shapes, tag: str) -> dict:
    """Compile-phase launches under the dK/dV config in force (the caller's): the checks'
    (correctness.launch_once), every timed shape's, the table's (tile_sweep.builtin_launches)."""
    launches = {f"{tag} {c.name}": partial(correctness.launch_once, c, suite.device)
                for c in checks}  # fmt: skip
    for head_dim, causal, seqlen in shapes:
        dims = _dims(suite, head_dim, seqlen)
        name = f"{tag} {_timing_name(head_dim, causal, seqlen, f'B{dims[0]} H{dims[1]}')}"
        launches[name] = partial(_first_launch, suite, dims, causal)
    table = tile_sweep.builtin_launches(head_dims=suite.sizes.head_dims, kinds=("dkdv",),
                                        **_table_shapes(suite))  # fmt: skip
    for what, launch in table.items():  # "dkdv/128/bfloat16 built-in causal": the config in force
        launches[f"{tag} table {what.replace(' built-in', '')}"] = launch
    return launches


def _correctness(suite: Suite, sec: Section, checks) -> None:
    nonfinite = checks[-1]
    for case in checks:
        check = hopper_checks.check_masked_nonfinite if case is nonfinite else hopper_checks.check
        row = sec.measure(case.name, lambda case=case, check=check: check(
            case, suite.device, require_gluon=not suite.dry))  # fmt: skip
        if row:
            verdict = "ok" if row["passed"] else f"FAILED: {row['failure']}"
            print(f"  {case.name}: {ws_route.label(row['kernel'], row['route'])}: {verdict}",
                  flush=True)  # fmt: skip
            if not row["passed"]:  # its figures stay in the rows; the measurement fails
                sec.data["measured"][case.name] = f"failed: {row['failure'][:300]}"
                suite.record.save()
        _free_cuda()


def _timing(suite: Suite, sec: Section, shapes, methods, need_s: float = 0.0) -> None:
    """Every method at every shape, a measurement each; a shape whose methods need need_s
    (a compile) and have less left is skipped (budget), its estimate in data["estimates"]."""
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
        _time_shape(suite, sec, names, methods, _dims(suite, head_dim, seqlen), causal)
        _free_cuda()


def _time_shape(suite: Suite, sec: Section, names, methods, dims, causal: bool) -> None:
    """Every method on the same inputs of `dims`, a measurement each."""
    built = hopper_timing.methods(*_qkv(suite, dims), causal=causal, names=methods)
    for name, method in zip(names, methods):
        rows = sec.measure(name, lambda method=method: hopper_timing.method_rows(
            method, built[method], dims, causal, suite.sizes.rep, suite.device,
            require_gluon=not suite.dry))  # fmt: skip
        if rows:
            print(f"  {name}: fwd {rows[0]['ms']} ms, fwd+bwd {rows[1]['ms']} ms", flush=True)


def _table(suite: Suite, sec: Section, checks) -> None:
    """Each head_dim's verdict, the winners merged into the per-GPU table as they come."""
    verified = all(sec.data["measured"].get(c.name) == "ok" for c in checks)
    name = tile_sweep.device_name(suite.device)
    path = suite.out / tile_sweep.table_file(name)
    sec.data["table_file"] = path.name
    rows = []
    for head_dim in suite.sizes.head_dims:
        key = tuning.table_key("dkdv", head_dim, suite.sizes.dtype)
        row = sec.measure(f"table {key}", lambda head_dim=head_dim: hopper_timing.table_check(
            head_dim, rep=suite.sizes.rep, require_gluon=not suite.dry, verified=verified,
            **_table_shapes(suite)))  # fmt: skip
        if not row:
            continue
        rows.append(row)
        verdict = "written" if row["winner"] else f"not written {row.get('note', '')}"
        print(f"  table {key}: {row.get('ms')} ms vs built-in {row.get('builtin_ms')} ms: "
              f"{verdict}", flush=True)  # fmt: skip
        table = hopper_timing.write_winners(path, name, rows)
        if table:
            sec.data["table"] = table
            suite.record.save()
