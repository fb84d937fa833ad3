"""context-length report: LM quality vs context length at equal tokens per optimizer step."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from flashtrain import plots
from flashtrain.lab.reports.labels import (
    curve_labels,
    label_every_x_value,
    model_and_context,
    run_model,
    run_name,
    run_path,
)
from flashtrain.lab.reports.markdown import fmt, image, table
from flashtrain.lab.reports.paper import paper_figure, paper_value
from flashtrain.lab.reports.runs import RunRecord
from flashtrain.train.metric_names import TRAIN_LOSS, TRAIN_TOKENS_SEEN

STEM = "context-length"
LOSS = "eval loss (nats/token)"
PERPLEXITY = "perplexity = exp(loss)"
BITS_PER_BYTE = "bits/byte = loss / ln 2"
PAPER_CONTEXTS = (1024, 2048, 4096)
PAPER_PERPLEXITY = "perplexity on OpenWebText, GPT-2 small, from the paper"
NOT_COMPARABLE = (
    "The paper's perplexities are GPT-2 small (124M parameters) trained for days on OpenWebText "
    "with GPT-2's tokenizer at 512K tokens per step: they are not comparable with the numbers of "
    "these runs (different data, model size, tokenizer and training length), only the direction "
    "across context lengths is. Our losses are in nats per token; our perplexity is exp(loss)."
)


def _bounds(record: RunRecord) -> tuple[float, float] | None:
    """Synthetic recall scored on values: (no-context floor, best possible) in nats."""
    if record.cfg("data.loader") != "synthetic" or record.cfg("data.loss_on") != "values":
        return None
    from flashtrain.data.synthetic import recall_optimal_loss

    keys, values = record.cfg("data.num_keys"), record.cfg("data.num_values")
    return math.log(values), recall_optimal_loss(record.cfg("seq_len"), keys, values)


def _byte_level(record: RunRecord) -> bool:
    return record.cfg("data.tokenizer") == "byte"


def _context(record: RunRecord):
    return record.cfg("seq_len")


def _perplexity(loss: float | None) -> float | None:
    if loss is None:
        return None
    return math.exp(loss) if loss < 700 else math.inf  # exp overflows a float beyond ~709


def final_metric(record: RunRecord) -> tuple[str, float | None]:
    """(name, value) of the figure a context is judged by: bits per byte for byte-level text,
    perplexity for other text, the loss in nats for the synthetic task."""
    loss = record.last_eval("eval/loss")
    if record.cfg("data.loader") == "synthetic":
        return LOSS, loss
    if _byte_level(record):
        return BITS_PER_BYTE, None if loss is None else loss / math.log(2)
    return PERPLEXITY, _perplexity(loss)


def _results(data: str, group: list[RunRecord]) -> str:
    synthetic = _bounds(group[0]) is not None
    header = ["context", "model", "run", "scale", LOSS]
    if synthetic:
        header += ["best possible (nats)", "no-context floor (nats)", "gap closed"]
    else:
        header += [PERPLEXITY] + ([BITS_PER_BYTE] if _byte_level(group[0]) else [])
    rows = []
    for r in group:
        loss = r.last_eval("eval/loss")
        row = [_context(r), r.model, f"`{r.name}`", r.scale or "-", fmt(loss, 4)]
        if synthetic:
            floor, best = _bounds(r)
            closed = None if loss is None else (floor - loss) / (floor - best)
            row += [fmt(best, 4), fmt(floor, 4), "-" if closed is None else f"{closed:.0%}"]
        else:
            row.append(fmt(_perplexity(loss), 4))
            if _byte_level(group[0]):
                row.append(fmt(None if loss is None else loss / math.log(2), 4))
        rows.append(row)
    return f"### data: {data}\n\n" + table(header, rows)


def _paper_results() -> str:
    """The paper's Table 4 on its own: never a column beside our losses."""
    header = ["context", PAPER_PERPLEXITY, "training days (8 x A100, from the paper)"]
    rows = [[c, paper_value(STEM, "ppl", c), paper_value(STEM, "days", c)] for c in PAPER_CONTEXTS]
    return "\n".join(
        ["### The paper (Table 4), not comparable with the runs above\n", NOT_COMPARABLE + "\n"]
        + [table(header, rows)]
    )


