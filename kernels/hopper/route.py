"""Which backward a call takes: the warp-specialized Gluon kernel (flash_bwd_ws) or the Triton
kernels (flash_bwd_dkdv + atomic dQ, or + flash_bwd_dq). The one place that decides;
flash_backward asks it once per call, with the dK/dV config the tuning table gives.

The Gluon kernel runs where the config asks for it (TileConfig.warp_specialize on the dkdv kind:
a tuning table's entry, or a sweep's override; the built-in rules never do until a GPU measures
it) and the call is one it covers: a Hopper GPU (sm_90: wgmma and setmaxnreg exist there only),
a Triton whose Gluon has the Hopper API, fp16 or bf16, head_dim 64 or 128, causal or no mask, no
dropout, soft-cap, ALiBi, window or block mask, the atomic-dQ backward (deterministic=False),
descriptor loads allowed (not FLASHTRAIN_TMA=0) and tensors its descriptors can address.
Everything else takes the Triton kernels, with the built-in dK/dV config (a warp-specialized
tile is no tile for them).
"""

from __future__ import annotations

import torch
import triton

from flashtrain.kernels import tma, tuning
from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.hopper import gluon_api
from flashtrain.kernels.tuning import TileConfig

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
BLOCK_N = 128  # the key tile: 64 keys for each of the two consumer warpgroups
NUM_WARPS = 8  # the consumers: two warpgroups (the loader and dQ writer come on top)
# (block_m, stages) a config may ask for, by head_dim: query rows a streamed tile holds and the
# depth of the Q / dO ring. At d128, 3 stages take 231,788 B of shared memory (of 232,448) and
# spill; at d64, 128-row tiles spill a few bytes in the consumers (docs/kernel_compile.md), so
# only a sweep tries them
TILES = {64: ((64, 2), (64, 3), (128, 2)), 128: ((64, 2),)}
MAX_FLAT_INDEX = 2**31 - 1  # lse and delta are addressed as one flat buffer with int32 coordinates


def ws_backward_config(block_m: int = 64, stages: int = 2) -> TileConfig:
    """The dK/dV config that names the warp-specialized backward: a tuning table's entry, a
    sweep's override (block_d follows head_dim at launch)."""
    return TileConfig(block_m, BLOCK_N, 0, NUM_WARPS, stages, tma=True, warp_specialize=True)


def config_blocker(cfg: TileConfig, head_dim: int) -> str | None:
    """Why the kernel cannot run with `cfg` at `head_dim`, or None."""
    if cfg.block_n != BLOCK_N or cfg.num_warps != NUM_WARPS:
        return (f"its tile holds block_n={BLOCK_N} keys over num_warps={NUM_WARPS}; the config "
                f"has {cfg.block_n} and {cfg.num_warps}")  # fmt: skip
    if (cfg.block_m, cfg.num_stages) not in TILES.get(head_dim, ()):
        return (f"(block_m, num_stages) = {(cfg.block_m, cfg.num_stages)} at head_dim "
                f"{head_dim}; allowed {TILES.get(head_dim)}")  # fmt: skip
    return None


def _heads_adjacent(t: torch.Tensor) -> bool:
    """A (B, S, H, D) view whose heads sit side by side in a row (stride D): one descriptor over
    a sequence's (S, H * D) rows reaches every head."""
    return t.shape[2] == 1 or t.stride(2) == t.shape[3]


def ws_backward_blocker(cfg: TileConfig, *, q4, k4, v4, do4, dk4, dv4, lse, dropout_p: float,
                        softcap: float, alibi_slopes, window_left: int, window_right: int,
                        sparse: bool, deterministic: bool) -> str | None:  # fmt: skip
    """None where the warp-specialized backward computes this call, else one line saying why
    not. Tensors are the (B, S, H, D) views the launcher passes (a packed call: batch 1)."""
    if not cfg.warp_specialize:
        return "the dK/dV config does not ask for the warp-specialized backward"
    if not cfg.tma:
        return f"descriptor loads are off ({tuning.TMA_ENV}=0 or the config): it has no other"
    if not gluon_api.available():
        return f"triton {triton.__version__} has no Gluon Hopper API"
    if tuning.interpreted():
        return "Gluon kernels do not run on the Triton interpreter"
    capability = tuning.gpu_capability(q4.device)
    if capability != (9, 0):
        return f"it needs a Hopper GPU (sm_90); this is {capability or q4.device.type}"
    head_dim = q4.shape[-1]
    blockers = [
        (q4.dtype not in DTYPES, f"dtype {q4.dtype}; it covers float16 and bfloat16"),
        (head_dim not in HEAD_DIMS, f"head_dim {head_dim}; it covers {HEAD_DIMS}"),
        (dropout_p > 0.0, "dropout"),
        (softcap > 0.0, "soft-capping"),
        (alibi_slopes is not None, "ALiBi"),
        (window_left < UNBOUNDED or window_right not in (0, UNBOUNDED), "a sliding window"),
        (sparse, "a block mask"),
        (deterministic, "deterministic=True (its dQ adds are atomic)"),
    ]
    for blocked, why in blockers:
        if blocked:
            return f"{why} is not covered"
    tiles = (q4, k4, v4, do4, dk4, dv4)
    if not tma.aligned(*tiles) or not all(_heads_adjacent(t) for t in tiles):
        return "a tensor its descriptors cannot address (16-byte alignment, heads adjacent)"
    if not lse.is_contiguous() or lse.numel() > MAX_FLAT_INDEX:
        return "lse must be contiguous with under 2^31 entries"
    return config_blocker(cfg, head_dim)
