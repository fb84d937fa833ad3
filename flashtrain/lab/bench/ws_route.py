"""Which kernels a call of the attention ops takes under the configs in force: the Gluon kernels
for Hopper (the forward, kernels/hopper/flash_fwd_ws.py; the backward, flash_bwd_ws.py), the
Triton kernels or the PyTorch path. The route (kernels/hopper/route.py) is asked with the
arguments flash_forward and flash_backward pass it, because a call it declines runs the Triton
kernels without a word: a measurement of a Gluon kernel must say that it is what it measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from flashtrain.attention.route import choose_route
from flashtrain.kernels import tuning
from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.hopper.route import (
    ws_backward_blocker,
    ws_backward_config,
    ws_forward_blocker,
    ws_forward_config,
)
from flashtrain.kernels.tuning import TileConfig

GLUON = "gluon"  # the kernel field of a call a Gluon kernel computes
GLUON_KERNEL = "flash_backward_ws_kernel"  # the Gluon backward's name in a GPU trace
GLUON_FORWARD_KERNEL = "flash_forward_ws_kernel"  # the Gluon forward's
# kind -> (what the rows call its kernel, the prefix of its kernels' names in a trace, the Gluon
# kernel's name there)
KERNELS = {
    "fwd": ("forward", "flash_forward", GLUON_FORWARD_KERNEL),
    "dkdv": ("backward", "flash_backward", GLUON_KERNEL),
}


def variant_config() -> TileConfig:
    """The dK/dV config that asks for the Gluon backward: 64-row query tiles, a 2-slot ring (the
    tile route.TILES allows at head_dim 64 and 128)."""
    return ws_backward_config(block_m=64, stages=2)


def forward_variant_config(stages: int = 2) -> TileConfig:
    """The fwd config that asks for the Gluon forward: a `stages`-slot K / V ring (2: the depth
    route.FWD_STAGES allows at head_dim 64 and 128)."""
    return ws_forward_config(stages=stages)


def variant_configs(*kinds: str) -> dict[str, TileConfig]:
    """kind -> the config that asks for its Gluon kernel (fwd, dkdv), for tuning.overridden."""
    made = {"fwd": forward_variant_config, "dkdv": variant_config}
    return {kind: made[kind]() for kind in kinds}


def _views(q, k, v, packed: bool):
    """The launchers' (B, S, H, D) views: a packed (total, H, D) call is one batch."""
    return [t.unsqueeze(0) if packed else t for t in (q, k, v)]


def _decided(q, reason: str | None) -> tuple[str, str | None]:
    if choose_route(q) == "torch":
        return "torch", reason or "CPU tensors take the PyTorch path"
    return (GLUON, None) if reason is None else ("triton", reason)


def forward_route(q, k, v, *, causal: bool, packed: bool = False) -> tuple[str, str | None]:
    """(kernel, why not Gluon) of the forward of flash_attn_func(q, k, v, causal=causal), or with
    packed=True of flash_attn_varlen_func on (total, H, D) tensors, under the fwd config in force:
    ("gluon", None), ("triton", reason) or ("torch", reason) where the call takes the PyTorch
    path. q: (B, S, Hq, D) or (total, Hq, D); k, v: likewise with Hkv heads."""
    q4, k4, v4 = _views(q, k, v, packed)
    cfg = tuning.forward_config(q.shape[-1], q.dtype, q.device)  # a dense call: no block size
    reason = ws_forward_blocker(
        cfg, q4=q4, k4=k4, v4=v4, o4=torch.empty_like(q4), dropout_p=0.0, softcap=0.0,
        alibi_slopes=None, window_left=UNBOUNDED, window_right=0 if causal else UNBOUNDED,
        sparse=False,
    )  # fmt: skip
    return _decided(q, reason)


def backward_route(q, k, v, *, causal: bool, packed: bool = False) -> tuple[str, str | None]:
    """(kernel, why not Gluon) of the default backward (deterministic=False) of
    flash_attn_func(q, k, v, causal=causal), or with packed=True of flash_attn_varlen_func on
    (total, H, D) tensors, under the dK/dV config in force: ("gluon", None), ("triton", reason)
    or ("torch", reason) where the call takes the PyTorch path (CPU tensors, no interpreter).
    q: (B, S, Hq, D) or (total, Hq, D); k, v: likewise with Hkv heads."""
    q4, k4, v4 = _views(q, k, v, packed)
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
    return _decided(q, reason)


