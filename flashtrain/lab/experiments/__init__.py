"""The paper's experiments as data, and the driver that runs them (scripts/reproduce.py).

plan(experiment, scale, data=None) -> ScalePlan      the runs, their cost and needs
driver.execute(plan, out_dir, ...)                    print, run what is unfinished, report
"""

from __future__ import annotations

from flashtrain.lab.experiments.matrices import MATRICES
from flashtrain.lab.experiments.spec import (
    EXPERIMENT_NAMES,
    SCALES,
    Run,
    ScalePlan,
    plan_from_matrix,
)


def plan(experiment: str, scale: str, data: str | None = None) -> ScalePlan:
    if experiment not in MATRICES:
        raise ValueError(f"unknown experiment '{experiment}'; choose one of {', '.join(MATRICES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale '{scale}'; choose one of {', '.join(SCALES)}")
    if scale not in MATRICES[experiment]:
        scales = ", ".join(MATRICES[experiment])
        raise ValueError(f"{experiment} has no scale '{scale}'; its scales: {scales}")
    return plan_from_matrix(experiment, scale, MATRICES[experiment][scale], data)


__all__ = ["EXPERIMENT_NAMES", "SCALES", "Run", "ScalePlan", "plan"]
