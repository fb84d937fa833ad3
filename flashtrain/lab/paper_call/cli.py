"""`python scripts/paper_call.py --out DIR [--budget-min M] [--work DIR] [--dry-run]`.

On a GPU machine (docs/gpu_session.md, "The paper call"), with the hydra and datasets wheels
carried (../shared/gpu/wheels.sh full):

    python3 scripts/paper_call.py --out "$OUT" --budget-min 9

The CPU dry run runs every phase at toy sizes in under a minute (tests/lab/test_paper_call.py):

    python scripts/paper_call.py --dry-run --out /tmp/paper-call

Writes call.md, call.json, call.log, context-length.png and pathfinder.png flat into --out; the
run folders (checkpoints) go to --work (default: a new folder under the system's temporary
folder). Exit 0 when every phase ran to its end, 1 otherwise (the report is written either way),
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from flashtrain.lab.paper_call.driver import run_call
from flashtrain.lab.paper_call.settings import DRY_RUN, GPU

MAX_OUT_FILES = 8  # what a GPU call may bring back


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="the report's folder (flat)")
    p.add_argument("--work", type=Path, default=None, help="run folders and caches (new, empty)")
    p.add_argument("--budget-min", type=float, default=None,
                   help=f"the whole call, report included (default {GPU.budget_s / 60:.0f}; "
                   f"dry run {DRY_RUN.budget_s / 60:.0f})")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU")
    return p.parse_args(argv)


def check_folders(out: Path, work: Path) -> None:
    """--out may hold at most what the call writes; --work must be new or empty (a call's runs
    are fresh: an old run folder would be continued, not rerun)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: name a folder")
    if work.exists() and any(work.iterdir()):
        raise ValueError(f"--work {work} is not empty: name a new or empty folder")
    if out.resolve() == work.resolve() or work.resolve().is_relative_to(out.resolve()):
        raise ValueError(f"--work {work} must not be --out or inside it (--out stays flat)")


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = DRY_RUN if args.dry_run else GPU
    budget_s = settings.budget_s if args.budget_min is None else 60 * args.budget_min
    work = args.work or Path(tempfile.mkdtemp(prefix="flashtrain-paper-call-"))
    try:
        if not budget_s > 0:
            raise ValueError(f"--budget-min must be > 0, got {args.budget_min}")
        check_folders(args.out, work)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_call(settings, args.out, work, budget_s)


if __name__ == "__main__":
    sys.exit(main())
