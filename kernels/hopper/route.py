"""Which kernels a call takes: the Gluon kernels for Hopper or the Triton ones. The one place
that decides; flash_forward and flash_backward ask it once per call, with the config the tuning
table gives. A Gluon kernel runs where its kind's config asks for it (TileConfig.gluon: a tuning
table's entry, or a sweep's override; the built-in rules never do until a GPU measures it) and
the call is one it covers. Both cover: a Hopper GPU (sm_90: wgmma and setmaxnreg exist there
only), a Triton whose Gluon has the Hopper API, fp16 or bf16, head_dim 64 or 128, causal or no
mask, no dropout, soft-cap, ALiBi, window or block mask, descriptor loads allowed (not
FLASHTRAIN_TMA=0) and tensors their descriptors can address. Everything else takes the Triton
kernels with the built-in config (a Gluon tile is no tile for them).

    forward    ws_forward_blocker: the warp-specialized, persistent forward (flash_fwd_ws), whose
               descriptors read a batch as one (rows, heads * head_dim) matrix
    backward   ws_backward_blocker: the warp-specialized backward (flash_bwd_ws) or the Triton
               kernels (flash_bwd_dkdv + atomic dQ, or + flash_bwd_dq), with the dK/dV config;
               the atomic-dQ backward only (deterministic=False)
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
BLOCK_N = 128  # the key tile of both (the backward's: 64 keys for each consumer warpgroup)
NUM_WARPS = 8  # the backward's consumers: two warpgroups (the loader and dQ writer come on top)
# (block_m, stages) a config may ask for, by head_dim: query rows a streamed tile holds and the
# depth of the Q / dO ring. At d128 a third stage does not fit (about 232,600 B of shared
# memory, of 232,448); at d64, 128-row tiles spill in the consumers' main loop
# (docs/kernel_compile.md)
TILES = {64: ((64, 2), (64, 3)), 128: ((64, 2),)}
MAX_FLAT_INDEX = 2**31 - 1  # lse and delta are addressed as one flat buffer with int32 coordinates
# The forward's tile: 128 query rows (64 a consumer warpgroup) x 128 keys, and the K / V ring
# depths a config may ask for, by head_dim (at d128 a third slot does not fit beside the two Q
# buffers: 2 x 32 KiB + 3 x 64 KiB > 227 KiB)
FWD_BLOCK_M = 128
FWD_NUM_WARPS = 4  # a consumer warpgroup (the second one and the loader warp come on top)
FWD_STAGES = {64: (2, 3), 128: (2,)}


# ------------------------------------------------------------------ shared
def _gluon_blocker(device: torch.device) -> str | None:
    """Why no Gluon kernel runs on `device` here, or None."""
    if not gluon_api.available():
        return f"triton {triton.__version__} has no Gluon Hopper API"
    if tuning.interpreted():
        return "Gluon kernels do not run on the Triton interpreter"
    capability = tuning.gpu_capability(device)
    if capability != (9, 0):
        return f"it needs a Hopper GPU (sm_90); this is {capability or device.type}"
    return None


def _feature_blocker(dtype, head_dim: int, *, dropout_p: float, softcap: float, alibi_slopes,
                     window_left: int, window_right: int, sparse: bool) -> str | None:  # fmt: skip
    """The first feature of the call neither Gluon kernel covers, as one line, or None."""
    blockers = [
        (dtype not in DTYPES, f"dtype {dtype}; it covers float16 and bfloat16"),
        (head_dim not in HEAD_DIMS, f"head_dim {head_dim}; it covers {HEAD_DIMS}"),
        (dropout_p > 0.0, "dropout"),
        (softcap > 0.0, "soft-capping"),
        (alibi_slopes is not None, "ALiBi"),
        (window_left < UNBOUNDED or window_right not in (0, UNBOUNDED), "a sliding window"),
        (sparse, "a block mask"),
    ]
    for blocked, why in blockers:
        if blocked:
            return f"{why} is not covered"
    return None


def _call_blocker(cfg: TileConfig, not_asked: str, q4, **features) -> str | None:
    """What both Gluon kernels ask of a call before its tensors: the config asks for the kernel
    ("the <not_asked>" otherwise), descriptor loads allowed, a GPU and Triton that run Gluon,
    and features they cover; None where all hold."""
    if not cfg.gluon:
        return f"the {not_asked}"
    if not cfg.tma:
        return f"descriptor loads are off ({tuning.TMA_ENV}=0 or the config): it has no other"
    return _gluon_blocker(q4.device) or _feature_blocker(q4.dtype, q4.shape[-1], **features)


def _heads_adjacent(t: torch.Tensor) -> bool:
    """A (B, S, H, D) view whose heads sit side by side in a row (stride D): one descriptor over
    a sequence's (S, H * D) rows reaches every head."""
    return t.shape[2] == 1 or t.stride(2) == t.shape[3]


