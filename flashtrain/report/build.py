"""Reports from run folders: <out>/<experiment>.md and its PNG plots, one per experiment."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path

from flashtrain.data.files import atomic_path
from flashtrain.experiments.spec import EXPERIMENT_NAMES
from flashtrain.experiments.tables import SUMMARIES
from flashtrain.report import bert, context_length, pathfinder, speed_memory
from flashtrain.report.markdown import runs_table
from flashtrain.report.paper import PAPER
from flashtrain.report.runs import RunRecord, load_run

SECTIONS = {
    "context-length": context_length.section,
    "pathfinder": pathfinder.section,
    "speed-memory": speed_memory.section,
    "bert": bert.section,
}


def render(experiment: str, records: list[RunRecord], out_dir: Path) -> str:
    """The markdown of one experiment's report (its plots are written to out_dir)."""
    when = datetime.datetime.now().isoformat(timespec="seconds")
    return "\n".join(
        [
            f"# {experiment}: {SUMMARIES[experiment]}\n",
            f"Written by scripts/report.py on {when} from {len(records)} run folder(s); the paper is "
            f"{PAPER}.\n",
            "## Runs\n",
            runs_table(records),
            SECTIONS[experiment](records, out_dir),
        ]
    )


def write_reports(run_dirs: Iterable[str | Path], out_dir: str | Path) -> list[Path]:
    """One report per experiment found among the run folders; returns the markdown files."""
    records = [load_run(d) for d in run_dirs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for experiment in EXPERIMENT_NAMES:
        group = sorted((r for r in records if r.experiment == experiment), key=lambda r: r.name)
        if not group:
            continue
        text = render(experiment, group, out_dir)
        path = out_dir / f"{experiment}.md"
        with atomic_path(path) as tmp:
            tmp.write_text(text)
        written.append(path)
    return written
