"""Running scripts/kernel_compile.py from the compile-fact tests of the Gluon kernels, and
reading its committed Markdown reports back, and what the PTX says of the partitions' arrivals."""

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


# a PTX instruction (after an optional predicate) and the ones that order a partition's
# shared-memory work: a barrier (a warp's own too), an access, a product, a wait, a copy, a fence
_PTX_OP = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)")
_ORDERING = ("bar.sync", "barrier.sync", "bar.warp.sync", "ld.shared", "st.shared", "ldmatrix", "stmatrix",
             "wgmma.", "mbarrier.", "cp.async", "fence.")  # fmt: skip


def unsynced_arrives(ptx: str) -> list[tuple[int, str]]:
    """(line, the ordering instruction before it) of each mbarrier arrival (not a loader's
    arrive.expect_tx) whose nearest preceding ordering instruction is not a barrier of its
    partition: one thread would signal while other warps of it may still read or write the
    buffer it releases. (bar.warp.sync, a warp's own, is listed: enough only for a 1-warp
    partition.)"""
    last, unsynced = "", []
    for number, line in enumerate(ptx.splitlines(), 1):
        match = _PTX_OP.match(line)
        if not match or not match.group(1).startswith(_ORDERING):
            continue
        op = match.group(1)
        if op.startswith("mbarrier.arrive") and "expect_tx" not in op:
            if not last.startswith(("bar.sync", "barrier.sync")):
                unsynced.append((number, last))
        last = op
    return unsynced