# ------------------------------------------------------------------ forward
def ws_forward_config(stages: int = 2) -> TileConfig:
    """The fwd config that names the Gluon forward: a tuning table's entry, a sweep's override
    (block_d follows head_dim at launch)."""
    return TileConfig(FWD_BLOCK_M, BLOCK_N, 0, FWD_NUM_WARPS, stages, tma=True, gluon=True)


def forward_config_blocker(cfg: TileConfig, head_dim: int) -> str | None:
    """Why the Gluon forward cannot run with `cfg` at `head_dim`, or None."""
    tile = (cfg.block_m, cfg.block_n, cfg.num_warps)
    if tile != (FWD_BLOCK_M, BLOCK_N, FWD_NUM_WARPS):
        return (f"its tile is block_m={FWD_BLOCK_M} x block_n={BLOCK_N} over num_warps="
                f"{FWD_NUM_WARPS} a warpgroup; the config has {tile}")  # fmt: skip
    if cfg.num_stages not in FWD_STAGES.get(head_dim, ()):
        return (f"num_stages={cfg.num_stages} at head_dim {head_dim}; allowed "
                f"{FWD_STAGES.get(head_dim)}")  # fmt: skip
    return None


def _rows_matrix(t: torch.Tensor) -> bool:
    """A (B, S, H, D) view one descriptor reads as a (B * S, H * D) matrix: heads adjacent and,
    with more than one sequence, each sequence's rows right after the previous one's."""
    batch, seqlen = t.shape[:2]
    return _heads_adjacent(t) and (batch == 1 or t.stride(0) == seqlen * t.stride(1))


def ws_forward_blocker(cfg: TileConfig, *, q4, k4, v4, o4, dropout_p: float, softcap: float,
                       alibi_slopes, window_left: int, window_right: int,
                       sparse: bool) -> str | None:  # fmt: skip
    """None where the Gluon forward computes this call, else one line saying why not. Tensors
    are the (B, S, H, D) views the launcher passes (a packed call: batch 1)."""
    why = _call_blocker(cfg, "fwd config does not ask for the Gluon forward", q4,
                        dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes,
                        window_left=window_left, window_right=window_right, sparse=sparse)  # fmt: skip
    if why:
        return why
    tiles = (q4, k4, v4, o4)
    if not tma.aligned(*tiles) or not all(_rows_matrix(t) for t in tiles):
        return ("a tensor its descriptors cannot address (16-byte alignment, heads adjacent, "
                "a batch's sequences adjacent)")  # fmt: skip
    if max(t.shape[0] * t.shape[1] for t in tiles) > MAX_FLAT_INDEX:
        return "more than 2^31 rows (a descriptor's coordinates are int32)"
    return forward_config_blocker(cfg, q4.shape[-1])


# ------------------------------------------------------------------ backward
def ws_backward_config(block_m: int = 64, stages: int = 2) -> TileConfig:
    """The dK/dV config that names the warp-specialized backward: a tuning table's entry, a
    sweep's override (block_d follows head_dim at launch)."""
    return TileConfig(block_m, BLOCK_N, 0, NUM_WARPS, stages, tma=True, gluon=True)


def config_blocker(cfg: TileConfig, head_dim: int) -> str | None:
    """Why the backward cannot run with `cfg` at `head_dim`, or None."""
    if cfg.block_n != BLOCK_N or cfg.num_warps != NUM_WARPS:
        return (f"its tile holds block_n={BLOCK_N} keys over num_warps={NUM_WARPS}; the config "
                f"has {cfg.block_n} and {cfg.num_warps}")  # fmt: skip
    if (cfg.block_m, cfg.num_stages) not in TILES.get(head_dim, ()):
        return (f"(block_m, num_stages) = {(cfg.block_m, cfg.num_stages)} at head_dim "
                f"{head_dim}; allowed {TILES.get(head_dim)}")  # fmt: skip
    return None


def ws_backward_blocker(cfg: TileConfig, *, q4, k4, v4, do4, dk4, dv4, lse, dropout_p: float,
                        softcap: float, alibi_slopes, window_left: int, window_right: int,
                        sparse: bool, deterministic: bool) -> str | None:  # fmt: skip
    """None where the warp-specialized backward computes this call, else one line saying why
    not. Tensors are the (B, S, H, D) views the launcher passes (a packed call: batch 1)."""
    why = _call_blocker(cfg, "dK/dV config does not ask for the warp-specialized backward", q4,
                        dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes,
                        window_left=window_left, window_right=window_right, sparse=sparse)  # fmt: skip
    if why:
        return why
    if deterministic:
        return "deterministic=True (its dQ adds are atomic) is not covered"
    tiles = (q4, k4, v4, do4, dk4, dv4)
    if not tma.aligned(*tiles) or not all(_heads_adjacent(t) for t in tiles):
        return "a tensor its descriptors cannot address (16-byte alignment, heads adjacent)"
    if not lse.is_contiguous() or lse.numel() > MAX_FLAT_INDEX:
        return "lse must be contiguous with under 2^31 entries"
    return config_blocker(cfg, q4.shape[-1])
