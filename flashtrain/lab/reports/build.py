"""Write experiment reports from run folders: tables and plots of our runs, and the paper's figures
in their own tables and panels (in the paper's unit: its numbers are not comparable with ours).

    python scripts/report.py reproduce/runs/* --out reproduce
    python scripts/report.py outputs/2026-01-01/12-00-00 outputs/2026-01-02/09-30-00 --out report

A run folder is a train.py run directory (metrics.jsonl, .hydra/config.yaml, run.json) or a
scripts/bench_attention.py output folder. Runs are grouped by experiment (from the
reproduce.json that scripts/reproduce.py writes, else from what they trained) and each group
becomes <out>/<experiment>.md with PNG plots next to it.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterable
from pathlib import Path

from flashtrain.data.files import atomic_path
from flashtrain.lab.experiments.matrices import SUMMARIES
from flashtrain.lab.experiments.spec import EXPERIMENT_NAMES
from flashtrain.lab.reports import bert, context_length, pathfinder, speed_memory
from flashtrain.lab.reports.markdown import runs_table
from flashtrain.lab.reports.paper import PAPER
from flashtrain.lab.reports.runs import RunRecord, load_run

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, required=True, help="folder for the reports and plots")
    args = p.parse_args(argv)
    try:
        written = write_reports(args.run_dirs, args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
