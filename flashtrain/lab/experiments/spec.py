"""What an experiment is: at each scale, a list of runs, what they need and what they cost.

A run is an ordinary `train.py` run given by Hydra overrides (kind "train"), or a benchmark
script with its arguments (kind "bench"). The matrices in flashtrain/lab/experiments/matrices.py hold
every experiment's runs as data; the driver (driver.py) turns them into commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCALES = ("tiny", "gpu-call", "gpu", "paper")  # gpu-call: context-length and pathfinder
EXPERIMENT_NAMES = ("context-length", "pathfinder", "speed-memory", "bert")


@dataclass(frozen=True)
class Run:
    name: str  # unique within the experiment; the run folder is <out>/runs/<name>
    args: tuple[str, ...]  # train: Hydra overrides; bench: the script's arguments
    kind: str = "train"  # train | bench
    script: str = "train.py"  # relative to the repository root
    nproc: int = 1  # processes on one node: > 1 runs under torchrun


@dataclass(frozen=True)
class ScalePlan:
    """One experiment at one scale with one data choice."""

    experiment: str
    scale: str
    data: str | None  # the data choice (context-length: pysrc | synthetic | openwebtext)
    runs: tuple[Run, ...]
    cost: str  # the documented hours and GPUs (paper) or what a run takes here
    needs: str  # what must be on the machine: GPU, network, prepared data


@dataclass(frozen=True)
class ScaleMatrix:
    """An experiment's settings at one scale: overrides common to every run, the run points
    (name suffix -> their own overrides) and, where the data is a choice, its options."""

    common: tuple[str, ...]
    points: tuple[tuple[str, tuple[str, ...]], ...]
    cost: str
    needs: str
    data: dict[str, tuple[str, ...]] = field(default_factory=dict)  # choice -> overrides
    default_data: str | None = None
    nproc: int = 1
    bench: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (name suffix, bench_attention args)


def plan_from_matrix(
    experiment: str, scale: str, matrix: ScaleMatrix, data: str | None
) -> ScalePlan:
    """The runs of `matrix`: for each point, common + data + point overrides, named
    <experiment>-<scale>[-<data>]-<point>; benchmark runs first."""
    if matrix.data:
        data = data or matrix.default_data
        if data not in matrix.data:
            raise ValueError(
                f"{experiment} at scale {scale} has no data '{data}'; choose one of "
                f"{', '.join(matrix.data)}"
            )
    elif data is not None:
        raise ValueError(f"{experiment} at scale {scale} takes no --data (its data is fixed)")
    prefix = f"{experiment}-{scale}" + (f"-{data}" if data else "")
    runs = [
        Run(f"{prefix}-{suffix}", args, kind="bench", script="scripts/bench_attention.py")
        for suffix, args in matrix.bench
    ]
    data_args = matrix.data.get(data, ()) if data else ()
    runs += [
        Run(f"{prefix}-{suffix}", (*matrix.common, *data_args, *args), nproc=matrix.nproc)
        for suffix, args in matrix.points
    ]
    return ScalePlan(experiment, scale, data, tuple(runs), matrix.cost, matrix.needs)
