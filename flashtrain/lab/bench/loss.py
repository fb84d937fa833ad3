"""LM-head loss benchmark: time and peak memory of forward + backward, method by method.

    python scripts/bench_loss.py                              # GPT-2 head (V 50257, C 768), 1K..64K tokens
    python scripts/bench_loss.py --tokens 1024 16384 --methods chunked plain
    python scripts/bench_loss.py --measure chunked --tokens 16384 --hidden 64   # one point, JSON on stdout

Methods (mean loss over the tokens, then backward; flashtrain/lab/bench/loss_methods.py):
  fused    flashtrain's Triton kernel (impl="fused"): logits never in memory (CUDA only here; on a
           CPU its evidence is its exactness under the interpreter, tests/models/test_loss_fused.py)
  chunked  flashtrain's PyTorch path (impl="chunked", 2048-token chunks)
  compiled a chunked cross-entropy under torch.compile (its compile is outside the timing)
  liger    Liger-Kernel's fused linear cross-entropy (CUDA, where liger-kernel is installed)
  plain    F.cross_entropy(h @ W.T): the full (tokens, vocab) logits
The GPU suite's loss section (flashtrain/lab/gpu_suite/loss_section.py) times the same methods
in one process, with their agreement checked first.
Every point runs in its own process, so peak memory is that process's alone: on CUDA the peak
allocated bytes beyond the inputs, on CPU the peak resident set (VmHWM, reset before the call)
beyond the resident set with the inputs in place (glibc told to map large blocks one by one:
EXACT_RSS_ENV). Plain points whose logits, log-softmax and gradient (3 * tokens * vocab
* 4 bytes) exceed --max-plain-gib are skipped on CPU (the machine is shared), and say so.
CUDA runs bf16 inputs; CPU runs float32. Writes JSON (device, versions, commit), a markdown table and
a PNG plot to benchmarks/results/loss-<device>-<tag>.*.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

from flashtrain.lab.bench import measure, results
from flashtrain.lab.bench.loss_methods import METHODS, loss_fn, unavailable
from flashtrain.lab.checkout import REPO, RESULTS

# glibc: blocks of 64 KiB and more get their own mapping, returned when freed (a fixed threshold
# also stops glibc from raising it and keeping freed tensors resident), so the resident set
# follows the live tensors and peaks are comparable between methods.
EXACT_RSS_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536]
    )
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=None,
        help="default: all on CUDA (liger where installed), chunked, compiled and plain on CPU",
    )
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument(
        "--rep",
        type=int,
        default=None,
        help="timed runs (median); default 20 on CUDA, on CPU 3 up to 4096 tokens else 1",
    )
    p.add_argument(
        "--max-plain-gib",
        type=float,
        default=8.0,
        help="CPU: skip plain points whose logits would need more",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per point")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--tag", default=date.today().isoformat())
    p.add_argument("--measure", choices=METHODS, help="measure one point in this process")
    return p.parse_args(argv)


def _status_bytes(field: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, from /proc/self/status."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def _reset_peak_rss() -> None:
    """Start VmHWM afresh at the current resident set (Linux >= 4.0). Not getrusage's ru_maxrss:
    after fork + exec it starts at the parent's resident set, a large pytest or driver process
    would hide the child's own peak."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure_point(method: str, tokens: int, hidden: int, vocab: int, chunk_size: int, rep) -> dict:
    """One (method, tokens) point in this process: {"ms", "peak_mib", "note"}."""
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    skip = unavailable(method, device)
    if skip:
        return {"ms": None, "peak_mib": None, "note": skip}
    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, device=device, dtype=dtype).requires_grad_()
    w = (0.02 * torch.randn(vocab, hidden, device=device, dtype=dtype)).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device=device)
    fn = loss_fn(method, h, w, y, chunk_size)
    if cuda:  # measure's first call compiles (compiled, liger), untimed
        baseline = method in ("plain", "compiled", "liger")
        m = measure.measure(fn, warmup=3, rep=rep or 20, baseline=baseline)
        return {"ms": m.ms, "peak_mib": m.peak_mib, "note": m.note}
    rep = rep or (3 if tokens <= 4096 else 1)
    # Lazy initialisation (imports, thread pools, the interpreter) stays resident: do it first.
    small = [t[:64].detach().clone().requires_grad_(t.requires_grad) for t in (h, w)]
    loss_fn(method, *small, y[:64] % 64, chunk_size)()
    del small
    if method == "compiled":  # its compile is per shape: never inside the timed calls
        fn()
    base = _status_bytes("VmRSS")
    _reset_peak_rss()
    times = []
    for i in range(rep):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
        if i == 0:  # the first call's high-water mark: nothing of the loss was resident before
            peak = _status_bytes("VmHWM") - base
    return {"ms": sorted(times)[len(times) // 2], "peak_mib": peak / 2**20, "note": ""}


def run_point(args, method: str, tokens: int) -> dict:
    """measure_point in a fresh process (its own peak memory, an OOM or kill stays a note)."""
    cmd = [
        sys.executable,
        "-m",
        __spec__.name,  # this module, in a fresh process
        "--measure",
        method,
        "--tokens",
        str(tokens),
        "--hidden",
        str(args.hidden),
        "--vocab",
        str(args.vocab),
        "--chunk-size",
        str(args.chunk_size),
    ] + (["--rep", str(args.rep)] if args.rep else [])
    env = dict(os.environ, PYTHONPATH=str(REPO), **EXACT_RSS_ENV)
    env.pop("TRITON_INTERPRET", None)  # benchmark the real paths, never the interpreter
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"ms": None, "peak_mib": None, "note": f"timeout after {args.timeout:.0f}s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["killed"])[-1]
        return {
            "ms": None,
            "peak_mib": None,
            "note": f"failed (exit {done.returncode}): {last[:160]}",
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def plain_too_big(args, tokens: int) -> str:
    need_gib = 3 * tokens * args.vocab * 4 / 2**30
    if not torch.cuda.is_available() and need_gib > args.max_plain_gib:
        return f"skipped: needs ~{need_gib:.1f} GiB > --max-plain-gib {args.max_plain_gib:g}"
    return ""


def markdown(rows: list[dict], env: dict, args) -> str:
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    cell = {(r["tokens"], r["method"]): r for r in rows}
    ratios = [
        (a, b)
        for a, b in (("fused", "chunked"), ("fused", "plain"), ("chunked", "plain"))
        if a in methods and b in methods
    ]
    lines = [
        f"# LM-head loss: forward + backward, vocab {args.vocab}, hidden {args.hidden}",
        "",
        f"Device: **{env.get('device')}**, torch {env.get('torch')}, triton {env.get('triton')}, "
        f"CUDA {env.get('cuda')}, commit {env.get('commit')}. Inputs "
        f"{'bf16' if env.get('device') != 'cpu' else 'float32'}; peak = extra memory of the loss "
        f"({'allocated' if env.get('device') != 'cpu' else 'resident set'}) beyond its inputs.",
        "",
        "| tokens | "
        + " | ".join(f"{m} ms | {m} peak MiB" for m in methods)
        + "".join(f" | {a}/{b} time | {a}/{b} memory" for a, b in ratios)
        + " |",
        "|---|" + "---|---|" * len(methods) + "---|---|" * len(ratios),
    ]

    def fmt(r, key):
        if r is None:
            return ""
        return f"{r[key]:.1f}" if r.get(key) is not None else r.get("note", "-").split(":")[0]

    def ratio(a, b, key):
        if a is None or b is None or a.get(key) is None or b.get(key) is None or not b[key]:
            return ""
        return f"{a[key] / b[key]:.3f}"

    for t in sorted({r["tokens"] for r in rows}):
        vals = []
        for m in methods:
            r = cell.get((t, m))
            vals += [fmt(r, "ms"), fmt(r, "peak_mib")]
        for a, b in ratios:
            ra, rb = cell.get((t, a)), cell.get((t, b))
            vals += [ratio(ra, rb, "ms"), ratio(ra, rb, "peak_mib")]
        lines.append(f"| {t} | " + " | ".join(vals) + " |")
    if env.get("device") == "cpu":
        loads = [r["load_avg_1min"] for r in rows]
        lines += [
            "",
            f"CPU timings on a shared machine ({env.get('cpu_threads')} threads): 1-minute load "
            f"average {min(loads):.1f} to {max(loads):.1f} at the start of the points (per point "
            "in the JSON); the memory figures do not depend on it.",
        ]
    notes = sorted({f"{r['method']} at {r['tokens']}: {r['note']}" for r in rows if r["note"]})
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (key, label) in zip(axes, (("ms", "ms, fwd + bwd"), ("peak_mib", "peak MiB"))):
        for method in METHODS:
            pts = sorted((r["tokens"], r[key]) for r in rows if r["method"] == method and r[key])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.measure:
        point = measure_point(
            args.measure, args.tokens[0], args.hidden, args.vocab, args.chunk_size, args.rep
        )
        print(json.dumps(point))
        return 0
    cuda = torch.cuda.is_available()
    methods = args.methods or (list(METHODS) if cuda else ["chunked", "compiled", "plain"])
    if not cuda and "fused" in methods:
        print(
            "No CUDA: the fused kernel is not timed on CPU (its CPU evidence is its exactness "
            "under TRITON_INTERPRET=1); dropping it."
        )
        methods = [m for m in methods if m != "fused"]
    env = measure.environment()
    if not cuda:
        env["cpu_threads"] = torch.get_num_threads()
    rows = []
    for tokens in args.tokens:
        for method in methods:
            device = "cuda" if cuda else "cpu"
            skip = plain_too_big(args, tokens) if method == "plain" else unavailable(method, device)
            load = os.getloadavg()[0]  # CPU timings on a shared machine: how busy it was
            t0 = time.time()
            point = (
                {"ms": None, "peak_mib": None, "note": skip}
                if skip
                else run_point(args, method, tokens)
            )
            rows.append(
                {
                    "method": method,
                    "tokens": tokens,
                    "vocab": args.vocab,
                    "hidden": args.hidden,
                    "load_avg_1min": round(load, 2),
                    **point,
                }
            )
            shown = (
                f"{point['ms']:.1f} ms, {point['peak_mib']:.1f} MiB"
                if point["ms"]
                else point["note"]
            )
            print(f"{tokens:6d} tokens {method:8s} {shown} ({time.time() - t0:.0f}s)", flush=True)
    stem = f"loss-{results.slug(env['device'])}-{args.tag}"
    results.write_json(
        args.out_dir / f"{stem}.json",
        {"env": env, "args": vars(args) | {"out_dir": str(args.out_dir)}, "rows": rows},
    )
    text = markdown(rows, env, args)
    (args.out_dir / f"{stem}.md").write_text(text)
    plot(rows, args.out_dir / f"{stem}.png")
    print("\n" + text + f"\nwrote {args.out_dir / stem}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
