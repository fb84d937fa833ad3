"""Attention kernel benchmark: flashtrain vs torch SDPA (each backend) and FlexAttention.

    python scripts/bench_attention.py                       # dense sweep, bf16, 512..64K tokens
    python scripts/bench_attention.py --sweep window        # sliding windows: cost linear in seqlen
    python scripts/bench_attention.py --seqlens 4096 16384 --head-dims 128 --causal false

Writes JSON, a markdown table and PNG plots to benchmarks/results/. Without CUDA it says so,
runs a tiny CPU smoke of the op and prints kernel tile counts (the CPU stand-in for timing).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from pathlib import Path

import torch

from flashtrain.attention import flash_attn_func
from flashtrain.lab.bench import baselines, measure, results
from flashtrain.lab.bench.attention_rows import attention_row as _row
from flashtrain.lab.bench.attention_rows import bench_method, random_qkv
from flashtrain.lab.checkout import RESULTS

TOKENS = 16384  # batch * seqlen held fixed, as in the FlashAttention papers
HIDDEN = 2048  # heads * head_dim


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sweep", choices=["dense", "window", "blocksparse"], default="dense")
    p.add_argument("--seqlens", type=int, nargs="+", default=None, help="default: per sweep")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", choices=["both", "true", "false"], default="both")
    p.add_argument("--windows", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--methods", nargs="*", default=None, help="subset of method names to run")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--tag", default=date.today().isoformat())
    p.add_argument("--rep", type=int, default=20)
    args = p.parse_args(argv)
    if args.seqlens is None:  # the block-sparse sweep is about long sequences
        args.seqlens = (
            [4096, 8192, 16384, 32768, 65536]
            if args.sweep == "blocksparse"
            else [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
        )
    return args


def causal_flags(choice: str) -> list[bool]:
    return {"both": [False, True], "true": [True], "false": [False]}[choice]


def shape_for(seqlen: int, head_dim: int) -> tuple[int, int]:
    return max(1, TOKENS // seqlen), HIDDEN // head_dim


def dense_sweep(args) -> list[dict]:
    rows = []
    for head_dim in args.head_dims:
        for causal in causal_flags(args.causal):
            for seqlen in args.seqlens:
                batch, heads = shape_for(seqlen, head_dim)
                q, k, v = random_qkv(batch, seqlen, heads, head_dim, device="cuda")
                for name, method in baselines.dense_methods(q, k, v, causal=causal).items():
                    if args.methods and name not in args.methods:
                        continue
                    dims = (batch, heads, seqlen, head_dim)
                    if isinstance(method, str):
                        for mode in ("fwd", "bwd", "fwd_bwd"):
                            rows.append(_row(name, mode, None, None, method, dims, causal, 1.0, ""))
                        continue
                    t0 = time.time()
                    new = bench_method(name, *method, dims, causal, args.rep)
                    rows += new
                    both = next(r for r in new if r["mode"] == "fwd_bwd")
                    shown = f"{both['tflops']:.1f} TFLOP/s" if both["tflops"] else both["note"]
                    print(
                        f"d={head_dim} causal={causal} seqlen={seqlen:6d} {name:28s} fwd+bwd {shown} "
                        f"({time.time() - t0:.1f}s)",
                        flush=True,
                    )
    return rows


def window_sweep(args) -> list[dict]:
    """Ours with a causal sliding window vs ours dense-causal: time should grow linearly."""
    rows = []
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            batch, heads = shape_for(seqlen, head_dim)
            q, k, v = random_qkv(batch, seqlen, heads, head_dim, device="cuda")
            dims = (batch, heads, seqlen, head_dim)
            for window in [None, *args.windows]:
                if window is not None and window >= seqlen:
                    continue
                ws = (-1, 0) if window is None else (window, 0)
                fn = lambda ws=ws, q=q, k=k, v=v: flash_attn_func(
                    q, k, v, causal=True, window_size=ws
                )
                # Density: the fraction of the causal triangle inside the band.
                kept = (
                    seqlen * (seqlen + 1) / 2
                    if window is None
                    else sum(min(i + 1, window + 1) for i in range(seqlen))
                )
                density = kept / (seqlen * (seqlen + 1) / 2)
                variant = "dense causal" if window is None else f"window {window}"
                new = bench_method(
                    "flashtrain", fn, (q, k, v), dims, True, args.rep, density, variant
                )
                rows += [dict(r, method=f"flashtrain ({variant})") for r in new]
                ms = next(r["ms"] for r in new if r["mode"] == "fwd_bwd")
                print(f"d={head_dim} seqlen={seqlen:6d} {variant:14s} fwd+bwd {ms} ms", flush=True)
    return rows


# (pattern, its arguments): densities from ~1% to ~30% at 64K tokens
SPARSE_POINTS = [
    ("butterfly", {}),
    ("butterfly", {"diag_blocks": 8}),
    ("local", {"window_blocks": 1}),
    ("local", {"window_blocks": 8}),
    ("local", {"window_blocks": 25}),
    ("local", {"window_blocks": 80}),
]


def sparse_layouts(seqlen: int, block_size: int = 128):
    from flashtrain.attention import sparsity

    for name, kwargs in SPARSE_POINTS:
        layout = sparsity.PATTERNS[name](seqlen, block_size=block_size, **kwargs)
        yield f"{name}({', '.join(f'{k}={v}' for k, v in kwargs.items())})", layout


def blocksparse_sweep(args) -> list[dict]:
    """Ours vs FlexAttention on the same layouts, plus dense flash_attn_func, vs density."""
    rows = []
    for head_dim in args.head_dims:
        for causal in causal_flags(args.causal):
            for seqlen in args.seqlens:
                batch, heads = shape_for(seqlen, head_dim)
                q, k, v = random_qkv(batch, seqlen, heads, head_dim, device="cuda")
                dims = (batch, heads, seqlen, head_dim)
                dense = (
                    lambda q=q, k=k, v=v, c=causal: flash_attn_func(q, k, v, causal=c),
                    (q, k, v),
                )
                rows += [
                    dict(r, method="flashtrain dense")
                    for r in bench_method(
                        "flashtrain", *dense, dims, causal, args.rep, 1.0, "dense"
                    )
                ]
                for variant, layout in sparse_layouts(seqlen):
                    tables = layout.tables(seqlen, seqlen, causal, "cuda")
                    visited = tables.blocks_visited() / layout.block_mask[0].numel()
                    # FLOPs count only the kept blocks (and causal halves them again below).
                    density = visited * (2.0 if causal else 1.0)
                    for name, method in baselines.blocksparse_methods(
                        q, k, v, layout, causal=causal
                    ).items():
                        if isinstance(method, str):
                            continue
                        new = bench_method(name, *method, dims, causal, args.rep, density, variant)
                        rows += new
                        ms = next(r["ms"] for r in new if r["mode"] == "fwd_bwd")
                        print(
                            f"d={head_dim} causal={causal} seqlen={seqlen:6d} {variant:28s} "
                            f"density={layout.density:.3f} {name:10s} fwd+bwd {ms} ms",
                            flush=True,
                        )
    return rows


def cpu_report(args) -> int:
    """No CUDA: a tiny smoke of the op, and the tile counts the kernels would stream
    (printed, and written as markdown: operation counts, not timings)."""
    from flashtrain.kernels.visit_counts import key_blocks_visited

    print("No CUDA device: the GPU benchmark is skipped (no timings are claimed on CPU).")
    q, k, v = (torch.randn(1, 64, 2, 32, requires_grad=True) for _ in range(3))
    t0 = time.time()
    flash_attn_func(q, k, v, causal=True).sum().backward()
    print(f"CPU smoke: flash_attn_func fwd+bwd (1x64x2x32, causal) ran in {time.time() - t0:.2f}s")
    lines = [
        "# Kernel work by tile counts (CPU, no GPU timings)",
        "",
        "Key tiles the forward kernel streams per (batch, head), 128x64 tiles; sliding windows are causal.",
        "",
        "| seqlen | dense | causal | " + " | ".join(f"window {w}" for w in args.windows) + " |",
        "|---|---|---|" + "---|" * len(args.windows),
    ]
    for seqlen in args.seqlens:
        counts = [
            key_blocks_visited(seqlen, seqlen),
            key_blocks_visited(seqlen, seqlen, causal=True),
        ]
        counts += [
            key_blocks_visited(seqlen, seqlen, window_left=w, causal=True) for w in args.windows
        ]
        lines.append(f"| {seqlen} | " + " | ".join(str(c) for c in counts) + " |")
    lines += [
        "",
        "Block-sparse: 128x128 blocks visited per (batch, head), non-causal, from the layout tables",
        "the kernels iterate (tests check the kernels' own visit counts against them).",
        "",
        "| seqlen | layout | blocks visited | of dense |",
        "|---|---|---|---|",
    ]
    for seqlen in [s for s in args.seqlens if s >= 4096]:
        n = -(-seqlen // 128)
        for variant, layout in sparse_layouts(seqlen):
            visited = layout.tables(seqlen, seqlen, False, "cpu").blocks_visited()
            lines.append(f"| {seqlen} | {variant} | {visited} | {visited / (n * n):.2%} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "tile-counts-cpu.md").write_text(text)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        return cpu_report(args)
    env = measure.environment()
    env["matmul_peak_tflops"] = measure.matmul_peak_tflops()
    env["copy_bandwidth_gbs"] = measure.copy_bandwidth_gbs()
    print(
        f"{env['device']}: bf16 matmul {env['matmul_peak_tflops']:.0f} TFLOP/s, "
        f"copy {env['copy_bandwidth_gbs']:.0f} GB/s",
        flush=True,
    )
    sweeps = {"dense": dense_sweep, "window": window_sweep, "blocksparse": blocksparse_sweep}
    rows = sweeps[args.sweep](args)
    stem = f"attention-{args.sweep}-{results.slug(env['device'])}-{args.tag}"
    results.write_json(
        args.out_dir / f"{stem}.json",
        {"env": env, "args": vars(args) | {"out_dir": str(args.out_dir)}, "rows": rows},
    )
    (args.out_dir / f"{stem}.md").write_text(
        results.markdown_table(rows, env, f"Attention benchmark ({args.sweep})")
        + "\n"
        + results.markdown_table(rows, env, "Peak memory", value="peak_mib", unit="MiB").split(
            "\n", 3
        )[-1]
    )
    results.plot(rows, args.out_dir / f"{stem}-tflops.png", "tflops", "TFLOP/s", "fwd_bwd")
    results.plot(rows, args.out_dir / f"{stem}-memory.png", "peak_mib", "peak MiB", "fwd_bwd")
    print(f"wrote {args.out_dir / stem}.{{json,md}} and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
