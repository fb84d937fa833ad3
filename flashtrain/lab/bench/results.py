"""Benchmark results to disk: JSON (everything), a markdown table, and PNG plots."""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_json(path: Path, payload: dict) -> None:
    """Atomic: a killed run never leaves a half-written result file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def markdown_table(rows: list[dict], env: dict, title: str, value="tflops", unit="TFLOP/s") -> str:
    """One table per (head_dim, causal, mode, extra) group: seqlen down, methods across."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["head_dim"], row["causal"], row["mode"], row.get("variant", ""))].append(row)
    lines = [
        f"# {title}",
        "",
        f"Device: **{env.get('device')}**, torch {env.get('torch')}, triton {env.get('triton')}, "
        f"CUDA {env.get('cuda')}, commit {env.get('commit')}.",
    ]
    if "matmul_peak_tflops" in env:
        lines.append(
            f"Measured bf16 matmul peak {env['matmul_peak_tflops']:.0f} TFLOP/s, "
            f"copy bandwidth {env['copy_bandwidth_gbs']:.0f} GB/s."
        )
    for (head_dim, causal, mode, variant), group in sorted(groups.items(), key=str):
        methods = sorted({r["method"] for r in group}, key=lambda m: (m != "flashtrain", m))
        seqlens = sorted({r["seqlen"] for r in group})
        cell = {(r["seqlen"], r["method"]): r for r in group}
        name = f"head_dim {head_dim}, {'causal' if causal else 'non-causal'}, {mode}"
        lines += ["", f"## {name}{', ' + variant if variant else ''} ({unit})", ""]
        lines.append("| seqlen | " + " | ".join(methods) + " |")
        lines.append("|---|" + "---|" * len(methods))
        for s in seqlens:
            vals = []
            for m in methods:
                r = cell.get((s, m))
                if r is None:
                    vals.append("")
                elif r.get(value) is None:
                    vals.append(r.get("note", "-").split(":")[0])
                else:
                    vals.append(f"{r[value]:.1f}")
            lines.append(f"| {s} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def plot(
    rows: list[dict], path: Path, value: str, ylabel: str, mode: str, log_y: bool = False
) -> None:
    """One panel per (head_dim, causal): value vs seqlen, a line per method (log_y: log y axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["mode"] == mode and r.get(value) is not None]
    panels = sorted({(r["head_dim"], r["causal"]) for r in rows})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, (head_dim, causal) in zip(axes[0], panels):
        panel = [r for r in rows if r["head_dim"] == head_dim and r["causal"] == causal]
        for method in sorted({r["method"] for r in panel}):
            pts = sorted((r["seqlen"], r[value]) for r in panel if r["method"] == method)
            ax.plot(
                *zip(*pts), marker="o", label=method, linewidth=2.5 if method == "flashtrain" else 1
            )
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
        ax.set_title(f"d={head_dim}, {'causal' if causal else 'non-causal'}, {mode}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bar_plot(labels: list[str], values: list[float | None], path: Path, ylabel: str) -> None:
    """One bar per label (a value of None draws no bar); nothing is written without values."""
    if not any(v is not None for v in values):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(labels)), 3.8))
    ax.bar(range(len(labels)), [v or 0.0 for v in values])
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
