"""Timing and memory measurement on CUDA, and the device's own ceilings (matmul peak, copy
bandwidth) so every figure can also be read as a fraction of the chip."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass

import torch

from flashtrain.utils import git_commit

COMMIT_ENV = "FLASHTRAIN_COMMIT"


@dataclass
class Measurement:
    ms: float | None  # median milliseconds; None when it did not run
    peak_mib: float | None  # peak allocated beyond what was live before the call
    note: str = ""  # "OOM", "unsupported: ...", ...


def _cuda(device) -> bool:
    return torch.device(device if device is not None else default_device()).type == "cuda"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def time_ms(fn, warmup: int = 5, rep: int = 20, device=None) -> float:
    """Median time of fn() in milliseconds. CUDA: triton.testing.do_bench (L2 flushed before
    each call), sized to about `rep` calls; CPU (the suite's dry run): wall clock of `rep` calls."""
    if _cuda(device):
        from triton.testing import do_bench

        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        once = max((time.perf_counter() - start) * 1e3, 1e-3)
        return do_bench(fn, warmup=once * warmup, rep=once * rep, return_mode="median")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rep):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def is_cuda_fault(err: BaseException) -> bool:
    """A sticky CUDA error (illegal address, launch failure, ...): the context is dead, every later
    launch in this process fails the same way, so a measurement must not turn it into a note."""
    accelerator_error = getattr(torch, "AcceleratorError", ())
    return isinstance(err, accelerator_error) or "CUDA error" in str(err)


def measure(fn, warmup: int = 5, rep: int = 20, device=None, *, baseline: bool) -> Measurement:
    """Time fn and record its peak extra memory (CUDA only); OOM becomes a note. A baseline's
    RuntimeError (an SDPA backend with no kernel for these inputs) is noted "unsupported"; any
    error in flashtrain's own op (baseline=False), and a CUDA fault anywhere, is raised."""
    cuda = _cuda(device)
    try:
        peak = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        fn()
        if cuda:
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        return Measurement(time_ms(fn, warmup, rep, device), peak)
    except torch.cuda.OutOfMemoryError:
        return Measurement(None, None, "OOM")
    except RuntimeError as err:
        if not baseline or is_cuda_fault(err):
            raise
        return Measurement(None, None, f"unsupported: {str(err).splitlines()[0][:120]}")
    finally:
        if cuda:
            torch.cuda.empty_cache()


def matmul_peak_tflops(n: int = 8192, dtype=torch.bfloat16, device=None) -> float:
    device = device or default_device()
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = time_ms(lambda: a @ b, warmup=10, rep=30, device=device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def copy_bandwidth_gbs(mib: int = 1024, device=None) -> float:
    """Device-to-device copy bandwidth (read + write counted)."""
    device = device or default_device()
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup=5, rep=20, device=device)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def environment() -> dict:
    """What a figure was measured on: GPU, versions, commit."""
    import triton

    info = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device"] = props.name
        info["capability"] = f"{props.major}.{props.minor}"
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    else:
        info["device"] = "cpu"
    # A GPU machine's copy of the tree names its commit in FLASHTRAIN_COMMIT, which wins: the
    # copy may carry a stale .git (2026-11-27: it named the session's first commit, "-dirty")
    info["commit"] = os.environ.get(COMMIT_ENV) or git_commit() or "unknown"
    return info
