"""The call's evaluation: every context-length run at its own context, on the same tokens.

    python -m flashtrain.lab.paper_call.evaluate_runs --tokens N --batch-size B RUN_DIR ...

For each run folder, exactly `python scripts/evaluate.py RUN_DIR --seq-len <its seq_len>
--tokens N --batch-size B --out RUN_DIR/eval-call` (printed), in one process so the imports and
the device's start are paid once: the loss and the loss by token position on the leading N tokens
of the validation split (files no run trained on), the same span at every context. Its eval.json
is what the call's report reads. Exit 1 when any run could not be evaluated (the others are).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

EVAL_FOLDER = "eval-call"


def evaluate_argv(run_dir: Path, seq_len: int, tokens: int, batch_size: int) -> list[str]:
    """scripts/evaluate.py's arguments for one run."""
    return [
        str(run_dir),
        "--seq-len", str(seq_len),
        "--tokens", str(tokens),
        "--batch-size", str(batch_size),
        "--out", str(run_dir / EVAL_FOLDER),
        "--no-progress",
    ]  # fmt: skip


def run_seq_len(run_dir: Path) -> int:
    from omegaconf import OmegaConf

    return int(OmegaConf.load(run_dir / ".hydra" / "config.yaml").seq_len)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    args = p.parse_args(argv)

    from flashtrain.inference import evaluate_cli
    from flashtrain.lab.checkout import CONFIGS, REPO

    failed = 0
    for run_dir in args.run_dirs:
        argv_one = evaluate_argv(run_dir, run_seq_len(run_dir), args.tokens, args.batch_size)
        script = REPO / "scripts" / "evaluate.py"
        print(f"$ python {script.relative_to(REPO)} {' '.join(argv_one)}", flush=True)
        try:
            code = evaluate_cli.main(argv_one, configs=CONFIGS)
        except Exception:  # noqa: BLE001 - one run's crash must not cost the others' evaluation
            traceback.print_exc()
            code = 1
        if code != 0:
            print(f"evaluation of {run_dir.name} failed (exit {code})", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
