"""Global scratch for the kernels that need it, in whichever thread launches them.

A compiled kernel may ask for global scratch at launch (`global_scratch_size > 0` in its
metadata: descriptors built on the device, the bulk dQ reduce, layout conversions). Triton's
launcher asks the allocator of the *calling context* for it: a ContextVar, so a thread that
never called `triton.set_allocator` sees the NullAllocator and the launch raises "Kernel requires
a runtime memory allocation, but no allocator was set". torch's autograd runs the backward of
CUDA ops on its own device thread, so an allocator set once (by the first forward) was missing
exactly there. Every launcher therefore provides it right before it launches (a ContextVar set:
well under a microsecond), as Triton's own tutorials do.
"""

import torch
import triton


def _torch_scratch(size: int, alignment: int, stream) -> torch.Tensor:  # noqa: ARG001
    # torch's caching allocator: cheap reuse, and CUDA graph capture sees the buffer.
    # (alignment: the caching allocator's blocks are 512-byte aligned, above any kernel's ask)
    return torch.empty(size, dtype=torch.int8, device="cuda")


def provide_scratch_allocator() -> None:
    """Make the scratch allocator the current context's (this thread's) before a launch."""
    triton.set_allocator(_torch_scratch)
