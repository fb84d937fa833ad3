"""The suite's sections, each a list of measurements run through Section.measure (so every one
is on disk the moment it finishes). Sizes are the real ones on a GPU and toys in the dry run.
A section that launches flashtrain's kernels first compiles all of them at once (Section.compile:
the first launch of each shape it will time, on a thread pool), then measures.

    environment  GPU, driver, torch, triton, CUDA, commit, the wheels present and missing
    peaks        bf16 8192^3 matmul, device-to-device copy bandwidth
    correctness  what the defaults run (bf16, the load path the config picks, hd 64/128, causal and
                 not, GQA, varlen, block-sparse, both backward modes) vs float32 math
    attention    the targets: fwd and fwd+bwd at hd 128 and 64, causal and not, 4K and 16K, ours vs
                 SDPA's FLASH and CUDNN backends; block-sparse vs FlexAttention at one density
                 (the only FlexAttention compile of the suite)
    loss         the LM head's loss forward + backward: fused, chunked, compiled, Liger at GPT-2's
                 and Llama-3's vocabularies, 16K and 64K tokens (gpu_suite/loss_section.py)
    training     GPT-2 small at 1K, Llama-125M (GQA, rotary) at 16K and 1K through the trainer,
                 compiled, micro_batch_size=auto, 64K tokens a step; ours vs SDPA's FLASH and
                 CUDNN backends: tokens/s, MFU, peak memory, the profiled step's split
    long         64K tokens fwd+bwd: time and peak memory
    longctx      one rank of a P = 8 context-parallel group: Llama-3-8B-shaped layers at 128K and
                 256K tokens per GPU, ring / ulysses / hybrid 2x4, offload + tiled vs recompute=all:
                 tokens/s and peak memory, communication not measured (bench/long_context.py)
    decode       one decode step against a 4K-64K KV cache: flash_attn_with_kvcache (split-KV and one
                 split), flash_attn_func on the cache, SDPA (Llama-3-8B's heads, bf16)
    hopper       the Gluon backward and forward for Hopper (issues 43, 46) and issue 30's forward
                 variants: a hang and fault guard in a child process, then correctness, timing
                 side by side and their tuning-table entries (gpu_suite/hopper.py)
    sweep        descriptor-load correctness, then the tile configs; the per-GPU table as it goes
    pytest       `pytest -m gpu` with its own budget, its log and junit kept
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from flashtrain.attention import sparsity
from flashtrain.lab.bench import (
    baselines,
    correctness,
    decode,
    long_context,
    long_context_plan,
    measure,
    results,
    tile_sweep,
    training,
)
from flashtrain.lab.bench.attention_rows import bench_method, random_qkv, skipped_rows
from flashtrain.lab.checkout import TESTS
from flashtrain.lab.gpu_suite.hopper import section_hopper
from flashtrain.lab.gpu_suite.loss_section import section_loss
from flashtrain.lab.gpu_suite.record import Section, SectionFailed
from flashtrain.lab.gpu_suite.suite import Sizes, Suite
from flashtrain.utils import missing_modules

# The Python modules each section needs beyond torch and triton (the GPU image lacks hydra):
# a missing one is named at start and fails only the sections that need it.
NEEDS = {"training": ("hydra", "omegaconf"), "pytest": ("pytest",)}
OPTIONAL = ("matplotlib",)  # the plots; without it the figures are in suite.json and summary.md
WHEELS_HINT = "carry their wheels in .whl/ (docs/gpu_session.md)"
PYTEST_JUNIT, PYTEST_LOG = "pytest-junit.xml", "pytest.log"
ATTENTION_METHODS = ("flashtrain", "sdpa_flash_attention", "sdpa_cudnn_attention")
# (head_dim, causal) in the order of the targets' value: the issue-12 targets' shapes first
ATTENTION_ORDER = ((128, False), (64, True), (128, True), (64, False))


def _free_cuda() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- environment, peaks ------------------------------------------------------------------------


def gpu_driver() -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout else None


def environment(suite: Suite) -> dict:
    env = measure.environment()
    env["driver"] = gpu_driver()
    env["dry_run"] = suite.dry
    needed = sorted({m for mods in NEEDS.values() for m in mods})
    env["missing_modules"] = missing_modules(needed + list(OPTIONAL))
    return env


def section_environment(suite: Suite, sec: Section) -> None:
    sec.plan(["environment"])
    env = sec.measure("environment", lambda: environment(suite))
    if env:
        suite.record.state["runs"][-1].update(env)  # the header of summary.md


def section_peaks(suite: Suite, sec: Section) -> None:
    z = suite.sizes
    sec.plan(["bf16 matmul", "copy bandwidth"])
    sec.measure("bf16 matmul", lambda: {"matmul_n": z.matmul_n, "matmul_peak_tflops":
                measure.matmul_peak_tflops(z.matmul_n, device=suite.device)})  # fmt: skip
    sec.measure("copy bandwidth", lambda: {"copy_mib": z.copy_mib, "copy_bandwidth_gbs":
                measure.copy_bandwidth_gbs(z.copy_mib, device=suite.device)})  # fmt: skip


def peaks(state: dict) -> dict:
    """{"matmul_peak_tflops": .., "copy_bandwidth_gbs": ..} from the peaks section's rows."""
    found = {}
    for row in state["sections"].get("peaks", {}).get("rows", []):
        found.update({k: v for k, v in row.items() if k.endswith(("_tflops", "_gbs"))})
    return found


