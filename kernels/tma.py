"""Whether a launch reads and writes its (seq, head_dim) tiles through tensor descriptors (TMA,
Hopper's bulk copy engine: one instruction per tile, out-of-range rows zero-filled by the
hardware) or through masked pointer loads.

Descriptors are used when the config asks for them (TileConfig.tma), Triton has
tl.make_tensor_descriptor, the GPU is Hopper or newer (the interpreter emulates descriptors, so
CPU tests check the same code), and every tensor meets the hardware's alignment: a 16-byte
aligned base and 16-byte multiples for the strides that address it. Otherwise the launch takes
the pointer path: same results, no error. The atomic dQ's float32 adds are decided apart
from the loads (reduces_through_descriptors): a bulk reduce-add wherever descriptors exist.
"""

import torch
import triton.language as tl

from flashtrain.kernels import tuning
from flashtrain.kernels.tuning import TileConfig, interpreted

_ALIGN = 16  # bytes: TMA's rule for the global base address and the non-unit strides


def available(device: torch.device) -> bool:
    if not hasattr(tl, "make_tensor_descriptor"):
        return False
    if interpreted():
        return True
    capability = tuning.gpu_capability(device)  # (a compile check stands in a GPU here)
    return capability is not None and capability[0] >= 9


def aligned(*tensors: torch.Tensor) -> bool:
    """Base 16-byte aligned; the sequence stride (a descriptor's row stride) and every batch or
    head stride a program offsets by (dims of size > 1) a multiple of 16 bytes."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % _ALIGN:
            return False
        for dim in range(t.dim() - 1):
            is_row_stride = dim == t.dim() - 3  # (..., seq, head, head_dim)
            if (is_row_stride or t.shape[dim] > 1) and (t.stride(dim) * size) % _ALIGN:
                return False
    return True


def use_descriptors(cfg: TileConfig, device: torch.device, *tensors: torch.Tensor) -> bool:
    """The kernels' TMA flag for a launch over `tensors` (every (.., seq, head, head_dim) tensor
    the kernel reads or writes by tiles)."""
    return bool(cfg.tma and available(device) and aligned(*tensors))


def reduces_through_descriptors(device: torch.device, *tensors: torch.Tensor) -> bool:
    """Whether float32 atomic adds into `tensors` go through descriptors (bulk reduce-add, one
    instruction per tile) rather than per-element atomics: wherever descriptors exist and the
    tensors are aligned, whatever the config's load path. Per-element atomics hold a tile of
    64-bit addresses in registers: at d128 (pointer loads) they took the atomic-dQ pass to 255
    registers and a spill; the bulk reduce compiles to 238 and none (docs/kernel_compile.md).
    Not under the interpreter, which emulates descriptor loads and stores but not their
    reductions (CPU tests then check the per-element path; the GPU tests check this one)."""
    return not interpreted() and available(device) and aligned(*tensors)
