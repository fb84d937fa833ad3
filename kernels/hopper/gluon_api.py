"""The Gluon names the Hopper kernels use, across the Triton versions they must compile under:
3.6 (the GPU machines) and the newest (CI). Gluon is experimental and renamed things between
them; everything version-dependent is decided here, once, at import:

    tma_load(desc, coord, barrier, dst)    3.6: tma.async_copy_global_to_shared; newer: tma.async_load
    tma_store(desc, coord, src)            3.6: tma.async_copy_shared_to_global; newer: tma.async_store
    partition_barrier()                    3.6: gl.thread_barrier; newer: gl.barrier (the warps of the
                                           calling partition, a named barrier inside warp_specialize)
    TMA_REDUCE                             the bulk reduce-add (tma.async_atomic_add, cp.reduce.async.bulk):
                                           newer Gluon has it, 3.6's does not (its dQ path adds with
                                           per-element atomics instead: flash_bwd_ws.py)

`available()` says whether this Triton has Gluon's Hopper API at all (before 3.5 it has not);
where it has not, the Gluon kernels are never chosen (kernels/hopper/route.py) and importing
them is skipped.
"""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
except ImportError:  # a Triton without Gluon's Hopper API: nothing here is used
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None

__all__ = [
    "TMA_REDUCE", "available", "fence_async_shared", "gl", "gluon", "mbarrier",
    "partition_barrier", "tma", "tma_load", "tma_reduce_add", "tma_store", "warpgroup_mma",
    "warpgroup_mma_wait",
]  # fmt: skip


def available() -> bool:
    """Whether this Triton can compile the Gluon kernels here (Gluon's Hopper API, warp
    specialization with per-partition register counts, device-side descriptors)."""
    return (
        gl is not None
        and hasattr(gl, "warp_specialize")
        and hasattr(tma, "make_tensor_descriptor")
        and (hasattr(gl, "barrier") or hasattr(gl, "thread_barrier"))
    )


if available():
    _new_tma = hasattr(tma, "async_load")  # renamed after 3.6; the old names now raise
    tma_load = tma.async_load if _new_tma else tma.async_copy_global_to_shared
    tma_store = tma.async_store if _new_tma else tma.async_copy_shared_to_global
    partition_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
    # a builtin both versions can name; called only where TMA_REDUCE is true
    tma_reduce_add = getattr(tma, "async_atomic_add", tma_store)
    TMA_REDUCE = gl.constexpr(hasattr(tma, "async_atomic_add"))
else:
    tma_load = tma_store = partition_barrier = tma_reduce_add = None
    TMA_REDUCE = False
