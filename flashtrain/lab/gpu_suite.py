"""The whole GPU protocol in one command (issue 12), writing results as it goes.

    python scripts/gpu_suite.py --out DIR [--budget-min 25] [--sections attention sweep] [--resume]
    python scripts/gpu_suite.py --dry-run --out /tmp/x     # every section at toy sizes on CPU

Sections, in this order: correctness (ours vs float32 math at real sizes, dropout keep rate, the
`gpu` pytest marks), peaks (bf16 8192^3 matmul, device copy bandwidth), attention (vs SDPA's
FLASH/CUDNN/EFFICIENT backends and compiled FlexAttention, the issue's targets as ratios),
sweep (tile configs of the forward, dK/dV and dQ kernels, pointer and TMA loads, vs the built-in
rules; the winning per-GPU table to DIR/tuning_tables/),
training (GPT-2 small at 1K and 16K through the trainer, flash vs sdpa, compile off and on),
long (64K tokens fwd+bwd, B1 H16 hd128). DIR/suite.json holds everything (rewritten after every
measurement), DIR/summary.md the tables, DIR/*.png the plots. A section that does not fit the
remaining budget is recorded as skipped; --resume keeps the sections DIR already finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from flashtrain.attention import flash_attn_func, sparsity
from flashtrain.kernels import tuning
from flashtrain.lab.bench import baselines, correctness, measure, results, tile_sweep, training
from flashtrain.lab.bench.attention_rows import bench_method, random_qkv, skipped_rows

SECTIONS = ("correctness", "peaks", "attention", "sweep", "training", "long")
SHARE = {  # relative minutes of a 25-minute budget
    "correctness": 3,
    "peaks": 0.5,
    "attention": 8,
    "sweep": 6,
    "training": 6.5,
    "long": 1,
}
# (name, mode, causal, head_dim, baseline method, goal): ours / baseline, TFLOP/s ratios
TARGETS = [
    ("fwd hd128 vs FA2", "fwd", False, 128, "sdpa_flash_attention", 1.5),
    ("fwd hd128 vs cuDNN", "fwd", False, 128, "sdpa_cudnn_attention", 1.0),
    ("fwd+bwd hd128 vs FA2", "fwd_bwd", False, 128, "sdpa_flash_attention", 1.2),
    ("causal fwd hd64 vs FA2", "fwd", True, 64, "sdpa_flash_attention", 1.5),
    ("causal fwd hd64 vs cuDNN", "fwd", True, 64, "sdpa_cudnn_attention", 1.0),
    ("causal fwd+bwd hd64 vs FA2", "fwd_bwd", True, 64, "sdpa_flash_attention", 1.2),
]


class Suite:
    """Results on disk after every step: DIR/suite.json (atomic) and DIR/summary.md."""

    def __init__(self, args):
        self.args, self.out, self.dry = args, args.out, args.dry_run
        self.device = "cpu" if self.dry else "cuda"
        path = self.out / "suite.json"  # earlier calls' sections stay (a session splits the suite)
        self.state = json.loads(path.read_text()) if path.is_file() else {"sections": {}}
        self.env = measure.environment()
        self.env["dry_run"] = self.dry
        self.state.setdefault("runs", []).append(self.env)
        self.deadline = time.monotonic() + args.budget_min * 60

    def section(self, name: str) -> dict:
        return self.state["sections"].setdefault(name, {})

    def save(self) -> None:
        results.write_json(self.out / "suite.json", self.state)
        tmp = self.out / "summary.md.tmp"
        tmp.write_text(summary_markdown(self.state))
        os.replace(tmp, self.out / "summary.md")

    def run(self, names) -> int:
        todo = [n for n in names if self.section(n).get("status") != "done" or not self.args.resume]
        failures = 0
        self.save()  # this call's environment is on record even if it runs nothing
        for i, name in enumerate(todo):
            left = self.deadline - time.monotonic()
            share = SHARE[name] / sum(SHARE[n] for n in todo[i:])
            sec = self.state["sections"][name] = {"status": "running"}
            if left < 60 * SHARE[name] * 0.25:
                sec["status"] = f"skipped: budget ({left / 60:.1f} min left)"
                self.save()
                print(f"[{name}] {sec['status']}", flush=True)
                continue
            print(f"[{name}] starting, {left / 60:.1f} min of budget left", flush=True)
            start = time.monotonic()
            try:
                globals()[f"section_{name}"](self, sec, start + left * share)
                sec["status"] = "done"
            except Exception as err:  # noqa: BLE001  (one section's failure must not lose the rest)
                failures += 1
                sec["status"] = f"failed: {type(err).__name__}: {str(err)[:300]}"
                sec["traceback"] = traceback.format_exc()[-4000:]
                print(sec["traceback"], flush=True)
            sec["seconds"] = round(time.monotonic() - start, 1)
            sec["commit"] = self.env["commit"]
            self.save()
            print(f"[{name}] {sec['status']} in {sec['seconds']} s", flush=True)
        self.plots()
        return 1 if failures else 0

    def plots(self) -> None:
        rows = self.section("attention").get("rows", [])
        dense = [r for r in rows if not r.get("variant")]
        results.plot(dense, self.out / "attention-tflops.png", "tflops", "TFLOP/s", "fwd_bwd")
        results.plot(dense, self.out / "attention-fwd-tflops.png", "tflops", "TFLOP/s", "fwd")
        runs = self.section("training").get("runs", [])
        results.bar_plot(
            [f"{r['seqlen']} {r['attention']}{' compiled' if r['compile'] else ''}" for r in runs],
            [r["tokens_per_s"] for r in runs],
            self.out / "training-tokens-per-s.png",
            "tokens/s",
        )


# ---- sections ---------------------------------------------------------------------------------


def section_correctness(suite: Suite, sec: dict, deadline: float) -> None:
    rows = sec["rows"] = []
    for case in correctness.cases(suite.dry):
        if time.monotonic() > deadline:
            rows.append({"case": case.name, "passed": None, "note": "skipped: budget"})
            continue
        rows.append(correctness.check_case(case, suite.device))
        print(f"  {case.name}: {'ok' if rows[-1]['passed'] else 'FAILED'}", flush=True)
        suite.save()
    dtypes = (torch.float32,) if suite.dry else (torch.float16, torch.bfloat16)
    for dtype in dtypes:
        rows.append(correctness.dropout_keep_rate(suite.device, dtype, dry_run=suite.dry))
    sec["passed"] = all(r["passed"] is not False for r in rows)
    sec["pytest_gpu"] = pytest_gpu_marks(suite.dry, deadline)


def pytest_gpu_marks(dry: bool, deadline: float) -> dict:
    """The `gpu` pytest marks in a subprocess, within what is left of the section's time."""
    if dry:
        return {"status": "skipped: dry run (the gpu marks need CUDA)"}
    timeout = max(30.0, deadline - time.monotonic())
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {timeout:.0f} s"}
    return {"status": f"exit {res.returncode}", "tail": res.stdout[-3000:] + res.stderr[-1000:]}


