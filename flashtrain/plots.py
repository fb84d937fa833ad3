"""Figure helpers for the reports: panels of labelled curves saved as PNG (Agg backend)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flashtrain.data.files import atomic_path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panels(count: int, width: float = 5.0, height: float = 3.8):
    """A figure with `count` panels side by side: (figure, list of axes)."""
    fig, axes = pyplot().subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, list(axes[0])


def curves(
    ax,
    series: dict[str, tuple],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    marker: str | None = None,
) -> None:
    """One line per label: series[label] = (xs, ys) or (xs, ys, matplotlib style keywords).
    Log axes: base 2 on x (sequence lengths, ticks as plain numbers), base 10 on y."""
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    for label, (xs, ys, *style) in series.items():
        points = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        if points:
            ax.plot(
                *zip(*points),
                label=label,
                **{"marker": marker, "linewidth": 1.5, **(style[0] if style else {})},
            )
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        # Plain-number labels on the minor ticks too, as many as the span leaves room for.
        ax.yaxis.set_minor_formatter(
            _plain_log_formatter_class()(labelOnlyBase=False, minor_thresholds=(2, 0.5))
        )
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _plain_log_formatter_class():
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        """LogFormatter's choice of which minor ticks to label, written as plain numbers."""

        def __call__(self, x, pos=None):
            return f"{x:g}" if super().__call__(x, pos) else ""

    return PlainLogFormatter


def add_run_curves(
    series: dict,
    label: str,
    color,
    run,
    train_key: str,
    eval_key: str,
    x: Callable[[dict], float | None] = lambda row: row["step"],
) -> None:
    """A run's training curve (solid) and its evaluations (dashed, dots) in one colour."""
    train = [row for row in run.train if row.get(train_key) is not None]
    evals = [row for row in run.evals if row.get(eval_key) is not None]
    series[f"{label} train"] = (
        [x(row) for row in train],
        [row[train_key] for row in train],
        {"color": color, "linewidth": 1, "marker": None},
    )
    series[f"{label} eval"] = (
        [x(row) for row in evals],
        [row[eval_key] for row in evals],
        {"color": color, "linestyle": "--", "marker": "o", "markersize": 3},
    )


def color(i: int, n: int):
    """The i-th of n colours along one colour map (context lengths, in order)."""
    return pyplot().get_cmap("viridis")(0.85 * i / max(1, n - 1))


def save(fig, path: Path) -> Path:
    """Write the PNG under a temporary name and rename it: never a half-written image."""
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    pyplot().close(fig)
    return path


def heatmap(
    ax, values: list[list[float | None]], *, rows: list[str], columns: list[str], title: str,
    xlabel: str, ylabel: str,
) -> None:  # fmt: skip
    """values[row][column] in [0, 1] as colour (red 0 .. green 1), each cell's value written in
    it as a percentage ("-" where None: not measured). Rows run top to bottom."""
    import numpy as np

    grid = np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float)
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, origin="upper", aspect="auto")
    for r, row in enumerate(values):
        for c, v in enumerate(row):
            ax.text(c, r, "-" if v is None else f"{100 * v:.0f}", ha="center", va="center",
                    fontsize=7 if len(row) > 8 else 9)  # fmt: skip
    ax.set_xticks(range(len(columns)), columns, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="accuracy")
