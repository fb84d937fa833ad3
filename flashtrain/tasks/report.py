"""What a retrieval evaluation writes: retrieval.json (every cell), retrieval.md (a table per
task: lengths x depths), retrieval_heatmap.png (a panel per task with depths: depth down,
length across, accuracy as colour and number) and retrieval_by_length.png (a curve per task:
accuracy by length, over its depths). Written atomically, beside the run."""

from __future__ import annotations

import json
from pathlib import Path

from flashtrain.data.files import atomic_path
from flashtrain.plots import curves, heatmap, panels, pyplot, save
from flashtrain.tasks.grid import CellResult

FILES = ("retrieval.json", "retrieval.md", "retrieval_heatmap.png", "retrieval_by_length.png")


def length_label(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def payload(facts: dict, settings: dict, cells: list[CellResult]) -> dict:
    """facts: the checkpoint's (run, step, commit...); settings: score, samples, seed, filler.
    tasks[task]: lengths, depths ([None] without depth), accuracy[length][depth],
    logprob_per_token likewise (likelihood scoring), by_length (the mean over depths)."""
    tasks: dict[str, dict] = {}
    for c in cells:
        t = tasks.setdefault(c.task, {"lengths": [], "depths": [], "cells": []})
        if c.length not in t["lengths"]:
            t["lengths"].append(c.length)
        if c.depth not in t["depths"]:
            t["depths"].append(c.depth)
        t["cells"].append(dict(length=c.length, depth=c.depth, samples=c.samples,
                               accuracy=c.accuracy, logprob_per_token=c.logprob_per_token,
                               seconds=round(c.seconds, 3)))  # fmt: skip
    for t in tasks.values():
        at = {(c["length"], c["depth"]): c for c in t["cells"]}
        t["accuracy"] = [[at[(n, d)]["accuracy"] for d in t["depths"]] for n in t["lengths"]]
        t["logprob_per_token"] = [
            [at[(n, d)]["logprob_per_token"] for d in t["depths"]] for n in t["lengths"]
        ]
        t["by_length"] = [_mean(row) for row in t["accuracy"]]
    return dict(**facts, settings=settings, tasks=tasks)


def _depth_label(depth) -> str:
    return "-" if depth is None else f"{depth:g}"


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        f"# Retrieval of {report['run']} at step {report['step']}",
        "",
        f"Checkpoint `{report['checkpoint']}` (commit `{report['commit']}`), trained at "
        f"seq_len {report['trained_seq_len']}. Accuracy in % ({s['score']} scoring, greedy; "
        f"{s['samples']} samples per cell, seed {s['seed']}); a length counts prompt and answer "
        "tokens; depth 0 = the needle right after the instructions, 1 = right before the question.",
        "",
        "| task | " + " | ".join(length_label(n) for n in _all_lengths(report)) + " |",
        "|---|" + "---:|" * len(_all_lengths(report)),
    ]
    notes = s.get("notes") or []
    for name, t in report["tasks"].items():
        by = dict(zip(t["lengths"], t["by_length"]))
        lines.append(
            f"| {name} | " + " | ".join(_pct(by.get(n)) for n in _all_lengths(report)) + " |"
        )
    for name, t in report["tasks"].items():
        lines += ["", f"## {name}", "", "| length \\ depth | "
                  + " | ".join(_depth_label(d) for d in t["depths"]) + " | mean |",
                  "|---|" + "---:|" * (len(t["depths"]) + 1)]  # fmt: skip
        for n, row, mean in zip(t["lengths"], t["accuracy"], t["by_length"]):
            lines.append(
                f"| {length_label(n)} | " + " | ".join(_pct(v) for v in row) + f" | {_pct(mean)} |"
            )
    if notes:
        lines += ["", "Notes: " + "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def _pct(value) -> str:
    return "-" if value is None or value != value else f"{100 * value:.0f}"


def _all_lengths(report: dict) -> list[int]:
    return sorted({n for t in report["tasks"].values() for n in t["lengths"]})


def plot_heatmaps(report: dict, path: Path) -> Path | None:
    """A panel per task that has depths, three to a row; None when no task has one."""
    with_depth = {n: t for n, t in report["tasks"].items() if t["depths"] != [None]}
    if not with_depth:
        return None
    columns = min(3, len(with_depth))
    rows = -(-len(with_depth) // columns)
    width = max(4.0, 0.6 * max(len(t["lengths"]) for t in with_depth.values()) + 3.0)
    height = max(3.4, 0.3 * max(len(t["depths"]) for t in with_depth.values()) + 1.8)
    fig, axes = pyplot().subplots(rows, columns, figsize=(width * columns, height * rows),
                                  squeeze=False)  # fmt: skip
    for ax, (name, t) in zip(axes.flat, with_depth.items()):
        by_depth = [[row[j] for row in t["accuracy"]] for j in range(len(t["depths"]))]
        heatmap(ax, by_depth, rows=[_depth_label(d) for d in t["depths"]],
                columns=[length_label(n) for n in t["lengths"]],
                title=f"{name}: {report['run']} step {report['step']}",
                xlabel="context length (tokens)", ylabel="needle depth (0 = start)")  # fmt: skip
    for ax in list(axes.flat)[len(with_depth) :]:
        ax.axis("off")
    return save(fig, path)


def plot_by_length(report: dict, path: Path) -> Path:
    fig, (ax,) = panels(1, width=6.0, height=4.0)
    series = {name: (t["lengths"], t["by_length"]) for name, t in report["tasks"].items()}
    curves(ax, series, title=f"{report['run']} step {report['step']}: retrieval by length",
           xlabel="context length (tokens)", ylabel="accuracy (mean over depths)", logx=True,
           marker="o")  # fmt: skip
    ax.set_ylim(-0.03, 1.03)
    return save(fig, path)


def write(report: dict, out: Path) -> list[Path]:
    out = Path(out)
    paths = [out / FILES[0], out / FILES[1]]
    with atomic_path(paths[0]) as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
    with atomic_path(paths[1]) as tmp:
        tmp.write_text(markdown(report))
    heat = plot_heatmaps(report, out / FILES[2])
    if heat is not None:
        paths.append(heat)
    paths.append(plot_by_length(report, out / FILES[3]))
    return paths
