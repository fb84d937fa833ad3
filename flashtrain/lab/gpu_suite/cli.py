"""The whole GPU protocol, streamed into the folder that comes back (issue 20).

    python scripts/gpu_suite.py --out "$OUT" --budget-min 9          # call 1: every headline figure
    python scripts/gpu_suite.py --out "$OUT" --budget-min 3 --sections decode   # call 2, warm
    python scripts/gpu_suite.py --out "$OUT" --budget-min 6 --sections sweep
    python scripts/gpu_suite.py --out "$OUT" --budget-min 4 --sections pytest
    python scripts/gpu_suite.py --out "$OUT" --budget-min 6 --sections hopper   # the Gluon kernels
    python scripts/gpu_suite.py --dry-run --out /tmp/suite           # toy sizes on CPU, no figure

Default sections, in order of value: environment, peaks, correctness, attention, training, long,
then the sweep with what is left of the budget (loss, longctx, decode, hopper and pytest run
only when named). OUT gets at most 8 files, flat: suite.json and summary.md (rewritten atomically
after every measurement), the sweep's tuning-table-<gpu>.json, pytest.log and pytest-junit.xml,
two attention plots and the training plot (gpu_suite/plots.py). SIGINT or SIGTERM stops at the
next measurement boundary and still writes (a second one at once); so does a CUDA fault (every
later launch would fail alike). Exit 0: every section done; 1: a section failed or is incomplete
(its status says why); 2: bad use; 3: a measurement hung past its limit (record.py's watchdog
ended the call, naming it); 130/143: stopped by SIGINT/SIGTERM.
See docs/gpu_session.md for the session's calls.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch

from flashtrain.lab.gpu_suite import plots as suite_plots
from flashtrain.lab.gpu_suite import sections
from flashtrain.lab.gpu_suite.record import Record, SectionFailed
from flashtrain.lab.gpu_suite.summary import derive, summary_markdown

DEFAULT = ("environment", "peaks", "correctness", "attention", "training", "long", "sweep")
# Named sections run in this order whatever the command line's: the sweep and pytest take what
# is left, so they come last.
# hopper (the Gluon kernels' check) late: should its kernel fault the process after its guard
# passed, what came before is on record
ALL = ("environment", "peaks", "correctness", "attention", "loss", "training", "long", "longctx",
       "decode", "hopper", "sweep", "pytest")  # fmt: skip
# Shares of the budget left (minutes of a call, roughly what each needs on an H100 from a cold
# start); the sweep and pytest get whatever is left when they start.
# training: nine compiled trainer runs (sections.section_training)
SHARE = {"environment": 0.1, "peaks": 0.2, "correctness": 2.0, "attention": 3.0, "loss": 1.5,
         "training": 3.5, "long": 0.5, "longctx": 1.5, "decode": 0.6, "hopper": 5.5}  # fmt: skip
PYTEST_ARGS = "-m gpu tests"


def section_deadline(record: Record, todo: list[str]) -> float:
    """Now + this section's share of the time left; the unshared sections get all of it."""
    name, left = todo[0], record.seconds_left()
    if name not in SHARE:
        return record.deadline
    return time.monotonic() + left * SHARE[name] / sum(SHARE.get(n, 0.0) for n in todo)


def plots(record: Record) -> None:
    if sections.missing_modules(sections.OPTIONAL):
        return
    suite_plots.write(record.state, record.out)


def run(args) -> int:
    record = Record(args.out, args.budget_min * 60, summary_markdown, derive)
    record.install_signal_handlers()
    missing = sections.missing_modules(
        sorted({m for n in args.sections for m in sections.NEEDS.get(n, ())})
    )
    record.state["runs"].append({
        "dry_run": args.dry_run, "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "sections": args.sections, "missing_modules": missing,
    })  # fmt: skip
    if missing:
        print(f"[suite] missing: {', '.join(missing)}: {sections.WHEELS_HINT}", flush=True)
    record.save()
    suite = sections.Suite(record, args.out, args.dry_run,
                           sections.Sizes.for_run(args.dry_run, args.rep),
                           tuple(shlex.split(args.pytest_args)))  # fmt: skip
    all_done = True
    try:
        for i, name in enumerate(args.sections):
            if record.stop_reason:
                record.state["sections"][name] = {"status": f"not started: {record.stop_reason}"}
                all_done = False
                continue
            sec = record.section(name)
            sec.deadline = section_deadline(record, args.sections[i:])
            print(f"[{name}] starting, {record.seconds_left() / 60:.1f} min left", flush=True)
            failure = None
            try:
                sections.SECTIONS[name](suite, sec)
            except SectionFailed as err:
                failure = str(err)
            except KeyboardInterrupt:
                sec.finish(f"interrupted ({record.stop_reason or 'KeyboardInterrupt'})")
                raise
            except Exception as err:  # noqa: BLE001  (a section's bug must not lose the others)
                failure = f"{type(err).__name__}: {str(err)[:300]}"
                sec.data["traceback"] = traceback.format_exc()[-4000:]
                print(sec.data["traceback"], flush=True)
            status = sec.finish(failure)
            all_done &= status == "done"
            print(f"[{name}] {status} in {sec.data['seconds']} s", flush=True)
            if name in ("attention", "training"):
                plots(record)
    except KeyboardInterrupt:
        record.stop(record.stop_reason or "stopped by KeyboardInterrupt")
        all_done = False
    finally:
        record.restore_signal_handlers()
        plots(record)
        record.save()
    return exit_code(record.stop_reason, all_done)


def exit_code(stop_reason: str | None, all_done: bool) -> int:
    """130 / 143 for a stop by SIGINT (or KeyboardInterrupt) / SIGTERM; 0 every section done;
    1 otherwise, a stop after a CUDA fault included (no signal was sent)."""
    if stop_reason and "SIGTERM" in stop_reason:
        return 143
    if stop_reason and ("SIGINT" in stop_reason or "KeyboardInterrupt" in stop_reason):
        return 130
    return 0 if all_done else 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="results folder (created)")
    p.add_argument("--budget-min", type=float, default=9.0, help="wall-clock budget of this call")
    p.add_argument("--sections", nargs="+", choices=ALL, default=list(DEFAULT))
    p.add_argument("--dry-run", action="store_true", help="every section at toy sizes on CPU")
    p.add_argument("--rep", type=int, default=20, help="timed calls per measurement (about)")
    p.add_argument("--pytest-args", default=PYTEST_ARGS, help=f"default: {PYTEST_ARGS!r}")
    args = p.parse_args(argv)
    if args.budget_min <= 0:
        p.error(f"--budget-min must be > 0, got {args.budget_min}")
    # always the protocol's order, and always the environment: every call's files name the GPU
    args.sections = [s for s in ALL if s in args.sections or s == "environment"]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_suite: no CUDA device; use --dry-run to exercise it on CPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
