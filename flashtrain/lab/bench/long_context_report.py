"""The long-context benchmark's results on disk (long_context.py): the markdown table, the JSON
and the plot, device and versions named."""

from __future__ import annotations

from pathlib import Path

from flashtrain.lab.bench.results import slug, write_json

GIB = 2**30
NOT_MEASURED = (
    "one rank of a P-rank context-parallel group on one GPU: its compute and memory; the "
    "all-to-all / P2P communication is NOT measured (a fake process group makes it a no-op)"
)


# ---- Results on disk ------------------------------------------------------------------------


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_rows(rows: list[dict]) -> list[str]:
    """The rows as a markdown table (the script's .md and the GPU suite's summary.md)."""
    lines = ["| mode | P | tokens/GPU | context | recompute | tile | ms/layer | attention ms/layer "
             "| tokens/s/GPU/layer | model TFLOP/s | peak GiB | host pinned GiB | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        pinned = r.get("host_pinned_bytes")
        lines.append(
            f"| {r['label']} | {r['ranks']} | {r['tokens_per_gpu']} | {r['context']} | "
            f"{r['recompute']} | {r['tile_tokens'] or '-'} | {fmt(r.get('ms_per_layer'))} | "
            f"{fmt(r.get('attention_ms_per_layer'))} | "
            f"{fmt(r.get('tokens_per_s_per_gpu_layer'), 0)} | {fmt(r.get('model_tflops'))} | "
            f"{fmt(r.get('peak_gib'), 2)} | {fmt(pinned / GIB if pinned else None, 2)} | "
            f"{r.get('note', '')} |"
        )
    return lines


def write_results(rows, skipped, setup: dict, env: dict, out: Path, dry: bool) -> Path:
    """long-context-<device>[-dry].{json,md,png} in `out`; returns the path without suffix."""
    name = out / (f"long-context-{slug(env['device'])}" + ("-dry" if dry else ""))
    write_json(name.with_suffix(".json"), {"env": env, "dry": dry, "setup": setup, "rows": rows,
                                           "skipped": skipped})  # fmt: skip
    shape = setup["shape"]
    dry_note = " DRY RUN: toy sizes on CPU, no figure is a measurement." if dry else ""
    lines = [
        f"# Long-context layers by context-parallel mode ({setup['layers']} Llama blocks "
        f"d_model {shape['d_model']}, {shape['n_head']}/{shape['n_kv_head']} heads, SwiGLU "
        f"{shape['d_ff']}, {setup['dtype']})", "",
        f"Device: **{env['device']}**, torch {env['torch']}, triton {env['triton']}, CUDA "
        f"{env['cuda']}, commit {env['commit']}.{dry_note}", "",
        f"What is measured: {NOT_MEASURED}. Layout {setup['layout']}, the busiest rank played; "
        f"{setup['warmup']} untimed and {setup['rep']} timed forward + backward per row, figures "
        "per layer (the stack's / layers); attention: the op's forward (recompute included) and "
        "backward inside the same calls; peak: max allocated during the timed calls (weights, "
        "input, its gradient and the incoming one included); model TFLOP/s: 6 N T + 3.5x the "
        "attention forward, recompute not counted.", "",
        *markdown_rows(rows),
    ]  # fmt: skip
    if skipped:
        lines += ["", f"Skipped to fit --budget-s {setup['budget_s']} (time estimated from the "
                  "FLOPs at the rate measured so far, or the assumed one before any row):"]  # fmt: skip
        lines += [f"- {s['name']}: estimated {s['estimated_s']:.0f} s at {s['tflops']:.0f} "
                  f"TFLOP/s, {s['left_s']:.0f} s left" for s in skipped]  # fmt: skip
    name.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(rows, name.with_suffix(".png"), f"{env['device']}{' (DRY RUN)' if dry else ''}")
    return name


def plot(rows: list[dict], path: Path, device: str) -> None:
    """tokens/s per GPU per layer and peak GiB vs tokens per GPU, a line per mode and variant
    (nothing without matplotlib, or without a measured row)."""
    if not any(r.get("ms_per_layer") for r in rows):
        return
    try:
        import matplotlib
    except ImportError:
        print("no matplotlib: no plot", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 4))
    lines: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("ms_per_layer"):
            tile = f" tile {r['tile_tokens']}" if r["tile_tokens"] else ""
            lines.setdefault(f"{r['label']}, {r['recompute']}{tile}", []).append(r)
    for label, points in lines.items():
        points.sort(key=lambda r: r["tokens_per_gpu"])
        tokens = [r["tokens_per_gpu"] for r in points]
        speed.plot(tokens, [r["tokens_per_s_per_gpu_layer"] for r in points], marker="o",
                   label=label)  # fmt: skip
        if points[0].get("peak_gib") is not None:
            memory.plot(tokens, [r["peak_gib"] for r in points], marker="o", label=label)
    speed.set(xscale="log", xlabel="tokens per GPU", ylabel="tokens/s per GPU per layer")
    memory.set(xscale="log", xlabel="tokens per GPU", ylabel="peak GiB (CUDA only)")
    for ax in (speed, memory):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    speed.legend(fontsize=7)
    ranks = ", ".join(str(p) for p in sorted({r["ranks"] for r in rows}))
    fig.suptitle(f"one rank of P={ranks} on {device}, communication not measured")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
