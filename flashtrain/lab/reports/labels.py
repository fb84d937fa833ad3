"""Labels on the report plots: a legend entry per curve that never merges two runs, and a
labelled tick at every context length present."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flashtrain.lab.reports.runs import RunRecord


def model_and_context(record: RunRecord) -> str:
    """ "gpt2 (gpt2-tiny), ctx 128": what a run's curve is called in a legend."""
    return f"{record.model}, ctx {record.cfg('seq_len', '?')}"


def run_model(record: RunRecord) -> str:
    return record.model


def run_name(record: RunRecord) -> str:
    return record.name


def run_path(record: RunRecord) -> str:
    # Two run folders can share a name: outputs/<day>/12-00-00 on two days.
    return str(record.path)


def curve_labels(
    records: Sequence[RunRecord],
    parts: Sequence[Callable[[RunRecord], str]],
    x: Callable[[RunRecord], object] | None = None,
) -> list[str]:
    """One legend label per record, made of the fewest leading `parts` that keep any two records
    on one curve apart at every x (x=None: every record is its own curve). A dict of curves keyed
    by a coarser label (the context length alone) would silently drop all but one run."""
    keys: list[str] = []
    for count in range(1, len(parts) + 1):
        keys = [", ".join(part(r) for part in parts[:count]) for r in records]
        points = [(key, None if x is None else x(r)) for key, r in zip(keys, records)]
        if len(set(points)) == len(points):
            return keys
    # Still equal (one folder given twice): a numbered suffix keeps both.
    seen: dict[str, int] = {}
    labels = []
    for key in keys:
        seen[key] = seen.get(key, 0) + 1
        labels.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
    return labels


def label_every_x_value(ax, values) -> None:
    """Ticks at exactly the x values present (context lengths), each one labelled: a log2 axis
    left alone labels only some powers of two and none of the lengths between them."""
    from matplotlib.ticker import NullLocator

    ticks = sorted({v for v in values if v is not None})
    ax.set_xticks(ticks, labels=[str(int(v)) if float(v).is_integer() else f"{v:g}" for v in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
