"""Markdown pieces shared by the experiment reports: tables, numbers, the runs table."""

from __future__ import annotations

import math

from flashtrain.lab.reports.runs import RunRecord
from flashtrain.utils import format_count


def fmt(value, digits: int = 3) -> str:
    """A number for a table cell: significant digits, "-" when missing or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def steps_cell(record: RunRecord) -> str:
    planned = record.planned_steps
    return f"{record.steps}/{planned}" if planned is not None else str(record.steps)


def runs_table(records: list[RunRecord]) -> str:
    """Where each run stands and where it came from."""
    rows = []
    for r in records:
        tokens = r.tokens_seen
        rows.append(
            [
                f"`{r.name}`",
                r.model if r.kind == "train" else "-",
                r.scale or "-",
                r.status,
                steps_cell(r) if r.kind == "train" else "-",
                format_count(tokens) if tokens else "-",
                r.device,
                f"`{r.commit}`",
            ]
        )
    return table(
        ["run", "model", "scale", "status", "steps", "tokens seen", "device", "commit"], rows
    )


def image(path_name: str, caption: str) -> str:
    return f"![{caption}]({path_name})\n"