ROUTES = {"fwd": forward_route, "dkdv": backward_route}


def routes(q, k, v, *, causal: bool, packed: bool = False) -> dict[str, tuple[str, str | None]]:
    """kind -> (kernel, why not Gluon) of the forward (fwd) and the backward (dkdv) of the call."""
    return {kind: route(q, k, v, causal=causal, packed=packed) for kind, route in ROUTES.items()}


def label(kernel: str, reason: str | None) -> str:
    """ "gluon", or "triton (route: Gluon kernels do not run on the Triton interpreter)"."""
    return kernel if reason is None else f"{kernel} (route: {reason})"


def sweep_declines(kind: str, q, k, v) -> str | None:
    """Why the config in force for `kind` asks for a Gluon kernel (the forward on fwd, the
    backward on dkdv) but would not get it on q, k, v (causal or full), or None. A sweep must not
    time such a config: its launches run the built-in one, so it would "agree" and might "win"
    by noise."""
    cfg = tuning.config(kind, q.shape[-1], q.dtype, q.device)
    if kind not in ROUTES or not cfg.gluon:
        return None
    for causal in (False, True):
        _, reason = ROUTES[kind](q, k, v, causal=causal)
        if reason:
            return reason
    return None


def launched_kernels(fn: Callable[[], object], device) -> tuple[object, list[str] | None]:
    """fn()'s result and the names of flashtrain's attention kernels (flash_forward*,
    flash_backward*) it ran on the GPU, from a profiler trace (None off CUDA, where there is
    nothing to trace)."""
    if torch.device(device).type != "cuda":
        return fn(), None
    from torch.profiler import ProfilerActivity, profile

    prefixes = tuple(prefix for _, prefix, _ in KERNELS.values())
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        result = fn()
        torch.cuda.synchronize()
    return result, sorted({e.name for e in trace.events() if any(p in e.name for p in prefixes)})


def route_failures(kernel: str, reason: str | None, seen: list[str] | None, *,
                   require_gluon: bool, kind: str = "dkdv") -> list[str]:  # fmt: skip
    """Why a row of the Gluon kernel of `kind` (dkdv: the backward; fwd: the forward) is no
    measurement of it: the route declined it (where it must take it: on the GPU), or the trace
    shows that kind's kernels but not the Gluon one."""
    what, prefix, gluon_kernel = KERNELS[kind]
    failures = []
    if require_gluon and kernel != GLUON:
        failures.append(f"the route declined the Gluon {what}: {label(kernel, reason)}")
    mine = [name for name in seen or () if prefix in name]
    if mine and kernel == GLUON and gluon_kernel not in mine:
        failures.append(f"the route took the Gluon {what} but the trace shows {', '.join(mine)}")
    return failures


@contextlib.contextmanager
def overridden(overrides: dict[str, TileConfig]):
    """Every kind's config of `overrides` (kind -> TileConfig) in force inside the block
    (tuning.overridden, nested: process-wide, as that is)."""
    with contextlib.ExitStack() as stack:
        for kind, cfg in overrides.items():
            stack.enter_context(tuning.overridden(kind, cfg))
        yield


def gluon_kinds(overrides: dict[str, TileConfig]) -> tuple[str, ...]:
    """The kinds whose config in `overrides` asks for a Gluon kernel, fwd first."""
    return tuple(kind for kind in KERNELS if kind in overrides and overrides[kind].gluon)


def route_fields(routes: dict[str, tuple[str, str | None]], kinds) -> dict:
    """A row's record of which kernels ran (routes: kind -> (kernel, why not Gluon), as
    `routes` gives them; kinds: the Gluon kernels the row measures): forward_kernel and
    forward_route, backward_kernel and backward_route, gluon (kinds), and kernel and route: those
    of the Gluon kernels measured ("gluon" where the route took them all, else the first it
    declined) or, where the row measures none, the backward's (as issue 43's rows had them)."""
    declined = [routes[kind] for kind in kinds if routes[kind][0] != GLUON]
    kernel, reason = declined[0] if declined else (GLUON, None) if kinds else routes["dkdv"]
    fields = {"gluon": list(kinds), "kernel": kernel, "route": reason}
    for kind, (what, _, _) in KERNELS.items():
        fields[f"{what}_kernel"], fields[f"{what}_route"] = routes[kind]
    return fields
