"""Tile sizes, warps, stages and load path per kernel, head_dim and GPU.

A table rather than autotuning: launches are deterministic (the backward's bitwise repeatability
must not depend on which config a benchmark run happened to pick) and there is no warm-up cost.
Three attention kinds, each with its own config (and, at the end, the LM-head cross-entropy
kernels' tiles, `xent_tiles`):
    fwd   the forward:         block_m query rows held, block_n key rows streamed
    dkdv  the dK/dV backward:  block_n key rows held, block_m query rows streamed (also the
                               atomic-dQ pass of deterministic=False)
    dq    the dQ backward:     block_m query rows held, block_n key rows streamed
                               (deterministic=True only)
A config comes from, in order: a sweep's override (`overridden`), the GPU's measured table
(kernels/tuning_tables/<gpu-slug>.json, written by scripts/gpu_suite.py), the built-in rules
below (chosen from what Triton's compiler makes of them for sm_90, docs/kernel_compile.md, until a
GPU's table says otherwise; FLASHTRAIN_TMA=1 or 0 decides the load path for every launch); then it is shrunk until its shared memory fits the GPU
(`fit_shared_memory`), and a launch that still runs out of resources steps down and remembers
the step (`launch_fitted`).
Under TRITON_INTERPRET=1 one small configuration per kind keeps CPU tests fast while still
exercising several tiles, unequal tile sizes and masked tails.
The forward has two Hopper variants a config may ask for (issue 30; docs/kernel_compile.md
"Variants"): `warp_specialize` (one visit-plan loop that Triton splits into a load partition and
consumer warpgroups; dense launches with descriptor loads, else the plain loop runs; V is
cleaned into a copy first, docs/attention_semantics.md) and `persistent` (one
program per SM walking the tile queue heaviest first). `gluon` names the Gluon kernels for
Hopper (kernels/hopper/): on fwd the warp-specialized, persistent forward (issue 46), on dkdv the
backward that computes dK, dV and dQ in one pass (issue 43); kernels/hopper/route.py says which
calls they cover, the others take the built-in config (`builtin_config`). The built-in rules use
none of the variants until a GPU's sweep measures them.
"""

import contextlib
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import torch
import triton
from triton.runtime.errors import OutOfResources

KINDS = ("fwd", "dkdv", "dq")


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # query rows per tile (held by fwd and dq programs, streamed by dkdv)
    block_n: int  # key rows per tile (streamed by fwd and dq, held by dkdv)
    block_d: int  # head_dim padded to a power of two
    num_warps: int
    num_stages: int
    tma: bool = False  # tensor-descriptor loads/stores where possible (flashtrain.kernels.tma)
    # Hopper variants of the Triton kernels (docs/kernel_compile.md "Variants"), fwd only: one
    # visit-plan loop that Triton splits into partitions; one program per SM walking a tile
    # queue, heaviest first
    warp_specialize: bool = False
    persistent: bool = False
    # the Gluon kernel for Hopper in FlashAttention-3's structure, where the call is one it
    # covers (kernels/hopper/route.py), else the built-in config: fwd, kernels/hopper/
    # flash_fwd_ws.py (a loader warpgroup, two consumer warpgroups in ping-pong, persistent);
    # dkdv, kernels/hopper/flash_bwd_ws.py (two consumer warpgroups, a loader warp and a dQ
    # writer sharing a third)
    gluon: bool = False


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gpu_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability the kernels compile for on `device`; None under the interpreter or off
    CUDA (the small test tile). The one place the tables ask the hardware, so a compile check
    can stand in a target GPU (flashtrain/lab/kernel_compile.py)."""
    if interpreted() or device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


STAND_IN_SMS = 132  # an H100 SXM's SMs: the compile check's stand-in GPU
INTERPRETER_SMS = 3  # few and odd, so CPU tests give a persistent program several uneven shares


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`: a persistent launch's program count."""
    if gpu_capability(device) is None:
        return INTERPRETER_SMS
    if device.type != "cuda":
        return STAND_IN_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_sms(index)


