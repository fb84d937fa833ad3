"""pathfinder report: accuracy of dense vs block-sparse vs SDPA attention on Pathfinder tasks."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from flashtrain import plots
from flashtrain.data.pathfinder.dataset import split_ranges
from flashtrain.lab.reports.labels import curve_labels, run_name, run_path
from flashtrain.lab.reports.markdown import fmt, image, table
from flashtrain.lab.reports.paper import LRA_MODELS, LRA_TASKS, paper_figure, paper_value
from flashtrain.lab.reports.runs import RunRecord
from flashtrain.train.metric_names import TRAIN_ACCURACY

STEM = "pathfinder"
TASK_NAMES = {
    "pathfinder32": "Path-32",
    "pathfinder64": "Path-64",
    "pathx": "Path-X",
    "path256": "Path-256",
}


LRA_CONTOUR_LENGTH = 14  # the difficulty of LRA's Pathfinder and of the paper's Path-X


def _task(record: RunRecord) -> str:
    return str(record.cfg("data.name", "?"))


def _attention(record: RunRecord) -> str:
    return str(record.cfg("attention.impl", "?"))


def _task_label(record: RunRecord) -> str:
    """Path-32 etc., with the contour length when it is not the paper's."""
    task = _task(record)
    label = TASK_NAMES.get(task, task)
    contour = record.cfg("data.contour_length")
    return label if contour in (None, LRA_CONTOUR_LENGTH) else f"{label} (contour {contour})"


def _train_images(record: RunRecord) -> int | None:
    """Images in the run's training split (80% of data.num_samples); None if not recorded."""
    num = record.cfg("data.num_samples")
    if num is None:
        return None
    lo, hi = split_ranges(int(num))["train"]
    return hi - lo


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _results(groups: dict[str, list[RunRecord]]) -> str:
    header = [
        "task",
        "attention",
        "run",
        "scale",
        "train images",
        "images seen",
        "last eval acc (%)",
        "best eval acc (%)",
        "last train acc (%)",
        "paper (%)",
    ]
    rows = []
    for task, group in groups.items():
        for r in group:
            impl = r.cfg("attention.impl", "?")
            evals = [e["eval/accuracy"] for e in r.evals if e.get("eval/accuracy") is not None]
            train_acc = [
                row[TRAIN_ACCURACY] for row in r.train if row.get(TRAIN_ACCURACY) is not None
            ]
            seq_len = r.cfg("seq_len")
            images = r.tokens_seen / seq_len if r.tokens_seen and seq_len else None
            rows.append(
                [
                    _task_label(r),
                    impl,
                    f"`{r.name}`",
                    r.scale or "-",
                    fmt(_train_images(r)),
                    fmt(images),
                    _percent(evals[-1] if evals else None),
                    _percent(max(evals) if evals else None),
                    _percent(train_acc[-1] if train_acc else None),
                    paper_value(STEM, "accuracy", task, impl),
                ]
            )
    return table(header, rows)


def _lra_table() -> str:
    rows = [
        [model, *(fmt(paper_figure(STEM, "lra", model, t).value) for t in LRA_TASKS)]
        for model in LRA_MODELS
    ]
    return table(["paper, Long Range Arena (%)", *LRA_TASKS], rows)


def _accuracy_plot(groups: dict[str, list[RunRecord]], path: Path) -> Path:
    fig, axes = plots.panels(len(groups))
    for ax, (task, group) in zip(axes, groups.items()):
        series = {}
        # Runs that share an attention (a control run beside the main one) go by name too.
        labels = curve_labels(group, (_attention, run_name, run_path))
        for i, (r, label) in enumerate(zip(group, labels)):
            color = plots.color(i, len(group))
            plots.add_run_curves(series, label, color, r, TRAIN_ACCURACY, "eval/accuracy")
        plots.curves(
            ax,
            series,
            title=f"{TASK_NAMES.get(task, task)} accuracy",
            xlabel="step",
            ylabel="accuracy",
        )
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)  # chance
    return plots.save(fig, path)


def section(records: list[RunRecord], out_dir: Path) -> str:
    groups: dict[str, list[RunRecord]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.cfg("seq_len") or 0, r.name)):
        if r.train:
            groups[_task(r)].append(r)
    if not groups:
        return "No run has logged metrics yet.\n"
    png = _accuracy_plot(groups, out_dir / f"{STEM}-accuracy.png")
    return "\n".join(
        [
            "## Results (chance is 50%)\n",
            _results(groups),
            "The paper's figures: LRA Pathfinder is 32 x 32 (its 'Transformer' row is standard "
            "attention, our sdpa); Path-X and Path-256 were pre-trained on Path-64; 'fails' is the "
            "paper's cross (chance or out of memory).\n",
            _lra_table(),
            "## Plots\n",
            image(png.name, "accuracy curves"),
        ]
    )
