"""Every package that flashtrain's code imports is declared in pyproject.toml, so that its floor
is stated and .ci/floors tests it (omegaconf was imported in 14 files while only hydra-core was
declared)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip(
    "tomllib", reason="tomllib is Python 3.11's (the project allows 3.10)"
)

ROOT = Path(__file__).resolve().parents[2]
# imported only when a user asks for them, looked up first (importlib.util.find_spec)
UNDECLARED = {"liger_kernel": "scripts/bench_loss.py's optional comparison"}


def imported_top_levels() -> dict[str, str]:
    """{top-level module: a file importing it} over flashtrain/ and kernels/, absolute imports
    of modules outside the standard library and the project."""
    found: dict[str, str] = {}
    for folder in ("flashtrain", "kernels"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "flashtrain":
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    """The normalized names of every dependency, the extras' included."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    return {_normalized(re.match(r"[A-Za-z0-9_.-]+", r).group(0)) for r in requirements}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_package_is_declared():
    distributions = packages_distributions()
    names = declared()
    undeclared = []
    for module, path in imported_top_levels().items():
        if module in UNDECLARED:
            continue
        owners = {_normalized(d) for d in distributions.get(module, [module])}
        if not owners & names:
            undeclared.append(f"{module} ({path}; installed by {sorted(owners)})")
    assert not undeclared, f"imported, not in pyproject.toml: {undeclared}"
