"""Print `name==floor` for every dependency that pyproject.toml gives a floor (`>=`), the
project's and the `hf` extra's: the oldest releases that .ci/floors installs together and tests.

torch and triton are left to .ci/floors: torch is the CPU build on local disk (PyPI's Linux torch
of the floor's release is a CUDA build of several GB), triton comes with what torch allows. A
dependency without a floor is an error: a floor that is not stated cannot be tested.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib  # Python 3.11 on, as on the CI machine

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
NOT_PINNED = {"torch", "triton"}
EXTRAS = ("hf",)
FLOOR = re.compile(r">=\s*([0-9][0-9A-Za-z.]*)")


def floor_pins(pyproject: dict) -> list[str]:
    project = pyproject["project"]
    requirements = list(project["dependencies"])
    for extra in EXTRAS:
        requirements += project["optional-dependencies"][extra]
    pins = []
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        if name.lower() in NOT_PINNED:
            continue
        floor = FLOOR.search(requirement)
        if floor is None:
            raise SystemExit(f"pyproject.toml: {requirement!r} has no floor (>=): state one")
        pins.append(f"{name}=={floor.group(1)}")
    return pins


if __name__ == "__main__":
    with PYPROJECT.open("rb") as f:
        print("\n".join(floor_pins(tomllib.load(f))))
