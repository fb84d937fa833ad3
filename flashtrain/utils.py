"""Small helpers that every layer may use (a leaf: imports nothing from flashtrain): counts in
K/M/G/T for log lines and reports, and the git commit of the code being run for provenance."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path


def format_count(n: float) -> str:
    """1234567 -> "1.23M": two decimals and a K/M/G/T suffix, whole numbers below a thousand."""
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """The commit of the code being run (with `-dirty` when the tree has changes), or None."""
    where = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def missing_modules(names) -> list[str]:
    """The modules of `names` that cannot be imported here (not installed, or blocked)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # ValueError: blocked (None in sys.modules)
            found = False
        if not found:
            missing.append(name)
    return missing
