"""Collective helpers that work with or without a process group (one process: no-ops).

Leaf utilities: the checkpoint package and the trainer both share them, and neither knows how the
group was set up (flashtrain/train/distributed.py does that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist


def is_main_process() -> bool:
    """Rank 0, or the only process (no process group)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank src's `obj` on every rank (a no-op without a process group)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


T = TypeVar("T")


def on_rank_0(
    fn: Callable[[], T], errors: tuple[type[BaseException], ...], *, is_main: bool
) -> T | None:
    """fn() on rank 0 only (its value there, None on the other ranks). An error of `errors`
    it raises is raised on every rank, so no rank goes on alone into a collective that the
    others have left. Call it on every rank of the process group."""
    result, error = None, None
    if is_main:
        try:
            result = fn()
        except errors as e:
            error = e
    error = broadcast_object(error)
    if error is not None:
        raise error
    return result


def gather_objects(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
