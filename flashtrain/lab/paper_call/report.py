"""The call's report from its record (call.json): call.md, context-length.png, pathfinder.png.

Context-length: each run's held-out loss at its own context on the same tokens (the position
evaluation), against the mean of the two 1K seeds, with the seed-to-seed spread as the bar a
longer context must clear (the issue's target), and the loss by token position. Pathfinder: the
validation accuracy through each run with chance marked, and whether the last one is above chance
by 3 binomial standard deviations. Every command the call ran, with its exit code and time.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from flashtrain import plots
from flashtrain.data.files import atomic_path
from flashtrain.lab.reports.markdown import fmt, image, table
from flashtrain.train.metric_names import (
    EVAL_ACCURACY,
    TOKENS_PER_S,
    TRAIN_ACCURACY,
    TRAIN_TOKENS_SEEN,
)
from flashtrain.utils import missing_modules

REPORT = "call.md"
CONTEXT_PNG = "context-length.png"
PATHFINDER_PNG = "pathfinder.png"
PAPER = (
    "The paper (FlashAttention, Table 4 and Sec. 4.2): GPT-2 small on OpenWebText at equal "
    "training tokens, perplexity 18.2 (1K) -> 17.5 (4K), days on 8 A100s; Path-X (16K) 61.4% "
    "and Path-256 (64K) 63.1% where earlier Transformers were at chance (50%). These runs are "
    "minutes on one GPU on other data: only the direction is comparable."
)


def all_done(record: dict) -> bool:
    return all(p["status"].startswith("done") for p in record.get("phases", {}).values())


def evaluated(run: dict) -> dict | None:
    """The run's position evaluation at its own context (eval.json's one length)."""
    lengths = (run.get("evaluation") or {}).get("lengths") or []
    return lengths[0] if lengths else None


def _last(run: dict, key: str):
    values = [row[key] for row in run.get("train", []) if row.get(key) is not None]
    return values[-1] if values else None


def _median(run: dict, key: str):
    """The median over the logged intervals after the first (its compiles), or the only one."""
    rows = run.get("train", [])
    values = [row[key] for row in rows[1:] or rows if row.get(key) is not None]
    return statistics.median(values) if values else None


def context_verdict(runs: list[dict]) -> dict:
    """The 1K mean and seed spread, and per longer context its gain over that mean and
    whether the gain is larger than the spread (None where a loss is missing)."""
    losses = {}
    short = []
    for run in runs:
        e = evaluated(run)
        if e is None:
            continue
        if run["seq_len"] == min(r["seq_len"] for r in runs):
            short.append(e["loss"])
        else:
            losses[run["seq_len"]] = e["loss"]
    if len(short) < 2:
        return {"short_mean": statistics.mean(short) if short else None, "spread": None,
                "gains": {}}  # fmt: skip
    mean, spread = statistics.mean(short), max(short) - min(short)
    gains = {ctx: {"gain": mean - loss, "beats_spread": mean - loss > spread}
             for ctx, loss in sorted(losses.items())}  # fmt: skip
    return {"short_mean": mean, "spread": spread, "gains": gains}


def _context_section(record: dict) -> list[str]:
    section = record.get("context_length") or {}
    runs = [r for r in section.get("runs", []) if "skipped" not in r]
    lines = ["## Context length: GPT-2 on pysrc bytes, equal tokens at every context\n"]
    phase = record.get("phases", {}).get("context-length", {})
    lines.append(f"Status: {phase.get('status', 'not started')}. Steps per run: "
                 f"{section.get('steps', '-')} (the same for every run: equal tokens).\n")  # fmt: skip
    if not runs:
        return lines
    verdict = context_verdict(runs)
    rows = []
    for r in runs:
        e = evaluated(r) or {}
        gain = verdict["gains"].get(r["seq_len"], {})
        rows.append([r["seq_len"], r.get("seed", "-"), f"`{r['name']}`",
                     f"{r['steps']}/{r['planned_steps']}", fmt(_last(r, TRAIN_TOKENS_SEEN), 0),
                     fmt(r["seconds"], 1), fmt(_median(r, TOKENS_PER_S), 0),
                     fmt(e.get("loss"), 4), fmt(e.get("bits_per_byte"), 4),
                     fmt(gain.get("gain"), 4), r.get("stopped") or f"exit {r['exit_code']}"])  # fmt: skip
    header = ["context", "seed", "run", "steps", "tokens seen", "train s", "tokens/s",
              "held-out loss (nats/token)", "bits/byte",
              "gain over the shortest context (its seeds' mean)", "end"]  # fmt: skip
    lines.append(table(header, rows))
    evaluation = next((r["evaluation"] for r in runs if r.get("evaluation")), None)
    if evaluation:
        e = evaluation["lengths"][0]
        lines.append(f"Held-out: about {e['tokens']:,} scored tokens at every context, the "
                     f"same leading span of the validation split ({evaluation['data']['name']}: "
                     "files no run trained on), in non-overlapping windows; a token is a byte "
                     "or a file's end.\n")  # fmt: skip
    if verdict["spread"] is not None:
        lines.append(f"Seed-to-seed spread at the shortest context: {verdict['spread']:.4f} nats "
                     f"(mean {verdict['short_mean']:.4f}).\n")  # fmt: skip
        target = [[ctx, f"{g['gain']:.4f}", f"{verdict['spread']:.4f}",
                   "met" if g["beats_spread"] else "not met"]
                  for ctx, g in verdict["gains"].items()]  # fmt: skip
        lines += ["Target: the loss at each longer context below the shortest's mean by more "
                  "than the seed spread.\n",
                  table(["context", "gain (nats)", "spread (nats)", "target"], target)]  # fmt: skip
    else:
        lines.append("No seed spread: fewer than two evaluated runs at the shortest context.\n")
    return lines


def context_figure(runs: list[dict]):
    """Loss by token position per run (log x), and held-out loss vs context."""
    fig, (by_position, by_context) = plots.panels(2, width=6.0)
    series, xs, ys = {}, [], []
    runs = sorted(runs, key=lambda r: (r["seq_len"], r.get("seed", 0)))  # colours follow context
    for i, r in enumerate(runs):
        e = evaluated(r)
        if e is None:
            continue
        points = [p for p in e["positions"] if p["tokens"]]
        middle = [math.sqrt(max(1, p["start"]) * p["end"]) for p in points]
        label = f"{r['seq_len']} (seed {r.get('seed', '-')})"
        series[label] = (middle, [p["loss"] for p in points],
                         {"color": plots.color(i, len(runs))})  # fmt: skip
        xs.append(r["seq_len"])
        ys.append(e["loss"])
    plots.curves(by_position, series, title="held-out loss by token position",
                 xlabel="position in the window", ylabel="loss (nats/token)", logx=True,
                 marker="o")  # fmt: skip
    plots.curves(by_context, {"runs": (xs, ys, {"linestyle": "none"})},
                 title="held-out loss vs context (equal tokens)", xlabel="context length",
                 ylabel="loss (nats/token)", logx=True, marker="o")  # fmt: skip
    return fig


def _pathfinder_section(record: dict) -> list[str]:
    runs = record.get("pathfinder") or {}
    lines = ["## Pathfinder: is there a path between the two dots?\n"]
    phase = record.get("phases", {}).get("pathfinder", {})
    lines.append(
        f"Status: {phase.get('status', 'not started')}. Chance is 50% (balanced labels).\n"
    )
    rows = []
    for key, title in (("path32", "Pathfinder-32 (1K tokens)"), ("pathx", "Path-X (16K tokens)")):
        r = runs.get(key)
        if r is None:
            rows.append([title, "-", "not reached", "-", "-", "-", "-"])
        elif "skipped" in r:
            rows.append([title, f"`{r['name']}`", f"not run: {r['skipped']}", "-", "-", "-", "-"])
        else:
            evals = [e for e in r.get("evals", []) if EVAL_ACCURACY in e]
            last = evals[-1][EVAL_ACCURACY] if evals else None
            counts = r.get("correct_evaluated")
            above = "-" if counts is None else ("yes" if r.get("above_chance") else "no")
            rows.append([title, f"`{r['name']}`", f"{r['steps']}/{r['planned_steps']} steps",
                         fmt(r["seconds"], 1), fmt(None if last is None else 100 * last, 1),
                         "-" if counts is None else f"{counts[1]}", above])  # fmt: skip
    header = ["task", "run", "trained", "train s", "val accuracy %", "images evaluated",
              "above chance (3 sd)"]  # fmt: skip
    return lines + [table(header, rows)]


def pathfinder_figure(record: dict):
    fig, (ax,) = plots.panels(1, width=6.0)
    series = {}
    for key, r in (record.get("pathfinder") or {}).items():
        if not r or "skipped" in r:
            continue
        evals = [e for e in r.get("evals", []) if EVAL_ACCURACY in e]
        series[f"{key} validation"] = ([e["step"] for e in evals],
                                       [100 * e[EVAL_ACCURACY] for e in evals])  # fmt: skip
        train = [t for t in r.get("train", []) if t.get(TRAIN_ACCURACY) is not None]
        series[f"{key} train"] = ([t["step"] for t in train],
                                  [100 * t[TRAIN_ACCURACY] for t in train], {"linestyle": ":"})  # fmt: skip
    steps = [x for xs, *_ in series.values() for x in xs]
    if steps:
        series["chance"] = (
            [min(steps), max(steps)],
            [50, 50],
            {"color": "grey", "linestyle": "--"},
        )
    plots.curves(ax, series, title="Pathfinder accuracy", xlabel="optimizer step",
                 ylabel="accuracy (%)")  # fmt: skip
    return fig


def _header(record: dict) -> list[str]:
    env = record.get("environment") or {}
    return [
        "# The paper's long-context results in one GPU call\n",
        f"Device: **{env.get('device', 'unknown')}**, torch {env.get('torch')}, triton "
        f"{env.get('triton')}, CUDA {env.get('cuda')}, Python {env.get('python')}, commit "
        f"{env.get('commit')}. Settings `{record['settings']}`, budget {record['budget_s']:.0f} s, "
        f"elapsed {record.get('elapsed_s', 0):.0f} s, started {record['started']}.\n",
        PAPER + "\n",
    ]


def _phases(record: dict) -> list[str]:
    rows = [[name, p["status"], fmt(p["at_s"], 1)] for name, p in record["phases"].items()]
    return ["## Phases\n", table(["phase", "status", "at (s)"], rows)]


def _probe(record: dict) -> list[str]:
    probe = record.get("probe")
    if not probe:
        return []
    rows = [[name, fmt(p["build_s"], 1), fmt(p["step_s"][0], 3), fmt(p["steady_step_s"], 3),
             p["tokens_per_step"], fmt(p["tokens_per_step"] / p["steady_step_s"], 0)]
            for name, p in probe["points"].items()]  # fmt: skip
    lines = ["## The probe: what each run shape costs here\n",
             f"Start-up {probe['startup_s']:.1f} s" + (f", data prepared in "
             f"{probe['prepare_s']:.1f} s: {probe.get('prepared')}" if "prepare_s" in probe
             else "") + ".\n",
             table(["shape", "build s", "first step s", "steady step s", "tokens/step",
                    "tokens/s"], rows)]  # fmt: skip
    return lines


def _commands(record: dict) -> list[str]:
    rows = [[c["tag"], f"`{c['command']}`", c["exit_code"], fmt(c["seconds"], 1),
             c.get("stopped") or "-"] for c in record.get("commands", [])]  # fmt: skip
    return ["## Every command the call ran\n",
            table(["what", "command", "exit", "s", "stopped"], rows)]  # fmt: skip


def write(record: dict, out_dir: Path) -> list[Path]:
    """call.md and its plots, each written atomically; returns the files written."""
    context_runs = [r for r in (record.get("context_length") or {}).get("runs", [])
                    if "skipped" not in r]  # fmt: skip
    parts = _header(record) + _phases(record) + _probe(record) + _context_section(record)
    written = []
    can_plot = not missing_modules(["matplotlib"])  # a GPU image may lack it: tables only
    if not can_plot:
        parts.append("(No plots: matplotlib is not installed here.)\n")
    if can_plot and any(evaluated(r) for r in context_runs):
        written.append(plots.save(context_figure(context_runs), out_dir / CONTEXT_PNG))
        parts.append(image(CONTEXT_PNG, "held-out loss by position and vs context"))
    parts += _pathfinder_section(record)
    if can_plot and any(r and "evals" in r for r in (record.get("pathfinder") or {}).values()):
        written.append(plots.save(pathfinder_figure(record), out_dir / PATHFINDER_PNG))
        parts.append(image(PATHFINDER_PNG, "Pathfinder accuracy by step, chance dashed"))
    parts += _commands(record)
    path = out_dir / REPORT
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts) + "\n")
    return [path, *written]


def write_failure(record: dict, out_dir: Path, error: str) -> Path:
    """call.md when the report itself failed: the header, the phases and the error."""
    path = out_dir / REPORT
    parts = _header(record) + _phases(record)
    parts += ["## The report failed\n", "```", error.rstrip(), "```",
              "Everything measured is in call.json.\n"]  # fmt: skip
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts) + "\n")
    return path
