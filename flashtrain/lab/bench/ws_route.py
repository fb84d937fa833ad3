"""Which backward a call of the attention ops takes under the dK/dV config in force: the
warp-specialized Gluon kernel (kernels/hopper/flash_bwd_ws.py), the Triton kernels or the
PyTorch path. The route (kernels/hopper/route.py) is asked with the arguments flash_backward
passes it, because a call it declines runs the Triton kernels without a word: a measurement of
the Gluon kernel must say that the Gluon kernel is what it measured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from flashtrain.attention.route import choose_route
from flashtrain.kernels import tuning
from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.hopper.route import ws_backward_blocker, ws_backward_config
from flashtrain.kernels.tuning import TileConfig

GLUON = "gluon"  # the kernel field of a call the Gluon backward computes
GLUON_KERNEL = "flash_backward_ws_kernel"  # its name in a GPU trace


def variant_config() -> TileConfig:
    """The dK/dV config that asks for the Gluon backward: 64-row query tiles, a 2-slot ring (the
    tile route.TILES allows at head_dim 64 and 128)."""
    return ws_backward_config(block_m=64, stages=2)


def backward_route(q, k, v, *, causal: bool, packed: bool = False) -> tuple[str, str | None]:
    """(kernel, why not Gluon) of the default backward (deterministic=False) of
    flash_attn_func(q, k, v, causal=causal), or with packed=True of flash_attn_varlen_func on
    (total, H, D) tensors, under the dK/dV config in force: ("gluon", None), ("triton", reason)
    or ("torch", reason) where the call takes the PyTorch path (CPU tensors, no interpreter).
    q: (B, S, Hq, D) or (total, Hq, D); k, v: likewise with Hkv heads."""
    q4, k4, v4 = (t.unsqueeze(0) if packed else t for t in (q, k, v))  # the launcher's views
    batch, seqlen, heads = q4.shape[:3]
    lse_shape = (heads, seqlen) if packed else (batch, heads, seqlen)  # as the op allocates it
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    cfg = tuning.config("dkdv", q.shape[-1], q.dtype, q.device)
    reason = ws_backward_blocker(
        cfg, q4=q4, k4=k4, v4=v4, do4=torch.empty_like(q4), dk4=torch.empty_like(k4),
        dv4=torch.empty_like(v4), lse=lse, dropout_p=0.0, softcap=0.0, alibi_slopes=None,
        window_left=UNBOUNDED, window_right=0 if causal else UNBOUNDED, sparse=False,
        deterministic=False,
    )  # fmt: skip
    if choose_route(q) == "torch":
        return "torch", reason or "CPU tensors take the PyTorch path"
    return (GLUON, None) if reason is None else ("triton", reason)


def label(kernel: str, reason: str | None) -> str:
    """ "gluon", or "triton (route: Gluon kernels do not run on the Triton interpreter)"."""
    return kernel if reason is None else f"{kernel} (route: {reason})"


def sweep_declines(kind: str, q, k, v) -> str | None:
    """Why the config in force for `kind` asks for the Gluon backward but would not get it on
    q, k, v (causal or full), or None. A sweep must not time such a config: its launches run
    the built-in one, so it would "agree" and might "win" by noise."""
    cfg = tuning.config(kind, q.shape[-1], q.dtype, q.device)
    if kind != "dkdv" or not cfg.warp_specialize:
        return None
    for causal in (False, True):
        _, reason = backward_route(q, k, v, causal=causal)
        if reason:
            return reason
    return None


def launched_kernels(fn: Callable[[], object], device) -> tuple[object, list[str] | None]:
    """fn()'s result and the names of flashtrain's backward kernels (flash_backward*) it ran on
    the GPU, from a profiler trace (None off CUDA, where there is nothing to trace)."""
    if torch.device(device).type != "cuda":
        return fn(), None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        result = fn()
        torch.cuda.synchronize()
    return result, sorted({e.name for e in trace.events() if "flash_backward" in e.name})


def route_failures(kernel: str, reason: str | None, seen: list[str] | None, *,
                   require_gluon: bool) -> list[str]:  # fmt: skip
    """Why a row of the Gluon backward is no measurement of it: the route declined it (where it
    must take it: on the GPU), or the trace shows backward kernels but not the Gluon one."""
    failures = []
    if require_gluon and kernel != GLUON:
        failures.append(f"the route declined the Gluon backward: {label(kernel, reason)}")
    if seen and kernel == GLUON and GLUON_KERNEL not in seen:
        failures.append(f"the route took the Gluon backward but the trace shows {', '.join(seen)}")
    return failures
