"""bert report: masked-LM loss and accuracy against MLPerf's target."""

from __future__ import annotations

from pathlib import Path

from flashtrain import plots
from flashtrain.lab.reports.labels import curve_labels, run_name, run_path
from flashtrain.lab.reports.markdown import fmt, image, table
from flashtrain.lab.reports.paper import paper_value
from flashtrain.lab.reports.runs import RunRecord
from flashtrain.train.metric_names import TRAIN_ACCURACY, TRAIN_LOSS

STEM = "bert"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _model(record: RunRecord) -> str:
    """The model's size from its config (model configs carry no name): "2 layers x 128"."""
    layers, width = record.cfg("model.n_layer"), record.cfg("model.d_model")
    return "?" if layers is None or width is None else f"{layers} layers x {width}"


def section(records: list[RunRecord], out_dir: Path) -> str:
    runs = [r for r in sorted(records, key=lambda r: r.name) if r.train]
    if not runs:
        return "No run has logged metrics yet.\n"
    rows = [
        [
            f"`{r.name}`",
            r.scale or "-",
            _model(r),
            r.cfg("data.name", "?"),
            r.cfg("seq_len"),
            fmt(r.last_eval("eval/loss"), 4),
            _percent(r.last_eval("eval/accuracy")),
            paper_value(STEM, "target_accuracy"),
        ]
        for r in runs
    ]
    header = [
        "run",
        "scale",
        "model",
        "data",
        "seq_len",
        "eval MLM loss",
        "eval MLM accuracy (%)",
        "target (%, MLPerf)",
    ]
    fig, axes = plots.panels(2)
    labels = curve_labels(runs, (run_name, run_path))  # two days' outputs/.../12-00-00
    panels = (
        (axes[0], TRAIN_LOSS, "eval/loss", "MLM loss (nats)"),
        (axes[1], TRAIN_ACCURACY, "eval/accuracy", "MLM accuracy"),
    )
    for ax, train_key, eval_key, label in panels:
        series = {}
        for i, (r, name) in enumerate(zip(runs, labels)):
            color = plots.color(i, len(runs))
            plots.add_run_curves(series, name, color, r, train_key, eval_key)
        plots.curves(ax, series, title=label, xlabel="step", ylabel=label)
    png = plots.save(fig, out_dir / f"{STEM}-curves.png")
    return "\n".join(
        [
            "## Results\n",
            table(header, rows),
            "The paper (Table 1): BERT-large from the MLPerf 1.1 initial checkpoint reaches "
            f"{paper_value(STEM, 'target_accuracy')}% MLM accuracy in "
            f"{paper_value(STEM, 'minutes', 'flashattention')} minutes on 8 x A100 (Nvidia's MLPerf "
            f"1.1 implementation: {paper_value(STEM, 'minutes', 'mlperf')}).\n",
            "## Plots\n",
            image(png.name, "MLM loss and accuracy curves"),
        ]
    )
