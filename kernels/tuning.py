"""Tile sizes, warps and stages per head_dim and GPU.

A table rather than autotuning: launches are deterministic (the backward's bitwise repeatability
must not depend on which config a benchmark run happened to pick) and there is no warm-up cost.
Under TRITON_INTERPRET=1 one small configuration keeps CPU tests fast while still exercising
several tiles, unequal tile sizes and masked tails.
"""

import os
from dataclasses import dataclass, replace

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


def forward_config(head_dim: int, dtype: torch.dtype, device: torch.device, sparse_block: int = 0):
    return _fit_sparse(_forward_config(head_dim, dtype, device), sparse_block)


def backward_config(head_dim: int, dtype: torch.dtype, device: torch.device, sparse_block: int = 0):
    """block_n: the key tile held by a dK/dV program; block_m: the query tile it streams.
    The dQ kernel uses the transpose (block_n queries held, block_m keys streamed)."""
    return _fit_sparse(_backward_config(head_dim, dtype, device), sparse_block)


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
