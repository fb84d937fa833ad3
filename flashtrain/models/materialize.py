"""A model built on the meta device made real where its parameters live, shard by shard.

    with torch.device("meta"):
        model = build_model(cfg.model, cfg.attention)    # no memory, no random draws
    fully_shard(...)                                      # optional: FSDP2 shards the meta params
    materialize(model, device)                            # each rank: its shards only, initialised
    report = fill_from(model, source)                     # optional: a checkpoint's rows over them

materialize: in one process (no parameter split over ranks) the model is initialised on CPU
exactly as a model built on CPU is (the constructors' own resets, then init_weights, drawn from
the default generator in the same order: the same seed gives the same weights bit for bit), then
copied to `device`. Split over ranks (FSDP2's DTensors), each rank initialises its own shards on
the device, drawing from a stream of its own shard (the seed and the shard's index), so the
weights have the same distribution and no two shards repeat each other, while the replicas of a
shard (HSDP: the same shard in every shard group) draw the same weights; nothing whole is ever
allocated.

fill_from: every tensor of a RowSource (a checkpoint's tensors, read a row range at a time) is
copied into the rows this rank holds; a positional table of another length is read whole (one
table), resized (positions.resize_position_tables), and cut to the rows held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from flashtrain.models.positions import resize_position_tables


def is_split_over_ranks(model: nn.Module) -> bool:
    """Whether some parameter is a DTensor whose mesh has more than one rank."""
    return any(isinstance(p, DTensor) and p.device_mesh.size() > 1 for p in model.parameters())


def materialize(model: nn.Module, device: torch.device | str, *, initialise: bool = True) -> None:
    """Allocate the meta model's tensors on `device` (each rank its shards) and initialise them
    (the module docstring says how; initialise=False: left uninitialised, for a caller that
    fills every one of them)."""
    device = torch.device(device)
    model.to_empty(device=device)
    if not initialise:
        return
    if is_split_over_ranks(model):
        devices = [device] if device.type != "cpu" else []
        seed = _rank_seed(torch.initial_seed(), _shard_index(model))
        # the run's generators continue as they were: only this block draws from the shard's
        with torch.random.fork_rng(devices=devices, device_type=device.type):
            torch.manual_seed(seed)  # CPU and the device alike
            with _local_parameters(model, staging=None):
                model.init_weights()
        return
    # one process: on CPU, in the order a CPU construction draws, then copied to the device (on
    # a CPU device the parameters themselves are drawn into: no staging copy)
    staging = None if device.type == "cpu" else "cpu"
    with _local_parameters(model, staging=staging) as staged:
        for module in model.modules():
            reset = getattr(module, "reset_parameters", None)
            if reset is not None and any(True for _ in module.parameters(recurse=False)):
                reset()  # the constructors' draws, so init_weights starts where it did
        model.init_weights()
        with torch.no_grad():
            for param, local in staged:
                if staging is not None:
                    _local(param).copy_(local)


def _rank_seed(seed: int, rank: int) -> int:
    return (seed * 1_000_003 + rank + 1) % (2**63)


def _shard_index(model: nn.Module) -> int:
    """Which shard this rank holds, numbered over the mesh dimensions a parameter is sharded on
    (the first split one's: FSDP2 places them all alike); replicated dimensions do not count,
    so a shard's replicas share it. On a 1-D mesh of every rank (FSDP2), the rank itself."""
    param = next(
        p for p in model.parameters() if isinstance(p, DTensor) and p.device_mesh.size() > 1
    )
    mesh, coordinate, index = param.device_mesh, param.device_mesh.get_coordinate(), 0
    for dim, placement in enumerate(param.placements):
        if not placement.is_replicate():
            index = index * mesh.size(dim) + coordinate[dim]
    return index


class _local_parameters:
    """Within the block, every module's parameters are plain tensors: the shards this rank
    holds (staging=None: the DTensors' local tensors, written in place) or CPU copies of their
    shape (staging="cpu"; `as` gives [(param, its CPU copy)]). init_weights and the modules'
    resets then run on plain tensors. A parameter two modules share stays shared."""

    def __init__(self, model: nn.Module, staging: str | None):
        self.model, self.staging = model, staging
        self.swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
        self.staged: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}

    def __enter__(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        for module in self.model.modules():
            for name, param in list(module._parameters.items()):
                if param is None:
                    continue
                if id(param) not in self.staged:
                    local = _local(param)
                    if self.staging is not None:
                        local = torch.empty(local.shape, dtype=local.dtype, device=self.staging)
                    plain = nn.Parameter(local, requires_grad=param.requires_grad)
                    self.staged[id(param)] = (param, plain)
                module._parameters[name] = self.staged[id(param)][1]
                self.swapped.append((module, name, param))
        return [(param, plain.data) for param, plain in self.staged.values()]

    def __exit__(self, *exc) -> None:
        for module, name, param in self.swapped:
            module._parameters[name] = param


def _local(param: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of `param` (its shard of a DTensor; the tensor itself)."""
    data = param.data if isinstance(param, nn.Parameter) else param
    return data.to_local() if isinstance(data, DTensor) else data


def held_rows(param: torch.Tensor) -> tuple[int, int]:
    """The rows (dim 0) of `param`'s global tensor this rank holds: all of a plain tensor; of a
    DTensor, its Shard(0) chunk on every mesh dimension (torch.chunk's split, as FSDP2 shards),
    replicated dimensions adding nothing. Another placement is refused."""
    rows = param.shape[0] if param.dim() else 1
    if not isinstance(param, DTensor):
        return 0, rows
    start, stop = 0, rows
    coordinate = param.device_mesh.get_coordinate()
    for mesh_dim, placement in enumerate(param.placements):
        if placement.is_replicate():
            continue
        if not (placement.is_shard() and placement.dim == 0):
            raise ValueError(f"cannot fill a parameter placed as {param.placements}: Shard(0) only")
        chunk = -(-(stop - start) // param.device_mesh.size(mesh_dim))
        lo = min(start + coordinate[mesh_dim] * chunk, stop)
        start, stop = lo, min(lo + chunk, stop)
    return start, stop


class RowSource(Protocol):
    """A checkpoint's tensors by the model's state-dict names, read a row range at a time."""

    description: str  # what a log line calls it: "hf:gpt2", "checkpoint runs/a/step_000100"

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """{name: full shape} of every tensor it holds."""

    def rows(self, name: str, start: int, stop: int, placed=None) -> torch.Tensor:
        """Rows start..stop of tensor `name` (reading no more of the file than they need);
        placed: the parameter they go into (a DTensor says how its rows are split)."""

    def check_rows(self, held: dict[str, tuple[int, int]]) -> None:
        """Checks that need values (a tied head equal to its embedding), on the rows this rank
        holds of each tensor (held: name -> (start, stop)): the ranks check all between them."""


def shape_misfits(
    own: dict, saved: dict, *, optional: tuple[str, ...] = (), resizable: tuple[str, ...] = ()
) -> list[str]:
    """Lines naming how tensors of `saved` shapes do not fit a model of `own` shapes (both
    name -> shape): missing ones (but names starting with `optional`), unexpected ones, and other
    shapes (but the `resizable` names); [] when they fit."""
    missing = sorted(n for n in own if n not in saved and not (optional and n.startswith(optional)))
    unexpected = sorted(n for n in saved if n not in own)
    wrong = sorted(
        n for n in set(own) & set(saved) if tuple(own[n]) != tuple(saved[n]) and n not in resizable
    )
    lines = []
    if missing:
        lines.append(f"  missing in the checkpoint ({len(missing)}): {', '.join(missing[:5])}")
    if unexpected:
        lines.append(f"  not in this model ({len(unexpected)}): {', '.join(unexpected[:5])}")
    for n in wrong[:5]:
        lines.append(f"  {n}: checkpoint {list(saved[n])} vs model {list(own[n])}")
    return lines


@dataclass
class FillReport:
    """What fill_from did, for the run's log."""

    source: str
    read: list[str] = field(default_factory=list)  # tensors copied in
    resized: list[str] = field(default_factory=list)  # positional tables of another length
    kept_fresh: list[str] = field(default_factory=list)  # not in the source: initialised
    elements_read: int = 0  # of the source's tensors, by this rank

    def summary(self) -> str:
        """Where from, and the three counts always (a run's log is read for a zero too)."""
        line = f"initial weights from {self.source}: {len(self.read)} tensors read"
        line += f", {len(self.resized)} resized" + (
            f" ({', '.join(self.resized)})" if self.resized else ""
        )
        line += f", {len(self.kept_fresh)} not in it (kept their fresh init)"
        if self.kept_fresh:
            more = ", ..." if len(self.kept_fresh) > 4 else ""
            line += ": " + ", ".join(self.kept_fresh[:4]) + more
        return line


def fill_from(
    model: nn.Module,
    source: RowSource,
    *,
    position_mode: str = "interpolate",
    optional: tuple[str, ...] = (),
    longer_positions: str = "resize",
    what: str = "the checkpoint",
) -> FillReport:
    """Copy `source`'s tensors into the rows of the materialised `model` this rank holds.
    Every tensor of the model must be in the source (but those whose names start with one of
    `optional`, which keep their values), and every tensor of the source in the model, of the
    same shape but for positional tables (resized by `position_mode`: interpolate or copy).
    longer_positions="first": a source's 1-D table longer than the model's gives its first
    rows instead (a transformers checkpoint run on a shorter sequence). Raises ValueError
    naming what does not fit."""
    params = dict(model.named_parameters())
    shapes = {name: tuple(shape) for name, shape in source.shapes().items()}
    position_tables = getattr(model, "position_tables", {})
    own = {name: tuple(param.shape) for name, param in params.items()}
    misfits = shape_misfits(own, shapes, optional=optional, resizable=tuple(position_tables))
    if misfits:
        raise ValueError(
            "\n".join([f"{what} ({source.description}) does not fit this model:", *misfits])
        )
    report = FillReport(source.description)
    with torch.no_grad():
        for name, param in params.items():
            if name not in shapes:
                report.kept_fresh.append(name)
                continue
            start, stop = held_rows(param)
            if shapes[name] == tuple(param.shape):
                rows = source.rows(name, start, stop, placed=param)
            else:  # a positional table of another length: whole, resized, then our rows
                table = source.rows(name, 0, shapes[name][0])
                longer = table.shape[0] > param.shape[0]
                if longer_positions == "first" and position_tables[name] == "1d" and longer:
                    table = table[: param.shape[0]]
                own = {name: torch.empty(param.shape, device="meta")}
                table = resize_position_tables({name: table}, own, position_tables, position_mode)[
                    name
                ]
                rows = table[start:stop]
                report.resized.append(f"{name} {list(shapes[name])} -> {list(param.shape)}")
            report.elements_read += rows.numel()
            _local(param).copy_(rows.reshape(_local(param).shape))
            report.read.append(name)
        source.check_rows({name: held_rows(param) for name, param in params.items()})
    return report


def materialize_from(model: nn.Module, device, source: RowSource, **fill) -> FillReport:
    """A meta-built model made real on `device` from `source` (fill_from's keywords): fresh
    weights drawn only when the source lacks some tensor (an optional head), since a complete
    source overwrites every one of them."""
    complete = set(dict(model.named_parameters())) <= set(source.shapes())
    materialize(model, device, initialise=not complete)
    return fill_from(model, source, **fill)
