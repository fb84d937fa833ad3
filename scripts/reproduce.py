"""Reproduce one of the FlashAttention paper's experiments at a chosen scale.

    python scripts/reproduce.py context-length --scale tiny               # pysrc, 2-core CPU
    python scripts/reproduce.py context-length --scale tiny --data synthetic
    python scripts/reproduce.py pathfinder --scale gpu --out results/
    python scripts/reproduce.py speed-memory --scale tiny
    python scripts/reproduce.py bert --scale paper                        # prints; --run starts

Scales: tiny (a 2-core CPU, minutes per run), gpu (~20 minutes on one GPU), paper (the paper's
setting, hours to days on 8 GPUs: printed with its documented cost, run only with --run).
Each run is an ordinary train.py run (its command is printed) in <out>/runs/<name> with
trainer.resume=auto: run the same command again to continue; finished runs are skipped.
At the end <out>/<experiment>.md and its plots are written (scripts/report.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flashtrain.experiments import EXPERIMENT_NAMES, SCALES, plan
from flashtrain.experiments.driver import execute


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("experiment", choices=EXPERIMENT_NAMES)
    p.add_argument("--scale", choices=SCALES, required=True)
    p.add_argument("--out", type=Path, default=Path("reproduce"), help="default: ./reproduce")
    p.add_argument("--data", default=None, help="context-length: pysrc | synthetic | openwebtext")
    p.add_argument("--only", nargs="+", metavar="RUN", help="run names or shell patterns")
    p.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra overrides added to every train run (after the table's)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--run", action="store_true", help="scale paper: really start the runs")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        the_plan = plan(args.experiment, args.scale, args.data)
        return execute(
            the_plan,
            args.out,
            extra=args.override,
            only=args.only,
            dry_run=args.dry_run,
            run_paper=args.run,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