# ---- correctness -------------------------------------------------------------------------------


def run_cases(suite: Suite, sec: Section, cases) -> None:
    sec.plan([c.name for c in cases])
    launches = {c.name: partial(correctness.launch_once, c, suite.device) for c in cases}
    sec.compile(launches, suite.compile_workers)
    for case in cases:
        row = sec.measure(case.name, lambda case=case: correctness.check_case(case, suite.device))
        if row:
            print(f"  {case.name}: {'ok' if row['passed'] else 'WRONG'}", flush=True)


def section_correctness(suite: Suite, sec: Section) -> None:
    run_cases(suite, sec, correctness.default_cases(suite.dry))
    rows = sec.data["rows"]
    sec.data["passed"] = bool(rows) and all(r["passed"] for r in rows)


# ---- attention ---------------------------------------------------------------------------------


def _dense_name(head_dim, causal, seqlen, method) -> str:
    return f"hd{head_dim} {'causal' if causal else 'full'} S={seqlen} {method}"


def _dense_dims(z: Sizes, head_dim: int, seqlen: int) -> tuple[int, int, int, int]:
    """(batch, heads, seqlen, head_dim) of an attention measurement: z.tokens a batch."""
    return max(1, z.tokens // seqlen), z.hidden // head_dim, seqlen, head_dim


def _qkv(suite: Suite, dims):
    batch, heads, seqlen, head_dim = dims
    return random_qkv(batch, seqlen, heads, head_dim, device=suite.device, dtype=suite.sizes.dtype)


def _ours_dense(q, k, v, causal: bool):
    """(forward, inputs) of flashtrain's dense op, as the attention section times it."""
    return baselines.dense_methods(q, k, v, causal=causal, names=("flashtrain",))["flashtrain"]


def _ours_sparse(q, k, v, layout):
    """(forward, inputs) of flashtrain's block-sparse op, as the attention section times it."""
    methods = baselines.blocksparse_methods(q, k, v, layout, causal=False, names=("flashtrain",))
    return methods["flashtrain"]


def _sparse_setup(suite: Suite):
    """The block-sparse target's layout (local) and dims."""
    seqlen, block, window = suite.sizes.sparse
    layout = sparsity.PATTERNS["local"](seqlen, block_size=block, window_blocks=window)
    return layout, _dense_dims(suite.sizes, suite.sizes.head_dims[0], seqlen)


def _first_launch(suite: Suite, dims, make_method) -> Callable[[], None]:
    """A compile-phase launch: make_method(q, k, v) -> (forward, inputs), built as the
    measurement builds it, on fresh inputs of `dims`; its forward and backward run once."""

    def launch() -> None:
        forward, inputs = make_method(*_qkv(suite, dims))
        baselines.with_backward(forward, inputs)()

    return launch


def dense_launches(suite: Suite, shapes) -> dict[str, Callable[[], None]]:
    """Compile-phase launches of flashtrain's dense op at each (dims, causal) of `shapes`."""
    return {
        f"B{b} H{h} S={s} hd{d} {'causal' if c else 'full'}": _first_launch(
            suite, (b, h, s, d), partial(_ours_dense, causal=c)
        )
        for (b, h, s, d), c in shapes
    }


def attention_launches(suite: Suite, pairs) -> dict[str, Callable[[], None]]:
    """Every flashtrain launch the attention section times: the dense (head_dim, causal)
    pairs at every length, block-sparse, and dense at block-sparse's shape."""
    z = suite.sizes
    layout, sparse_dims = _sparse_setup(suite)
    shapes = [(_dense_dims(z, d, s), c) for d, c in pairs for s in z.seqlens]
    launches = dense_launches(suite, [*shapes, (sparse_dims, False)])
    sparse = _first_launch(suite, sparse_dims, partial(_ours_sparse, layout=layout))
    return {**launches, f"blocksparse {layout.name}": sparse}


def section_attention(suite: Suite, sec: Section) -> None:
    """The targets' shapes first (hd128 full, hd64 causal), then block-sparse vs FlexAttention
    (also a target), then the remaining head-dim / causal pairs."""
    z = suite.sizes
    order = [(d, c) for d, c in ATTENTION_ORDER if d in z.head_dims] or [
        (d, c) for d in z.head_dims for c in (False, True)
    ]  # the dry run's toy head dims: every pair
    targets, rest = order[:2], order[2:]
    sparse_names = ["blocksparse flashtrain", "blocksparse flex", "blocksparse dense flashtrain"]
    names = [
        _dense_name(d, c, s, m) for d, c in targets for s in z.seqlens for m in ATTENTION_METHODS
    ]
    names += sparse_names
    names += [
        _dense_name(d, c, s, m) for d, c in rest for s in z.seqlens for m in ATTENTION_METHODS
    ]
    sec.plan(names)
    sec.compile(attention_launches(suite, order), suite.compile_workers)
    dense_shapes(suite, sec, targets)
    blocksparse(suite, sec, sparse_names)
    dense_shapes(suite, sec, rest)


def dense_shapes(suite: Suite, sec: Section, pairs) -> None:
    """Ours and SDPA's FLASH and CUDNN backends at every length, for each (head_dim, causal)."""
    z = suite.sizes
    for head_dim, causal, seqlen in [(d, c, s) for d, c in pairs for s in z.seqlens]:
        names = [_dense_name(head_dim, causal, seqlen, m) for m in ATTENTION_METHODS]
        if sec.why_not():
            for name in names:
                sec.measure(name, lambda: None)  # recorded as skipped, with the reason
            continue
        dims = _dense_dims(z, head_dim, seqlen)
        q, k, v = _qkv(suite, dims)
        methods = baselines.dense_methods(q, k, v, causal=causal, names=ATTENTION_METHODS)
        for name, method in zip(names, (methods[m] for m in ATTENTION_METHODS)):
            label = name.rsplit(" ", 1)[1]

            def run(label=label, method=method, dims=dims, causal=causal):
                if isinstance(method, str):  # this backend cannot run here: a finished row
                    return skipped_rows(label, method, dims, causal)
                return bench_method(label, *method, dims, causal, z.rep, device=suite.device)

            rows = sec.measure(name, run)
            if rows:
                print(f"  {name}: fwd {rows[0]['ms']} ms, fwd+bwd {rows[1]['ms']} ms", flush=True)
        _free_cuda()


def blocksparse(suite: Suite, sec: Section, names: list[str]) -> None:
    """Ours vs FlexAttention with the same BlockMask (a local layout), and dense for scale."""
    z = suite.sizes
    if sec.why_not():
        for name in names:
            sec.measure(name, lambda: None)
        return
    layout, dims = _sparse_setup(suite)
    seqlen = dims[2]
    q, k, v = _qkv(suite, dims)
    kept = layout.tables(seqlen, seqlen, False, suite.device).blocks_visited()
    density = kept / layout.block_mask[0].numel()
    variant = f"blocksparse {layout.name}" if hasattr(layout, "name") else "blocksparse"
    methods = baselines.blocksparse_methods(q, k, v, layout, causal=False)
    methods["dense"] = _ours_dense(q, k, v, causal=False)
    for name, key in zip(names, ("flashtrain", "flex", "dense")):
        method, row_variant = methods[key], variant if key != "dense" else "blocksparse dense"
        d = density if key != "dense" else 1.0
        label = "flashtrain" if key == "dense" else key

        def run(method=method, row_variant=row_variant, d=d, label=label, key=key):
            if isinstance(method, str):
                return skipped_rows(label, method, dims, False, d, row_variant)
            rows = bench_method(label, *method, dims, False, z.rep, d, row_variant, suite.device)
            if key == "flex":  # the baseline computes what ours does, or its time means nothing
                diff = flex_difference(methods["flex"][0], methods["flashtrain"][0])
                rows = [dict(r, max_abs_diff_vs_flashtrain=diff) for r in rows]
            return rows

        sec.measure(name, run)


def flex_difference(flex_forward, ours_forward) -> float:
    """Largest |flex - ours| over the output (flex: (B, H, S, D), ours: (B, S, H, D))."""
    with torch.no_grad():
        return float((flex_forward().transpose(1, 2).float() - ours_forward().float()).abs().max())


# ---- training, long ----------------------------------------------------------------------------


def training_runs(suite: Suite) -> list[tuple[str, str, int, str]]:
    """(measurement, model, seqlen, attention) of every trainer run, in the Sizes' order of value,
    each model and length with ours first, then SDPA's FlashAttention-2 and cuDNN backends."""
    z = suite.sizes
    mode = "compiled" if z.train_compile else "eager (dry run)"
    return [(f"{model} S={seqlen} {attention} {mode}", model, seqlen, attention)
            for model, seqlen in z.training for attention in training.ATTENTIONS]  # fmt: skip


def section_training(suite: Suite, sec: Section) -> None:
    """GPT-2 small at 1K, Llama-125M at 16K and at 1K through the trainer, compiled, each with
    ours, SDPA-FA2 and SDPA-cuDNN attention: micro_batch_size=auto, 64K tokens a step, 11 steps
    (2 warm, 5 timed, 1 + 3 profiled; training.Schedule). On an H200 about 3-4 minutes: 9 runs
    of 15-30 s each (build 3 s, the blocks' compile 8-20 s, 11 steps of 0.15-0.6 s, the trace's
    export and split 2-5 s); the first call's largest share. The dry run: the tiny GPT-2 and
    Llama at one length each, eager, 5 steps of 1K tokens on CPU; a backend with no kernel on
    the device (cuDNN on a CPU) is a note without a trainer (training.backend_missing)."""
    z = suite.sizes
    runs = training_runs(suite)
    sec.plan([name for name, *_ in runs])
    missing = missing_modules(NEEDS["training"])
    if missing:
        raise SectionFailed(f"{', '.join(missing)} missing: {WHEELS_HINT}")
    from flashtrain.train.faults import Preempted

    schedule = training.Schedule(*z.train_schedule)
    for name, model, seqlen, attention in runs:

        def run(model=model, seqlen=seqlen, attention=attention):
            with tempfile.TemporaryDirectory(prefix="suite-train-") as run_dir:
                try:
                    return training.run_training(model, seqlen, attention, z.train_compile,
                                                 schedule, z.train_tokens, Path(run_dir),
                                                 suite.dry)  # fmt: skip
                except Preempted:  # the trainer took the SIGTERM: stop the suite too
                    suite.record.stop("stopped by SIGTERM")
                    raise
                finally:
                    _free_cuda()

        row = sec.measure(name, run)
        if row:
            print(f"  {name}: " + (row.get("note") or f"micro {row['micro_batch_size']} x "
                  f"{row['grad_accum']}, {row['tokens_per_s']:.0f} tokens/s, MFU "
                  f"{row['mfu_percent'] or 0:.1f}%"), flush=True)  # fmt: skip


def section_long(suite: Suite, sec: Section) -> None:
    batch, seqlen, heads, head_dim = suite.sizes.long
    dims = (batch, heads, seqlen, head_dim)
    names = [f"S={seqlen} {'causal' if c else 'full'} fwd+bwd" for c in (True, False)]
    sec.plan(names)
    sec.compile(dense_launches(suite, [(dims, c) for c in (True, False)]), suite.compile_workers)
    if sec.why_not():
        for name in names:
            sec.measure(name, lambda: None)
        return
    q, k, v = _qkv(suite, dims)
    for name, causal in zip(names, (True, False)):
        fwd, inputs = _ours_dense(q, k, v, causal)
        sec.measure(name, lambda fwd=fwd, inputs=inputs, causal=causal: bench_method(
            "flashtrain", fwd, inputs, dims, causal, 2 if suite.dry else 5, device=suite.device))  # fmt: skip


def section_decode(suite: Suite, sec: Section) -> None:
    """Every method at one cache length per measurement (4K, 16K, 64K first: issue 24's range)."""
    batch, heads_q, heads_kv, head_dim = suite.sizes.decode
    lens = suite.sizes.decode_lens
    names = [f"decode cache={n}" for n in lens]
    sec.plan(names)
    shape = (batch, heads_q, heads_kv, head_dim, suite.sizes.dtype, torch.device(suite.device))
    launches = {name: partial(decode.launch_once, n, *shape) for name, n in zip(names, lens)}
    sec.compile(launches, suite.compile_workers)
    for name, length in zip(names, lens):
        rows = sec.measure(name, lambda length=length: decode.decode_rows(
            [length], batch, heads_q, heads_kv, head_dim, suite.sizes.dtype,
            torch.device(suite.device), suite.sizes.rep))  # fmt: skip
        if rows:
            print("  " + name + ": " + ", ".join(
                f"{r['method']} {r['seconds'] * 1e6:.0f} us" for r in rows), flush=True)  # fmt: skip
        _free_cuda()


# ---- long context by context-parallel mode -------------------------------------------------------


def section_longctx(suite: Suite, sec: Section) -> None:
    """One rank's Llama-3-8B-shaped layers (toys in the dry run) per context-parallel mode,
    through flashtrain.lab.bench.long_context: each row one timed forward + backward after the
    compile phase's small launch of its mode. A row whose time, estimated from its FLOPs at the
    rate measured so far, exceeds what is left of the section's share is recorded as skipped
    (budget), with its estimate in data["estimates"]."""
    ranks, tile, tokens = suite.sizes.longctx
    shape = long_context_plan.DRY_SHAPE if suite.dry else long_context_plan.LLAMA3_8B
    device, dtype = torch.device(suite.device), suite.sizes.dtype
    specs = long_context_plan.suite_rows(ranks, tokens, tile)
    sec.plan([s.name for s in specs])
    small = min(min(tokens), 2048)
    modes = list(dict.fromkeys(s.mode for s in specs))

    def launch_modes() -> None:  # one after another: each plays a rank of its own fake group
        for mode in modes:
            long_context.launch_once(mode, small, shape, device, dtype)

    sec.compile({f"longctx {len(modes)} modes T={small}": launch_modes}, workers=1)
    pace = long_context.Pace(assumed_tflops=300.0, setup_s=0.0 if suite.dry else 2.0)
    for spec in specs:
        estimate = pace.estimate(spec, shape, "zigzag", calls=1)
        left = sec.deadline - time.monotonic()
        if not sec.why_not() and estimate > left:
            sec.data["measured"][spec.name] = "skipped: budget (estimated over the time left)"
            sec.data.setdefault("estimates", {})[spec.name] = {
                "estimated_s": round(estimate, 1), "left_s": round(left, 1),
                "tflops": round(pace.tflops, 1)}  # fmt: skip
            suite.record.save()
            continue
        row = sec.measure(spec.name, lambda spec=spec: long_context.measure_row(
            spec, shape, device, dtype, warmup=0, rep=1))  # fmt: skip
        if row:
            pace.observe(row)
            ms, peak = row.get("ms_per_layer"), row.get("peak_gib")
            print(f"  {spec.name}: " + (f"{ms:.1f} ms/layer" if ms else row["note"])
                  + (f", peak {peak:.1f} GiB" if peak else ""), flush=True)  # fmt: skip


# ---- sweep -------------------------------------------------------------------------------------


table_file = tile_sweep.table_file


def section_sweep(suite: Suite, sec: Section) -> None:
    """Descriptor loads are checked first: only if every such case passes may the sweep retry
    its fastest configs with them (and so write "tma": true into the table)."""
    z, device = suite.sizes, suite.device
    from flashtrain.kernels import tma

    if tma.available(torch.device(device)):  # the dry run too: its variants need descriptors
        run_cases(suite, sec, correctness.descriptor_cases(suite.dry))
    checks = [r for r in sec.data["rows"] if "passed" in r]
    # a check that raised left no row: it forbids descriptors as a wrong result does
    errored = [n for n, m in sec.data["measured"].items() if m != "ok"]
    tma_ok = bool(checks) and all(r["passed"] for r in checks) and not errored
    sec.data["tma_allowed"] = tma_ok
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    sec.data["table_file"] = table_file(name)

    def row(r: dict) -> None:
        label = f"{r['key']} {tile_sweep.config_label(r['config'])}"
        note = r.get("note", "")
        sec.data["measured"][label] = note if note.startswith("skipped") else "ok"
        sec.data["planned"].append(label)
        sec.data["rows"].append(dict(r, measurement=label))
        suite.record.save()

    def winners(found) -> None:  # merged: the hopper section may have written an entry
        table = tile_sweep.merged_table(suite.out / sec.data["table_file"], name, found)
        sec.data["table"] = table
        results.write_json(suite.out / sec.data["table_file"], table)
        suite.record.save()

    hooks = tile_sweep.Hooks(why_not=sec.why_not, row=row, winners=winners, tma_ok=tma_ok)
    tiny = {"fwd": [(32, 16, 4, 1)], "dkdv": [(16, 32, 4, 1)], "dq": [(32, 16, 4, 1)]}
    shapes = dict(head_dims=z.head_dims[-1:] if suite.dry else z.head_dims, dtype=z.dtype,
                  seqlen=z.sweep_seqlen, tokens=z.tokens if not suite.dry else 128, device=device)  # fmt: skip
    sec.compile(tile_sweep.builtin_launches(**shapes), suite.compile_workers)
    tile_sweep.sweep(**shapes, rep=z.rep, hooks=hooks, candidates=tiny if suite.dry else None,
                     variants=tile_sweep.DRY_RUN_VARIANTS if suite.dry else None)  # fmt: skip


# ---- pytest ------------------------------------------------------------------------------------


def pytest_summary(log: str) -> str:
    """pytest's last summary line ("3 failed, 60 passed, 8 skipped in 200.1s") or ""."""
    lines = [ln.strip("= ") for ln in log.splitlines() if " in " in ln and ("passed" in ln
             or "failed" in ln or "skipped" in ln or "error" in ln or "deselected" in ln)]  # fmt: skip
    return lines[-1] if lines else ""


def section_pytest(suite: Suite, sec: Section) -> None:
    """`pytest -m gpu` in a subprocess; its output streams into OUT/pytest.log. At the section's
    deadline (or on a stop) pytest gets SIGINT, which still writes its junit file."""
    sec.plan(["pytest -m gpu"])
    missing = missing_modules(NEEDS["pytest"])
    if missing:
        raise SectionFailed(f"{', '.join(missing)} missing: {WHEELS_HINT}")

    def run() -> dict:
        # -p flashtrain.lab.checkout: the tests import flashtrain.kernels from an uninstalled tree
        # -o addopts=: the project's defaults run on every core through pytest-xdist, which the
        # GPU image lacks; the GPU tests run in one process there
        cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-p", "flashtrain.lab.checkout", "-q", "-rfE",
               f"--junitxml={suite.out / PYTEST_JUNIT}", *suite.pytest_args]  # fmt: skip
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(suite.out / PYTEST_LOG, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=TESTS.parent, start_new_session=True)  # fmt: skip
            stopped = None
            while proc.poll() is None:
                stopped = stopped or sec.why_not()
                if stopped:
                    os.killpg(proc.pid, signal.SIGINT)  # pytest writes its junit on SIGINT
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                    break
                time.sleep(0.5)
        code = proc.wait()
        text = (suite.out / PYTEST_LOG).read_text(errors="replace")
        summary = pytest_summary(text)
        print(f"  pytest: exit {code}: {summary}", flush=True)
        if stopped:
            raise RuntimeError(f"interrupted ({stopped}) after: {summary or 'nothing'}")
        if code not in (0, 5):  # 5: nothing collected (the dry run's CPU selection)
            raise RuntimeError(f"exit {code}: {summary}")
        return {"exit_code": code, "summary": summary, "log": PYTEST_LOG, "junit": PYTEST_JUNIT}

    sec.measure("pytest -m gpu", run)


SECTIONS = {
    "environment": section_environment,
    "peaks": section_peaks,
    "correctness": section_correctness,
    "attention": section_attention,
    "loss": section_loss,
    "training": section_training,
    "long": section_long,
    "longctx": section_longctx,
    "decode": section_decode,
    "hopper": section_hopper,
    "sweep": section_sweep,
    "pytest": section_pytest,
}
