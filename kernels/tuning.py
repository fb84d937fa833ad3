"""Tile sizes, warps and stages per head_dim and GPU.

A table rather than autotuning: launches are deterministic (the backward's bitwise repeatability
must not depend on which config a benchmark run happened to pick) and there is no warm-up cost.
Under TRITON_INTERPRET=1 one small configuration keeps CPU tests fast while still exercising
several tiles, unequal tile sizes and masked tails.
"""

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import torch
import triton


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    block_d: int  # head_dim padded to a power of two
    num_warps: int
    num_stages: int


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gpu_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability the kernels compile for on `device`; None under the interpreter or off
    CUDA (the small test tile). The one place the tables ask the hardware, so a compile check
    can stand in a target GPU (tests/attention/kernel_compile.py)."""
    if interpreted() or device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def _small_smem(capability: tuple[int, int]) -> bool:
    """Pre-Hopper parts (and consumer cards) have too little shared memory for 3+ stages at d=128."""
    return capability[0] < 9


def _fit_sparse(cfg: TileConfig, sparse_block: int) -> TileConfig:
    """Block-sparse launches need every tile inside one layout block."""
    if not sparse_block:
        return cfg
    return replace(cfg, block_m=min(cfg.block_m, sparse_block), block_n=min(cfg.block_n, sparse_block))


TABLES = Path(__file__).resolve().parent / "tuning_tables"
_OVERRIDES: dict[str, TileConfig] = {}  # kind -> config, set by a tile sweep (`overridden`)


def gpu_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3": the per-GPU table's file name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def table_key(kind: str, head_dim: int, dtype: torch.dtype) -> str:
    """kind: fwd | bwd; head_dim padded to its block_d; dtype without the torch. prefix."""
    return f"{kind}/{max(16, triton.next_power_of_2(head_dim))}/{str(dtype).removeprefix('torch.')}"


@cache
def _table(slug: str) -> dict[str, dict]:
    """kernels/tuning_tables/<gpu-slug>.json (written by scripts/gpu_suite.py's sweep), or {}."""
    path = TABLES / f"{slug}.json"
    return json.loads(path.read_text())["configs"] if path.is_file() else {}


def table_entry(kind: str, head_dim: int, dtype: torch.dtype, device: torch.device):
    """The measured config for this GPU, or None (the built-in rules apply; also under the
    compile check's stand-in GPU, whose tensors live on the CPU)."""
    if device.type != "cuda" or gpu_capability(device) is None:
        return None
    entry = _table(gpu_slug(torch.cuda.get_device_name(device))).get(table_key(kind, head_dim, dtype))
    return TileConfig(**entry) if entry else None


def table_payload(device_name: str, configs: dict[str, TileConfig]) -> dict:
    return {"device": device_name, "configs": {k: asdict(c) for k, c in sorted(configs.items())}}


@contextlib.contextmanager
def overridden(kind: str, cfg: TileConfig):
    """Launches of `kind` (fwd | bwd) use cfg (block_d still follows head_dim) inside the block."""
    _OVERRIDES[kind] = cfg
    try:
        yield
    finally:
        del _OVERRIDES[kind]


def _chosen(kind: str, head_dim: int, dtype, device, builtin) -> TileConfig:
    block_d = max(16, triton.next_power_of_2(head_dim))
    cfg = _OVERRIDES.get(kind) or table_entry(kind, head_dim, dtype, device)
    return replace(cfg, block_d=block_d) if cfg else builtin(head_dim, dtype, device)


def forward_config(head_dim: int, dtype: torch.dtype, device: torch.device, sparse_block: int = 0):
    return _fit_sparse(_chosen("fwd", head_dim, dtype, device, _forward_config), sparse_block)


def backward_config(head_dim: int, dtype: torch.dtype, device: torch.device, sparse_block: int = 0):
    """block_n: the key tile held by a dK/dV program; block_m: the query tile it streams.
    The dQ kernel uses the transpose (block_n queries held, block_m keys streamed)."""
    return _fit_sparse(_chosen("bwd", head_dim, dtype, device, _backward_config), sparse_block)


def _forward_config(head_dim: int, dtype: torch.dtype, device: torch.device) -> TileConfig:
    block_d = max(16, triton.next_power_of_2(head_dim))
    capability = gpu_capability(device)
    if capability is None:
        return TileConfig(32, 16, block_d, 4, 1)
    wide = dtype == torch.float32  # fp32 tiles take twice the registers and shared memory
    stages = 2 if _small_smem(capability) else 3
    if block_d <= 64:
        return TileConfig(128, 64 if not wide else 32, block_d, 4, stages)
    if block_d <= 128:
        return TileConfig(128, 64 if not wide else 32, block_d, 8, stages)
    return TileConfig(64, 32, block_d, 4, 2)


def _backward_config(head_dim: int, dtype: torch.dtype, device: torch.device) -> TileConfig:
    block_d = max(16, triton.next_power_of_2(head_dim))
    if gpu_capability(device) is None:
        return TileConfig(16, 32, block_d, 4, 1)
    wide = dtype == torch.float32
    if block_d <= 64:
        return TileConfig(64 if not wide else 32, 128 if not wide else 64, block_d, 8, 2)
    if block_d <= 128:
        return TileConfig(32, 128 if not wide else 64, block_d, 8, 2)
    return TileConfig(32, 64 if not wide else 32, block_d, 8, 1)