@cache
def _device_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def block_d_for(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _fit_sparse(cfg: TileConfig, sparse_block: int) -> TileConfig:
    """Block-sparse launches need every tile inside one layout block."""
    if not sparse_block:
        return cfg
    return replace(cfg, block_m=min(cfg.block_m, sparse_block), block_n=min(cfg.block_n, sparse_block))


# ------------------------------------------------------------------ shared memory
# Opt-in shared memory per block by compute capability, for a compile check's stand-in GPU
# (a real GPU is asked): A100/H100 class parts and the consumer ones.
_SHARED_BY_CAPABILITY = {(8, 0): 166912, (8, 7): 166912, (9, 0): 232448, (10, 0): 232448}
_SHARED_DEFAULT = 101376  # sm_86 / sm_89 / sm_120


def max_shared_memory(device: torch.device) -> int | None:
    """Bytes of shared memory a block may use on `device`; None where nothing compiles for a
    GPU (interpreter, CPU)."""
    capability = gpu_capability(device)
    if capability is None:
        return None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _device_shared_memory(index)
    return _SHARED_BY_CAPABILITY.get(tuple(capability), _SHARED_DEFAULT)


@cache
def _device_shared_memory(index: int) -> int:
    """Asked once per GPU: config() runs on every launch."""
    from triton.runtime import driver

    return driver.active.utils.get_device_properties(index)["max_shared_mem"]


def shared_bytes(kind: str, cfg: TileConfig, element_size: int) -> int:
    """Shared memory Triton allocates for a config: the held tiles plus num_stages buffers of
    every streamed tile (fwd: Q held, K and V streamed; dkdv: K and V held, Q and dO streamed,
    plus the atomic-dQ pass's float32 (block_m, block_d) staging; dq: Q and dO held, K and V
    streamed). Against Triton 3.9's sm_90 cubins: exact for fwd and dq and for dkdv with 64-row
    query tiles, an upper bound where the pipeliner buffers less (Ampere keeps Q in registers),
    and up to ~20% short for dkdv with 32-row query tiles (layout-conversion scratch); what an
    estimate misses, `launch_fitted` catches."""
    d, e, stages = cfg.block_d, element_size, max(cfg.num_stages, 1)
    if kind == "fwd" and cfg.gluon:
        return ws_forward_shared_bytes(cfg, element_size)
    if kind == "fwd":
        # a persistent program keeps its pipeline buffers across work items, so the output
        # tile's descriptor store stages in a buffer of its own (Triton 3.6 and 3.9 alike)
        staging = cfg.block_m * d * e if cfg.persistent and cfg.tma else 0
        if cfg.warp_specialize:
            # one more (block_m, d) buffer between the partitions and the key-NaN term's
            # buffers, 4 bytes a key (sm_90 cubins of Triton 3.6 and 3.9: docs/kernel_compile.md)
            staging += cfg.block_m * d * e + stages * cfg.block_n * 4
        return (cfg.block_m + 2 * stages * cfg.block_n) * d * e + staging
    if kind == "dkdv" and cfg.gluon:
        return ws_backward_shared_bytes(cfg, element_size)
    if kind == "dkdv":
        return (2 * cfg.block_n + 2 * stages * cfg.block_m) * d * e + cfg.block_m * d * 4 + 512
    if kind == "dq":
        return (2 * cfg.block_m + 2 * stages * cfg.block_n) * d * e
    raise ValueError(f"unknown kernel kind {kind!r}; allowed: {KINDS}")


def ws_forward_shared_bytes(cfg: TileConfig, element_size: int) -> int:
    """Shared memory of the Gluon forward (kernels/hopper/flash_fwd_ws.py): two (block_m, d) Q
    buffers, a (block_m, d) output staging tile (each consumer's half of it its own, so Q is
    released once its last S retired and a store is waited for only before the next), a K ring
    and a V ring of num_stages slots each, two float32 key-term vectors, the barriers, plus ~1 KiB
    of the compiler's own. Within 0.6% above the sm_90 cubins of Triton 3.6 and 3.9
    (tests/attention/test_hopper_fwd_compile.py)."""
    d, m, n, stages = cfg.block_d, cfg.block_m, cfg.block_n, max(cfg.num_stages, 1)
    return (3 * m + 2 * stages * n) * d * element_size + 2 * n * 4 + 1024


def ws_backward_shared_bytes(cfg: TileConfig, element_size: int) -> int:
    """Shared memory of the warp-specialized backward (kernels/hopper/flash_bwd_ws.py): K and V
    held; a ring of num_stages (Q, dO, lse, delta) slots; two pairs of dS^T halves; each
    consumer warpgroup's float32 staging tile of half the dQ tile's columns; per warpgroup the
    offset table and its keys' score terms; the barriers; plus ~1 KiB of the compiler's own
    (reduction scratch, the partitions' captured values). Within 0.5% above the sm_90 cubins of
    Triton 3.6 and 3.9 (tests/attention/test_hopper_bwd_compile.py)."""
    d, m, n, stages = cfg.block_d, cfg.block_m, cfg.block_n, max(cfg.num_stages, 1)
    tiles = (2 * n + 2 * stages * m) * d + 2 * n * m  # K, V, the Q / dO ring, dS^T x 2
    tables = 2 * m * 4 + n * 4  # the offset tables, the score terms (int32, float32)
    return tiles * element_size + m * d * 4 + stages * m * 8 + tables + 1024


def step_down(kind: str, cfg: TileConfig) -> TileConfig | None:
    """The next smaller config: fewer stages first (speed lost least), then the streamed tile,
    then the held one; None at the floor (16 x 16, one stage)."""
    if cfg.num_stages > 1:
        return replace(cfg, num_stages=cfg.num_stages - 1)
    streamed, held = ("block_m", "block_n") if kind == "dkdv" else ("block_n", "block_m")
    for field in (streamed, held):
        if getattr(cfg, field) > 16:
            return replace(cfg, **{field: getattr(cfg, field) // 2})
    return None


def fit_shared_memory(kind: str, cfg: TileConfig, element_size: int, limit: int | None) -> TileConfig:
    """cfg, stepped down until shared_bytes fits `limit` (None: no limit)."""
    while limit is not None and shared_bytes(kind, cfg, element_size) > limit:
        smaller = step_down(kind, cfg)
        if smaller is None:
            break  # the floor: let the launch report what does not fit
        cfg = smaller
    return cfg


_STEPPED: dict[tuple[str, TileConfig], TileConfig] = {}  # (kind, config) -> one that launched


def launch_fitted(kind: str, cfg: TileConfig, launch):
    """launch(cfg); where Triton finds at the first launch that the compiled kernel needs more
    shared memory or registers than the GPU has (OutOfResources, raised before anything runs),
    step down and launch again, remembering the step for later launches of this config."""
    wanted = cfg
    cfg = _STEPPED.get((kind, wanted), wanted)
    while True:
        try:
            return launch(cfg)
        except OutOfResources as err:
            smaller = step_down(kind, cfg)
            if smaller is None:
                raise
            warnings.warn(f"{kind} config {cfg} does not fit this GPU ({err}); using {smaller}",
                          stacklevel=2)  # fmt: skip
            _STEPPED[(kind, wanted)] = cfg = smaller


# ------------------------------------------------------------------ per-GPU tables
TABLES = Path(__file__).resolve().parent / "tuning_tables"
_OVERRIDES: dict[str, TileConfig] = {}  # kind -> config, set by a tile sweep (`overridden`)
_FORCED_TMA: list[bool] = []  # innermost `forced_tma` value last
TMA_ENV = "FLASHTRAIN_TMA"  # 1: descriptors wherever possible, 0: never; unset: the config's choice


def gpu_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3": the per-GPU table's file name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def table_key(kind: str, head_dim: int, dtype: torch.dtype) -> str:
    """kind: fwd | dkdv | dq; head_dim padded to its block_d; dtype without the torch. prefix."""
    return f"{kind}/{block_d_for(head_dim)}/{str(dtype).removeprefix('torch.')}"


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
    """Launches of `kind` (fwd | dkdv | dq) use cfg (block_d still follows head_dim) inside the
    block; an enclosing override of the kind is back in force after it."""
    if kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; allowed: {KINDS}")
    enclosing = _OVERRIDES.get(kind)
    _OVERRIDES[kind] = cfg
    try:
        yield
    finally:
        if enclosing is None:
            del _OVERRIDES[kind]
        else:
            _OVERRIDES[kind] = enclosing


@contextlib.contextmanager
def forced_tma(enabled: bool):
    """Every launch inside the block asks for descriptor loads (True) or pointer loads (False),
    whatever its config says; the GPU suite checks both paths this way."""
    _FORCED_TMA.append(bool(enabled))
    try:
        yield
    finally:
        _FORCED_TMA.pop()


def _tma_choice(cfg: TileConfig) -> bool:
    if _FORCED_TMA:
        return _FORCED_TMA[-1]
    env = os.environ.get(TMA_ENV, "").strip()
    if env in ("0", "1"):
        return env == "1"
    if env:
        raise ValueError(f"{TMA_ENV}={env!r} is not understood; allowed: 1, 0 or unset")
    return cfg.tma


def config(kind: str, head_dim: int, dtype: torch.dtype, device: torch.device,
           sparse_block: int = 0) -> TileConfig:  # fmt: skip
    """The config a launch of `kind` uses (see the module docstring for the order)."""
    block_d = block_d_for(head_dim)
    chosen = _OVERRIDES.get(kind) or table_entry(kind, head_dim, dtype, device)
    if not chosen:
        return builtin_config(kind, head_dim, dtype, device, sparse_block)
    return _fitted(kind, replace(chosen, block_d=block_d), dtype, device, sparse_block)


def builtin_config(kind: str, head_dim: int, dtype: torch.dtype, device: torch.device,
                   sparse_block: int = 0) -> TileConfig:  # fmt: skip
    """The built-in rule's config, whatever a table or an override says: what a launch falls
    back to where the chosen config names a kernel the call cannot take (the warp-specialized
    backward, kernels/hopper/route.py)."""
    cfg = _BUILTIN[kind](block_d_for(head_dim), dtype, device)
    return _fitted(kind, cfg, dtype, device, sparse_block)


def _fitted(kind, cfg: TileConfig, dtype, device, sparse_block: int) -> TileConfig:
    cfg = replace(_fit_sparse(cfg, sparse_block), tma=_tma_choice(cfg))
    return fit_shared_memory(kind, cfg, dtype.itemsize, max_shared_memory(device))


def forward_config(head_dim: int, dtype: torch.dtype, device: torch.device, sparse_block: int = 0):
    return config("fwd", head_dim, dtype, device, sparse_block)


ATOMIC_DQ_MAX_BLOCK_D = 128


def atomic_dq_exact(block_d: int) -> bool:
    """Whether the default backward may add dQ with atomics inside the dK/dV pass. Not at
    block_d 256 (head_dim 129-256): measured on an H200 under Triton 3.6 (benchmarks/results/
    gpu-suite-2026-11-27-nvidia-h200/call-3), that pass's dS K product (BLOCK_D x BLOCK_M) came
    out wrong there, NaN through the bulk reduce and off by ~4 through per-element atomics, while
    the separate dQ kernel was exact; the interpreter computes both right, so only a GPU shows it.
    Those head dims take the dQ kernel (what deterministic=True runs) until a fix is measured."""
    return block_d <= ATOMIC_DQ_MAX_BLOCK_D


_FORCED_SPLIT: list[bool] = []  # innermost `forced_group_split` value last


def split_group(block_d: int, device: torch.device) -> bool:
    """Whether grouped-query dK/dV runs one program per query head into float32 partials summed
    per group (extra memory: 2 x 4 x B x Sk x Hq x D bytes) rather than one program per kv head
    looping over its group, whose dK and dV stay live across the loop and spill on sm_90 at
    d128 (docs/kernel_compile.md): on a GPU at block_d > 64."""
    if _FORCED_SPLIT:
        return _FORCED_SPLIT[-1]
    return gpu_capability(device) is not None and block_d > 64


@contextlib.contextmanager
def forced_group_split(enabled: bool):
    """Grouped-query backward launches inside the block split the group (True) or loop over it
    (False), whatever split_group says; tests run both on CPU this way."""
    _FORCED_SPLIT.append(bool(enabled))
    try:
        yield
    finally:
        _FORCED_SPLIT.pop()


# ------------------------------------------------------------------ built-in rules
# Chosen from what compiles well for sm_90 / sm_80 (Triton 3.9's cubins: shared memory, registers,
# spills; flashtrain/lab/kernel_compile.py), not yet from GPU timings: the GPU suite's sweep
# measures the alternatives (and TMA) and writes the per-GPU table that replaces these.
def _forward_rule(block_d: int, dtype: torch.dtype, device: torch.device) -> TileConfig:
    """Hopper, fp16/bf16: 128 x 128 tiles, descriptor loads, 3 stages (at d128 230,400 bytes of
    shared memory, no spill: docs/kernel_compile.md)."""
    capability = gpu_capability(device)
    if capability is None:
        return TileConfig(32, 16, block_d, 4, 1)
    wide = dtype == torch.float32  # fp32 tiles take twice the registers and shared memory
    if capability[0] >= 9:  # Hopper: 227 KiB of shared memory, 128 x 128 tiles
        if block_d <= 64:
            return TileConfig(128, 64 if wide else 128, block_d, 8, 3, tma=not wide)
        if block_d <= 128:
            return TileConfig(128, 32 if wide else 128, block_d, 8, 2 if wide else 3, tma=not wide)
        return TileConfig(64, 32 if wide else 64, block_d, 8, 2)
    # Ampere / Ada: 2 stages (fit_shared_memory trims the consumer parts' 99 KiB further)
    if block_d <= 64:
        return TileConfig(128, 32 if wide else 64, block_d, 4, 2)
    if block_d <= 128:
        return TileConfig(128, 32 if wide else 64, block_d, 8, 2)
    return TileConfig(64, 32, block_d, 8, 2)


def _dkdv_rule(block_d: int, dtype: torch.dtype, device: torch.device) -> TileConfig:
    """128 held key rows, 32 streamed query rows: every product has 128 rows (the atomic-dQ one
    transposed), so all run on wgmma, without spills at d <= 128 on sm_90 in both backward
    modes; 64-row query tiles spill. Descriptor loads at d64; pointer loads at d128, where
    Triton 3.6 spills with descriptors in the atomic-dQ pass. The atomic dQ is a bulk
    reduce-add wherever descriptors exist, whatever the load path (flashtrain.kernels.tma;
    docs/kernel_compile.md)."""
    capability = gpu_capability(device)
    if capability is None:
        return TileConfig(16, 32, block_d, 4, 1)
    wide = dtype == torch.float32
    hopper = capability[0] >= 9
    if block_d <= 128:
        return TileConfig(32, 64 if wide else 128, block_d, 8, 2,
                          tma=hopper and not wide and block_d <= 64)  # fmt: skip
    return TileConfig(32, 32 if wide else 64, block_d, 8, 1)


def _dq_rule(block_d: int, dtype: torch.dtype, device: torch.device) -> TileConfig:
    capability = gpu_capability(device)
    if capability is None:
        return TileConfig(32, 16, block_d, 4, 1)
    wide = dtype == torch.float32
    hopper = capability[0] >= 9
    if block_d <= 128:
        return TileConfig(64 if wide else 128, 32 if wide else 64, block_d, 8, 2,
                          tma=hopper and not wide)  # fmt: skip
    return TileConfig(64, 32, block_d, 8, 1)


_BUILTIN = {"fwd": _forward_rule, "dkdv": _dkdv_rule, "dq": _dq_rule}


# ------------------------------------------------------------------ LM-head cross-entropy tiles
@dataclass(frozen=True)
class XentTiles:
    """Tiles of one kernel of flashtrain.kernels.linear_cross_entropy."""

    block_m: int  # token rows per tile
    block_v: int  # vocabulary rows per tile
    block_k: int  # hidden-dim chunk of the logits product
    block_c: int  # hidden-dim chunk of the gradient products (backward)
    num_warps: int
    num_stages: int


# Tiles per kernel and GPU family, chosen by reasoning and checked offline, not yet timed
# (scripts/bench_loss.py on an H100 is the check). Each configuration below compiles for its
# target without register spills (triton 3.9, sm_90a / sm_80, cuobjdump resource usage) and, on
# Hopper, with both products as wgmma. The forward is a tiled GEMM with a cheap epilogue. The
# backward kernels hold a z tile and its gradient plus a BLOCK x BLOCK_C fp32 product chunk in
# registers; their fp32 read-modify-write of the owned rows costs 8 * BLOCK_C bytes per
# 4 * BLOCK_streamed * BLOCK_C flops, hence a wide streamed tile (256 vocabulary rows per dH
# step, 128 tokens per dW step) and a narrow owned one.
_X = XentTiles
XENT_TILES = {
    "hopper": {  # 16-bit inputs, sm_90
        "forward": _X(block_m=128, block_v=128, block_k=64, block_c=64, num_warps=8, num_stages=3),
        "grad_hidden": _X(block_m=64, block_v=256, block_k=64, block_c=32, num_warps=8, num_stages=3),
        "grad_weight": _X(block_m=128, block_v=64, block_k=64, block_c=64, num_warps=8, num_stages=3),
    },
    "ampere": {  # 16-bit inputs before Hopper: no wgmma, mma.sync needs more registers
        "forward": _X(block_m=64, block_v=128, block_k=64, block_c=64, num_warps=8, num_stages=2),
        "grad_hidden": _X(block_m=64, block_v=128, block_k=64, block_c=32, num_warps=8, num_stages=2),
        "grad_weight": _X(block_m=64, block_v=64, block_k=64, block_c=64, num_warps=8, num_stages=2),
    },
    "fp32": {  # exact fp32 products (no tensor cores), any GPU
        "forward": _X(block_m=64, block_v=128, block_k=32, block_c=32, num_warps=8, num_stages=2),
        "grad_hidden": _X(block_m=64, block_v=128, block_k=32, block_c=32, num_warps=8, num_stages=2),
        "grad_weight": _X(block_m=64, block_v=64, block_k=32, block_c=32, num_warps=8, num_stages=2),
    },
}
# Small tiles under TRITON_INTERPRET=1 (and off CUDA): tests cover several tiles per split,
# several splits and masked tails at shapes the interpreter runs in seconds.
XENT_INTERPRETER_TILES = _X(block_m=16, block_v=32, block_k=16, block_c=16, num_warps=4,
                            num_stages=1)  # fmt: skip


def xent_tiles(kernel: str, dtype: torch.dtype, device: torch.device) -> XentTiles:
    """kernel: forward | grad_hidden | grad_weight; dtype: the products' input dtype."""
    capability = gpu_capability(device)
    if capability is None:
        return XENT_INTERPRETER_TILES
    if dtype == torch.float32:
        return XENT_TILES["fp32"][kernel]
    return XENT_TILES["hopper" if capability[0] >= 9 else "ampere"][kernel]