def _tokens_per_step(group: list[RunRecord]) -> str:
    per_step = {round(r.tokens_seen / r.steps) for r in group if r.tokens_seen and r.steps}
    if len(per_step) == 1:
        return f"Tokens per optimizer step: {per_step.pop():,} at every context length.\n"
    if per_step:
        return f"**Tokens per step differ between contexts: {sorted(per_step)}.**\n"
    return ""


def groups_by_data(records: list[RunRecord]) -> dict[str, list[RunRecord]]:
    """The runs with metrics, by data set, each group in (context, name) order."""
    groups: dict[str, list[RunRecord]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (_context(r) or 0, r.name)):
        if r.train:
            groups[str(r.cfg("data.name", "?"))].append(r)
    return dict(groups)


def loss_figure(groups: dict[str, list[RunRecord]]):
    """Loss vs tokens seen, a panel per data set, one curve per run named by model and context."""
    fig, axes = plots.panels(len(groups))
    for ax, (data, group) in zip(axes, groups.items()):
        series = {}
        labels = curve_labels(group, (model_and_context, run_name, run_path))
        for i, (r, label) in enumerate(zip(group, labels)):
            seen = {row["step"]: row.get(TRAIN_TOKENS_SEEN) for row in r.train}
            plots.add_run_curves(
                series,
                label,
                plots.color(i, len(group)),
                r,
                TRAIN_LOSS,
                "eval/loss",
                x=lambda row, seen=seen: seen.get(row["step"]),
            )
        plots.curves(
            ax, series, title=f"loss, data {data}", xlabel="tokens seen", ylabel="loss (nats/token)"
        )
    return fig


def final_figure(groups: dict[str, list[RunRecord]]):
    """The final figure vs context length, a panel per data set with one curve per model, and the
    paper's perplexities in a panel of their own (a different quantity on different data)."""
    fig, axes = plots.panels(len(groups) + 1)
    for ax, (data, group) in zip(axes, groups.items()):
        name = final_metric(group[0])[0]
        series: dict[str, tuple[list, list]] = {}
        labels = curve_labels(group, (run_model, run_name, run_path), x=_context)
        for r, label in zip(group, labels):
            xs, ys = series.setdefault(label, ([], []))
            xs.append(_context(r))
            ys.append(final_metric(r)[1])
        bounds = {_context(r): _bounds(r) for r in group}
        if all(b is not None for b in bounds.values()):
            series["best possible"] = (list(bounds), [b[1] for b in bounds.values()])
            series["no-context floor"] = (list(bounds), [b[0] for b in bounds.values()])
        plots.curves(
            ax,
            series,
            title=f"ours: final {name}, data {data}",
            xlabel="context length",
            ylabel=name,
            logx=True,
            marker="o",
        )
        label_every_x_value(ax, [_context(r) for r in group])
    paper = [paper_figure(STEM, "ppl", c) for c in PAPER_CONTEXTS]
    plots.curves(
        axes[-1],
        {"paper, Table 4": (list(PAPER_CONTEXTS), [p.value for p in paper])},
        title=PAPER_PERPLEXITY,
        xlabel="context length",
        ylabel="perplexity (paper, OpenWebText)",
        logx=True,
        marker="o",
    )
    label_every_x_value(axes[-1], PAPER_CONTEXTS)
    return fig


def section(records: list[RunRecord], out_dir: Path) -> str:
    groups = groups_by_data(records)
    if not groups:
        return "No run has logged metrics yet.\n"
    parts = ["## Results (the last evaluation of each run)\n"]
    for data, group in groups.items():
        parts += [_results(data, group), _tokens_per_step(group)]
    parts.append(_paper_results())
    loss_png = plots.save(loss_figure(groups), out_dir / f"{STEM}-loss.png")
    final_png = plots.save(final_figure(groups), out_dir / f"{STEM}-final.png")
    parts += [
        "## Plots\n",
        image(loss_png.name, "loss curves, one per run (model and context)"),
        image(final_png.name, "final figure vs context length; the paper's in its own panel"),
        "The paper's direction: at equal tokens per step a longer context gives a lower "
        "perplexity (18.2 -> 17.6 -> 17.5 from 1K to 4K). On the synthetic task the best "
        "possible loss falls with the context; 'gap closed' is how far a run got from the "
        "no-context floor towards it.\n",
    ]
    return "\n".join(parts)
