"""Write experiment reports from run folders: tables beside the paper's figures, and plots.

    python scripts/report.py reproduce/runs/* --out reproduce
    python scripts/report.py outputs/2026-01-01/12-00-00 outputs/2026-01-02/09-30-00 --out report

A run folder is a train.py run directory (metrics.jsonl, .hydra/config.yaml, run.json) or a
scripts/bench_attention.py output folder. Runs are grouped by experiment (from the
reproduce.json that scripts/reproduce.py writes, else from what they trained) and each group
becomes <out>/<experiment>.md with PNG plots next to it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flashtrain.report import write_reports


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
