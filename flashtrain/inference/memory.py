"""Will it fit? The memory a device has free now, and the largest request that fits in it:
generate and evaluate check their estimates (kv_cache.kv_cache_bytes, evaluate.forward_bytes)
against it before allocating, so a request too large is one line naming the figure, not an
allocator error after the output has begun (or a machine swapping)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from flashtrain.train.host_memory import available_host_bytes
from flashtrain.train.memory_estimate import gib

__all__ = ["available_bytes", "gib", "largest"]


def available_bytes(device: str | torch.device) -> int | None:
    """Bytes free for new tensors on `device`: CUDA's free memory, or the host's
    (train.host_memory.available_host_bytes: MemAvailable capped by the cgroup limit, the figure
    training checks too); None where that cannot be known (then nothing is refused)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return available_host_bytes() if device.type == "cpu" else None


def largest(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest n in [low, high] with fits(n), for fits true up to some n and false after
    (bytes growing with n); None when not even `low` fits."""
    if not fits(low):
        return None
    while low < high:  # fits(low) holds, the answer is in [low, high]
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low