def section_peaks(suite: Suite, sec: dict, deadline: float) -> None:
    n, mib = (256, 8) if suite.dry else (8192, 1024)
    sec["matmul_bf16_n"] = n
    sec["matmul_peak_tflops"] = measure.matmul_peak_tflops(n, device=suite.device)
    sec["copy_bandwidth_gbs"] = measure.copy_bandwidth_gbs(mib, device=suite.device)
    print(
        f"  bf16 matmul {sec['matmul_peak_tflops']:.1f} TFLOP/s, copy {sec['copy_bandwidth_gbs']:.0f} GB/s"
    )


def attention_sizes(dry: bool):
    """(head_dims, seqlens, tokens per batch, hidden = heads * head_dim, block-sparse seqlen)."""
    if dry:
        return (16,), (64, 128), 256, 32, 256
    return (64, 128), (1024, 2048, 4096, 8192, 16384), 16384, 2048, 8192


def section_attention(suite: Suite, sec: dict, deadline: float) -> None:
    rows = sec["rows"] = []
    head_dims, seqlens, tokens, hidden, sparse_len = attention_sizes(suite.dry)
    dtype = torch.float32 if suite.dry else torch.bfloat16
    rep = 2 if suite.dry else suite.args.rep
    for head_dim in reversed(head_dims):  # the targets' head dims first
        for causal in (False, True):
            for seqlen in seqlens:
                batch, heads = max(1, tokens // seqlen), hidden // head_dim
                dims = (batch, heads, seqlen, head_dim)
                q, k, v = random_qkv(*dims[:3], head_dim, device=suite.device, dtype=dtype)
                for name, method in baselines.dense_methods(q, k, v, causal=causal).items():
                    if name == "sdpa_math" and not suite.dry:
                        continue  # the slow reference: correctness covers it
                    if isinstance(method, str) or time.monotonic() > deadline:
                        reason = method if isinstance(method, str) else "skipped: budget"
                        rows += skipped_rows(name, reason, dims, causal)
                        continue
                    rows += bench_method(name, *method, dims, causal, rep, device=suite.device)
                    print(f"  d={head_dim} causal={causal} S={seqlen} {name}: {rows[-2]['ms']} ms")
                suite.save()
    rows += blocksparse_rows(suite, sparse_len, hidden, tokens, dtype, rep, deadline)
    peak = suite.section("peaks").get("matmul_peak_tflops")
    sec["targets"] = target_ratios(rows, peak, small=suite.dry)


def blocksparse_rows(suite, seqlen, hidden, tokens, dtype, rep, deadline) -> list[dict]:
    """Ours vs FlexAttention on one local layout (~10% kept), and dense causal for scale."""
    head_dim, block = (16, 64) if suite.dry else (128, 128)
    layout = sparsity.PATTERNS["local"](
        seqlen, block_size=block, window_blocks=1 if suite.dry else 8
    )
    batch, heads = max(1, tokens // seqlen), hidden // head_dim
    q, k, v = random_qkv(batch, seqlen, heads, head_dim, device=suite.device, dtype=dtype)
    dims = (batch, heads, seqlen, head_dim)
    density = layout.tables(seqlen, seqlen, False, suite.device).blocks_visited() / (
        layout.block_mask[0].numel()
    )
    rows = []
    for name, method in baselines.blocksparse_methods(q, k, v, layout, causal=False).items():
        variant = f"blocksparse {layout.name}" if hasattr(layout, "name") else "blocksparse"
        if isinstance(method, str) or time.monotonic() > deadline:
            reason = method if isinstance(method, str) else "skipped: budget"
            rows += skipped_rows(name, reason, dims, False, density, variant)
            continue
        rows += bench_method(name, *method, dims, False, rep, density, variant, suite.device)
    dense = (lambda: flash_attn_func(q, k, v), (q, k, v))
    rows += bench_method(
        "flashtrain", *dense, dims, False, rep, 1.0, "blocksparse dense", suite.device
    )
    return rows


def _geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def target_ratios(rows: list[dict], matmul_peak: float | None, small: bool) -> list[dict]:
    """Each issue-12 target: our TFLOP/s over the baseline's (geometric mean over seqlens >= 4K)."""
    dense = [r for r in rows if not r.get("variant")]
    min_len = 0 if small else 4096

    def tflops(method, mode, causal, head_dim):
        return {
            r["seqlen"]: r["tflops"]
            for r in dense
            if (r["method"], r["mode"], r["causal"], r["head_dim"]) == (method, mode, causal, head_dim)
            and r["seqlen"] >= min_len and r["tflops"]
        }  # fmt: skip

    out = []
    for name, mode, causal, head_dim, base, goal in TARGETS:
        if small:
            head_dim = dense[0]["head_dim"] if dense else head_dim
        ours, theirs = (
            tflops("flashtrain", mode, causal, head_dim),
            tflops(base, mode, causal, head_dim),
        )
        ratio = _geomean([ours[s] / theirs[s] for s in ours if s in theirs])
        out.append(_target(name, ratio, goal))
    sparse = {r["method"]: r for r in rows if str(r.get("variant")).startswith("blocksparse ") and r["mode"] == "fwd_bwd" and "dense" not in r["variant"]}  # fmt: skip
    ours, flex = sparse.get("flashtrain", {}), sparse.get("flex", {})
    ratio = ours["tflops"] / flex["tflops"] if ours.get("tflops") and flex.get("tflops") else None
    out.append(_target("block-sparse fwd+bwd vs FlexAttention", ratio, 1.2))
    fwd = tflops("flashtrain", "fwd", False, dense[0]["head_dim"] if small and dense else 128)
    frac = max(fwd.values()) / matmul_peak if fwd and matmul_peak else None
    out.append(_target("fwd hd128 fraction of bf16 matmul peak", frac, 0.6))
    return out


def _target(name, ratio, goal) -> dict:
    passed = None if ratio is None else ratio >= goal
    return {"target": name, "ratio": ratio, "goal": goal, "passed": passed}


def section_sweep(suite: Suite, sec: dict, deadline: float) -> None:
    dry = suite.dry
    winners, rows = tile_sweep.sweep(
        head_dims=(16,) if dry else (64, 128),
        dtype=torch.float32 if dry else torch.bfloat16,
        seqlen=64 if dry else 4096,
        tokens=128 if dry else 16384,
        rep=2 if dry else suite.args.rep,
        device=suite.device,
        deadline=deadline,
        candidates={"fwd": [(32, 16, 4, 1)], "dkdv": [(16, 32, 4, 1)], "dq": [(32, 16, 4, 1)]}
        if dry
        else None,
    )
    sec["rows"] = rows
    table = tile_sweep.table_for(suite.device, winners)
    slug = tuning.gpu_slug(table["device"])
    sec["table_file"] = str(Path("tuning_tables") / f"{slug}.json")
    sec["table"] = table
    results.write_json(suite.out / sec["table_file"], table)


def section_training(suite: Suite, sec: dict, deadline: float) -> None:
    runs = sec["runs"] = []
    seqlens, steps = ((64,), 6) if suite.dry else ((1024, 16384), 20)
    for seqlen in seqlens:
        for compile_ in (False, True):
            for attention in ("flash", "sdpa"):
                if suite.dry and compile_ and attention == "sdpa":
                    continue  # a CPU compile takes ~20 s: the dry run compiles our path only
                label = f"S={seqlen} attention={attention} compile={compile_}"
                if time.monotonic() > deadline:
                    runs.append({"seqlen": seqlen, "attention": attention, "compile": compile_,
                                 "tokens_per_s": None, "note": "skipped: budget"})  # fmt: skip
                    continue
                run_dir = suite.out / "training" / f"s{seqlen}-{attention}-c{int(compile_)}"
                try:
                    runs.append(
                        training.run_training(
                            seqlen, attention, compile_, steps, run_dir, suite.dry
                        )
                    )
                except Exception as err:  # noqa: BLE001  (an OOM at 16K must not end the section)
                    runs.append({"seqlen": seqlen, "attention": attention, "compile": compile_,
                                 "tokens_per_s": None, "note": f"failed: {type(err).__name__}: {str(err)[:200]}"})  # fmt: skip
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                print(f"  {label}: {runs[-1].get('tokens_per_s')} tokens/s", flush=True)
                suite.save()


def section_long(suite: Suite, sec: dict, deadline: float) -> None:
    batch, seqlen, heads, head_dim = (1, 256, 2, 16) if suite.dry else (1, 65536, 16, 128)
    dtype = torch.float32 if suite.dry else torch.bfloat16
    q, k, v = random_qkv(batch, seqlen, heads, head_dim, device=suite.device, dtype=dtype)
    rows = sec["rows"] = []
    for causal in (True, False):
        fwd = lambda causal=causal: flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        dims = (batch, heads, seqlen, head_dim)
        rows += bench_method(
            "flashtrain", fwd, (q, k, v), dims, causal, 2 if suite.dry else 5, device=suite.device
        )
        suite.save()


# ---- summary ----------------------------------------------------------------------------------


def _fmt(value, digits=2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def summary_markdown(state: dict) -> str:
    env = state["runs"][-1]
    sections = state["sections"]
    lines = [
        "# GPU suite",
        "",
        f"Device **{env.get('device')}** (capability {env.get('capability', '-')}), torch "
        f"{env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}, commit "
        f"{env.get('commit')}{', DRY RUN (toy sizes on CPU, no figure is a measurement)' if env.get('dry_run') else ''}.",
        "",
        "| section | status | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {s.get('status')} | {s.get('seconds', '-')} |" for n, s in sections.items()]
    corr = sections.get("correctness", {}).get("rows", [])
    if corr:
        failed = [r["case"] for r in corr if r.get("passed") is False]
        lines += ["", f"## Correctness: {len(corr) - len(failed)}/{len(corr)} cases pass"]
        lines += [f"- FAILED: {c}" for c in failed]
    peaks = sections.get("peaks", {})
    if "matmul_peak_tflops" in peaks:
        lines += ["", f"## Peaks: bf16 matmul {_fmt(peaks['matmul_peak_tflops'], 1)} TFLOP/s, "
                  f"copy {_fmt(peaks['copy_bandwidth_gbs'], 0)} GB/s"]  # fmt: skip
    targets = sections.get("attention", {}).get("targets", [])
    if targets:
        lines += [
            "",
            "## Targets (issue 12)",
            "",
            "| target | ratio | goal | pass |",
            "|---|---|---|---|",
        ]
        for t in targets:
            verdict = {True: "PASS", False: "fail", None: "-"}[t["passed"]]
            lines.append(f"| {t['target']} | {_fmt(t['ratio'])} | {t['goal']} | {verdict} |")
    rows = sections.get("attention", {}).get("rows", [])
    if rows:
        lines += ["", results.markdown_table(rows, env, "Attention").split("\n", 3)[-1]]
    sweep = sections.get("sweep", {})
    if sweep.get("rows"):
        lines += ["", f"## Tile sweep: table {sweep.get('table_file')}", "",
                  "| key | config | ms | built-in ms | speedup |", "|---|---|---|---|---|"]  # fmt: skip
        for r in sweep["rows"]:
            c = r["config"]
            cfg = f"{c['block_m']}x{c['block_n']} w{c['num_warps']} s{c['num_stages']}"
            cfg += " tma" if c.get("tma") else ""
            lines.append(
                f"| {r['key']} | {cfg} | {_fmt(r.get('ms'))} | {_fmt(r.get('builtin_ms'))} | {_fmt(r.get('speedup_vs_builtin'))} |"
            )
    runs = sections.get("training", {}).get("runs", [])
    if runs:
        lines += ["", "## GPT-2 training", "",
                  "| seqlen | attention | compile | tokens/s | MFU % | peak GiB | step split (ms) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in runs:
            split = ", ".join(f"{k} {v}" for k, v in r.get("step_split_ms", {}).items()) or r.get(
                "note", ""
            )
            lines.append(f"| {r['seqlen']} | {r['attention']} | {r['compile']} | {_fmt(r.get('tokens_per_s'), 0)} | "
                         f"{_fmt(r.get('mfu_percent'), 1)} | {_fmt(r.get('peak_allocated_gib'))} | {split} |")  # fmt: skip
    long = sections.get("long", {}).get("rows", [])
    if long:
        lines += [
            "",
            "## Long sequence (fwd+bwd)",
            "",
            "| seqlen | causal | ms | TFLOP/s | peak MiB |",
            "|---|---|---|---|---|",
        ]
        for r in long:
            if r["mode"] == "fwd_bwd":
                lines.append(
                    f"| {r['seqlen']} | {r['causal']} | {_fmt(r['ms'])} | {_fmt(r['tflops'], 1)} | {_fmt(r['peak_mib'], 0)} |"
                )
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="results folder (created)")
    p.add_argument("--budget-min", type=float, default=25.0, help="wall-clock budget for this call")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--resume", action="store_true", help="keep the sections DIR already finished")
    p.add_argument("--dry-run", action="store_true", help="every section at toy sizes on CPU")
    p.add_argument("--rep", type=int, default=20, help="timed calls per measurement (about)")
    args = p.parse_args(argv)
    if args.budget_min <= 0:
        p.error(f"--budget-min must be > 0, got {args.budget_min}")
    args.sections = [s for s in SECTIONS if s in args.sections]  # always the protocol's order
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_suite: no CUDA device; use --dry-run to exercise it on CPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    return Suite(args).run(args.sections)


if __name__ == "__main__":
    sys.exit(main())
