"""Running scripts/kernel_compile.py from the compile-fact tests of the Gluon kernels, and
reading its committed Markdown reports back."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def run_kernel_compile(cache_dir, *args) -> list[str]:
    """stdout lines of `scripts/kernel_compile.py *args` in a fresh process (no interpreter,
    Triton's compile cache in cache_dir); exit 1 is a contract's violations, reported in them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO),
               TRITON_DEFAULT_FP_FUSION="1")  # fmt: skip
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "kernel_compile.py"), *args],
                         env=env, cwd=cache_dir, capture_output=True, text=True, timeout=3000)  # fmt: skip
    assert run.returncode in (0, 1), run.stderr[-4000:]
    return run.stdout.splitlines()


def report_rows(path: Path) -> list[dict]:
    """The table of a kernel_compile --markdown report, one dict a row (numbers as ints)."""
    lines = [x for x in path.read_text().splitlines() if x.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = dict(zip(head, cells))
        for key, value in row.items():
            if re.fullmatch(r"-?[\d,]+", value):
                row[key] = int(value.replace(",", ""))
            elif value in ("True", "False"):
                row[key] = value == "True"
        rows.append(row)
    return rows
