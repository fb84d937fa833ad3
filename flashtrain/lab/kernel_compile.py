"""Compile the kernels for a CUDA GPU on a machine that has none, with Triton's own compiler, and
report what the compiler made of each one.

TRITON_INTERPRET runs the kernels' Python, not their compilation: rules only the compiler
enforces (module globals must be tl.constexpr, loop-carried types, constexpr-only arguments) pass
the interpreter and fail on the first GPU, and nothing there says whether a product runs on the
tensor cores the way the target wants. This tool launches the real launchers through a stand-in
driver that names the target GPU, so each launch compiles (nothing runs), and prints one JSON
line per kernel compiled:

    python scripts/kernel_compile.py [--arch 90] [--launches SET] [--only TEXT]
                                     [--front-end-only] [--markdown FILE]
    python scripts/kernel_compile.py --contract all   (the launch contract: launch_contract.py)

SET is defaults (the default): the production launches, bf16 and fp16 x head_dim 64 and 128
x causal or not x dense or block-sparse x both backward modes (deterministic two-kernel dQ and
atomic dQ), with the built-in tiles of kernels/tuning.py, then 4 grouped-query ones; features: every feature flag at least
once (varlen, softcap, ALiBi, dropout, fp32, descriptors forced); decode: the split-KV decode
kernels of flash_attn_with_kvcache (split and combine; GQA, MQA, windows, ALiBi, left padding,
cache_batch_idx, softcap, fp32, a one-split chunked prefill, a paged cache), a set of their own
(their products compile to mma.sync: the tiles hold few query rows); variants: the forward's
Hopper variants (warp-specialized, persistent, both) and dK/dV with 64-row query tiles; hopper:
the warp-specialized Gluon backward (kernels/hopper); hopper-fwd: the Gluon forward (kernels/
hopper/flash_fwd_ws.py). --only keeps the launches whose
tag contains TEXT. --front-end-only stops after Triton's first IR (~0.5 s a kernel: the checks
above); otherwise the whole pipeline runs to a cubin (LLVM and ptxas, seconds a kernel) and each
line carries the launch's block_m / block_n and the compile facts:
    registers, spill (stack bytes), shared (bytes per block), warps (all of them: a
    warp-specialized kernel's partitions included), warp_specialized (the PTX hands registers
    between partitions with setmaxnreg), partitions (a Gluon kernel's warps by partition,
    "8+1+1"), setmaxnreg (the counts they move to), stages,
    loads ("tma": the PTX holds tensor-descriptor bulk copies, else "pointer"),
    wgmma / mma_sync (SASS HGMMA / HMMA instructions: Hopper's warpgroup products vs the older
    per-warp ones), main_loop (SASS instructions of the steady-state loop: the shortest
    innermost loop that holds tensor-core instructions, i.e. the unmasked visit-plan segment),
    loop_spills (local-memory loads and stores, SASS LDL / STL, inside that loop),
    loop_waits / loop_drains (the PTX's wgmma.wait_group on an iteration of the innermost loop
    that issues wgmma, and those with a count of 0: each drains the warpgroup's tensor-core
    work; flashtrain/lab/ptx_waits.py),
    adds ("bulk": float32 adds by TMA bulk reduce-add, "atomic": per-element, "": none).
A kernel compiled before in the same run (same binary) is reported once. --markdown writes the
facts as a table. Compile-time facts, not a measurement: nothing here ran on a GPU. Run it
without TRITON_INTERPRET set.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from flashtrain.attention.sparsity.layout import BlockSparseLayout
from flashtrain.kernels import tuning
from flashtrain.kernels.common import UNBOUNDED
from flashtrain.kernels.dropout_mask import dropout_keep_mask
from flashtrain.kernels.flash_bwd import flash_backward
from flashtrain.kernels.flash_decode import flash_decode
from flashtrain.kernels.flash_fwd import flash_forward
from flashtrain.kernels.hopper.route import FWD_STAGES, ws_backward_config, ws_forward_config
from flashtrain.kernels.tuning import TileConfig
from flashtrain.lab import ptx_waits

FACT_COLUMNS = ("block_m", "block_n", "registers", "spill", "shared", "warps", "warp_specialized",
                "partitions", "setmaxnreg", "stages", "loads", "adds", "wgmma", "mma_sync",
                "main_loop", "loop_spills", "loop_waits", "loop_drains")  # fmt: skip


class _FrontEndDone(Exception):
    """Raised by the stage after the first IR when only the front end is wanted."""


class _TargetDriver:
    """Answers Triton's runtime questions as a CUDA device of the chosen arch would."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


def install(arch: int, front_end_only: bool, compiled: list, on_launch=None) -> None:
    """From here on, every kernel launch compiles for `arch` and appends (name, kernel) to
    `compiled` instead of running (kernel None with front_end_only; tiles: launch_tiles). on_launch(fn, grid, args,
    kwargs, compile) -> kernel, if given, is called in the launching thread instead and decides
    whether to compile (compile() returns the kernel): flashtrain/lab/launch_contract.py."""
    driver.set_active(_TargetDriver(arch))
    tuning.gpu_capability = lambda device: (arch // 10, arch % 10)

    def compile_only(self, grid):
        def launch(*args, **kwargs):
            def compile_kernel():
                try:
                    return self.run(*args, grid=grid, warmup=True, **kwargs)
                except _FrontEndDone:
                    return None

            if on_launch is None:
                kernel = compile_kernel()
            else:
                kernel = on_launch(self, grid, args, kwargs, compile_kernel)
            compiled.append((self.__name__, kernel, launch_tiles(kwargs)))

        return launch

    JITFunction.__getitem__ = compile_only
    if front_end_only:
        from triton.backends.nvidia.compiler import CUDABackend

        add_stages = CUDABackend.add_stages

        def first_ir_only(self, stages, options, language):
            add_stages(self, stages, options, language)
            first = next(iter(stages))
            for name in list(stages)[1:]:
                del stages[name]

            def stop(module, metadata):
                raise _FrontEndDone

            stages[first + "_done"] = stop

        CUDABackend.add_stages = first_ir_only


def launch_tiles(kwargs: dict) -> dict:
    """{block_m, block_n} of a launch's constexpr tile arguments (None where it has none), and
    the ring depth of a Gluon kernel that takes its own (STAGES): its `stages`."""
    tiles = {name.lower(): kwargs.get(name) for name in ("BLOCK_M", "BLOCK_N")}
    if "STAGES" in kwargs:
        tiles["stages"] = kwargs["STAGES"]
    return tiles


# ------------------------------------------------------------------ facts of a cubin
_TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# "/*0a70*/  @!P0 HGMMA.64x128x16.F32.BF16 ..." -> (address, opcode); "BRA 0x3c0" / "BRA `(.L_x_7)"
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")


def _cuobjdump(kernel, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([str(_TOOLS / "cuobjdump"), *flags, f.name], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip


def sass_instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every SASS instruction, in address order."""
    return [(int(a, 16), op, rest) for a, op, rest in _SASS_LINE.findall(sass)]


def sass_facts(sass: str) -> dict:
    """Tensor-core instruction counts and the main loop's length from cuobjdump -sass text."""
    insts = sass_instructions(sass)
    wgmma = sum(op.startswith("HGMMA") for _, op, _ in insts)
    mma_sync = sum(op.startswith("HMMA") for _, op, _ in insts)
    index = {addr: i for i, (addr, _, _) in enumerate(insts)}
    loops = []  # (first, last) instruction index of each backward branch's body
    for i, (addr, op, rest) in enumerate(insts):
        target = _BRANCH_TARGET.search(rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) <= addr and int(target.group(1), 16) in index:
            loops.append((index[int(target.group(1), 16)], i))
    innermost = [
        (lo, hi) for lo, hi in loops
        if not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in loops)
    ]  # fmt: skip
    tensor_core = [
        (hi - lo + 1, sum(op.startswith(("LDL", "STL")) for _, op, _ in insts[lo : hi + 1]))
        for lo, hi in innermost
        if any(op.startswith(("HGMMA", "HMMA")) for _, op, _ in insts[lo : hi + 1])
    ]  # fmt: skip
    # the steady state's length: the shortest such loop; its spills: the most of any (each
    # partition has its own loop, and one at fewer registers may spill where another does not)
    main_loop = min((n for n, _ in tensor_core), default=0)
    loop_spills = max((spills for _, spills in tensor_core), default=0)
    return dict(wgmma=wgmma, mma_sync=mma_sync, main_loop=main_loop, loop_spills=loop_spills)


def partition_warps(ttgir: str) -> str:
    """ "8+1+1": the warps of a warp-specialized kernel's default partition and each worker
    partition, from its TTGIR ("" for a kernel without partitions)."""
    workers = re.findall(r"partition\d+\(.*num_warps\((\d+)\)", ttgir)
    if not workers:
        return ""
    default = re.search(r'"ttg.num-warps" = (\d+)', ttgir)
    return "+".join([default.group(1) if default else "?", *workers])


def ptx_facts(ptx: str) -> dict:
    """What the PTX says of a kernel's partitions and its float32 adds to global memory:
    setmaxnreg, the register counts its warps move to ("240/24"; "" for none); adds, "bulk"
    (a TMA bulk reduce-add, cp.reduce.async.bulk), "atomic" (per-element red/atom.global) or
    "" (neither)."""
    counts = sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)},
                    reverse=True)  # fmt: skip
    if "cp.reduce.async.bulk" in ptx:
        adds = "bulk"
    elif re.search(r"\b(red|atom)\.global\.(\w+\.)*(add\.)?f32", ptx):
        adds = "atomic"
    else:
        adds = ""
    return dict(setmaxnreg="/".join(map(str, counts)), adds=adds)


def kernel_facts(kernel) -> dict:
    """Compile facts of a compiled kernel (see the module docstring)."""
    usage = _cuobjdump(kernel, "-res-usage")
    return dict(
        registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        spill=int(re.search(r"STACK:(\d+)", usage).group(1)),
        shared=kernel.metadata.shared,
        warps=kernel.metadata.num_warps,
        # Triton's warp specialization hands registers between its partitions with setmaxnreg
        # (and launches the partitions' warps on top of num_warps: 4 become 12)
        warp_specialized="setmaxnreg" in kernel.asm["ptx"],
        partitions=partition_warps(kernel.asm.get("ttgir", "")),
        stages=kernel.metadata.num_stages,
        loads="tma" if "cp.async.bulk.tensor" in kernel.asm["ptx"] else "pointer",
        **ptx_facts(kernel.asm["ptx"]),
        **ptx_waits.loop_waits(kernel.asm["ptx"]),
        **sass_facts(_cuobjdump(kernel, "-sass")),
    )


# ------------------------------------------------------------------ launches
def attention(*, head_dim, dtype, causal=True, varlen=False, sparse=False, dropout_p=0.0, seed=5,
              softcap=0.0, alibi=False, deterministic=True, tma=None, gqa=False,
              run_backward=lambda backward: backward()):  # fmt: skip
    """One forward and one backward launch (real shapes are irrelevant: nothing runs);
    deterministic=False: the atomic-dQ backward; tma True/False forces descriptor / pointer
    loads, None leaves the choice to the tile config; gqa: two query heads per kv head (the
    dK/dV kernel then loops over the group), else one. run_backward(fn) runs the backward's
    launches (the launch contract runs them in a fresh thread, as autograd does on a GPU)."""
    batch, seqlen, heads_q = 2, 256, 4
    heads_kv = heads_q // 2 if gqa else heads_q
    if varlen:
        q = torch.empty(batch * seqlen, heads_q, head_dim, dtype=dtype)
        k = torch.empty(batch * seqlen, heads_kv, head_dim, dtype=dtype)
        cu = torch.tensor([0, 100, batch * seqlen], dtype=torch.int32)
        lse = torch.empty(heads_q, batch * seqlen)
    else:
        q = torch.empty(batch, seqlen, heads_q, head_dim, dtype=dtype)
        k = torch.empty(batch, seqlen, heads_kv, head_dim, dtype=dtype)
        cu, lse = None, torch.empty(batch, heads_q, seqlen)
    opts = dict(
        cu_seqlens_q=cu,
        cu_seqlens_k=cu,
        max_seqlen_q=seqlen,
        max_seqlen_k=seqlen,
        softmax_scale=head_dim**-0.5,
        window_left=UNBOUNDED,
        window_right=0 if causal else UNBOUNDED,
        dropout_p=dropout_p,
        seed=seed,
        softcap=softcap,
        alibi_slopes=torch.ones(batch, heads_q) if alibi else None,
    )
    if sparse:
        layout = BlockSparseLayout(torch.ones(1, 2, 2, dtype=torch.bool), 128)
        opts.update(tables=layout.tables(seqlen, seqlen, causal, "cpu").as_list(), block_size=128)
    out = torch.empty_like(q)
    grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(k)
    forced = tuning.forced_tma(tma) if tma is not None else _nothing()
    with forced:
        flash_forward(q, k, k, out, lse, **opts)
        run_backward(lambda: flash_backward(out, q, k, k, out, lse, *grads,
                                            deterministic=deterministic, **opts))  # fmt: skip


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _with_backward_runner(run_backward):
    """attention() with its backward run by run_backward (None: in the calling thread)."""
    return (
        attention
        if run_backward is None
        else functools.partial(attention, run_backward=run_backward)
    )


def default_launches(run_backward=None):
    """(tag, launch) of every production launch: dtype x head_dim x causal x dense/sparse x
    backward mode (one query head per kv head), built-in tiles and load path; then grouped-query
    attention (two query heads per kv head) at bf16, causal, dense. run_backward: attention's."""
    attend = _with_backward_runner(run_backward)
    for dtype in (torch.bfloat16, torch.float16):
        for head_dim in (64, 128):
            for causal in (True, False):
                for sparse in (False, True):
                    for deterministic in (True, False):
                        tag = " ".join((
                            str(dtype).removeprefix("torch.").replace("bfloat16", "bf16")
                            .replace("float16", "fp16"),
                            f"d{head_dim}", "causal" if causal else "full",
                            "sparse" if sparse else "dense",
                            "deterministic" if deterministic else "atomic-dQ",
                        ))  # fmt: skip
                        yield tag, (lambda d=dtype, h=head_dim, c=causal, s=sparse, m=deterministic:
                                    attend(head_dim=h, dtype=d, causal=c, sparse=s,
                                           deterministic=m))  # fmt: skip
    for head_dim in (64, 128):  # grouped-query attention: dK/dV loops over the group
        for deterministic in (True, False):
            tag = f"bf16 d{head_dim} causal dense gqa {'deterministic' if deterministic else 'atomic-dQ'}"
            yield tag, (lambda h=head_dim, m=deterministic: attend(
                head_dim=h, dtype=torch.bfloat16, deterministic=m, gqa=True))  # fmt: skip


def feature_launches(run_backward=None):
    """(tag, launch): every feature flag at least once, and descriptors forced on and off; two
    query heads per kv head (at d > 64 the dK/dV kernel splits the group on a GPU)."""
    attend = _with_backward_runner(run_backward)
    yield "dense fp16 d128", lambda: attend(gqa=True, head_dim=128, dtype=torch.float16)
    yield (
        "dense bf16 d64 full",
        lambda: attend(gqa=True, head_dim=64, dtype=torch.bfloat16, causal=False),
    )
    yield "sparse bf16 d64 pointer", lambda: attend(gqa=True,
        head_dim=64, dtype=torch.bfloat16, sparse=True, tma=False)  # fmt: skip
    yield "dense bf16 d128 atomic dQ pointer", lambda: attend(gqa=True,
        head_dim=128, dtype=torch.bfloat16, deterministic=False, tma=False)  # fmt: skip
    yield "sparse bf16 d64 atomic dQ", lambda: attend(gqa=True,
        head_dim=64, dtype=torch.bfloat16, sparse=True, deterministic=False)  # fmt: skip
    yield "varlen fp16 d72 softcap alibi dropout tensor-seed", lambda: attend(gqa=True,
        head_dim=72, dtype=torch.float16, varlen=True, softcap=30.0, alibi=True, dropout_p=0.1,
        seed=torch.tensor([5]), deterministic=False)  # fmt: skip
    yield "sparse fp32 d200 softcap alibi dropout", lambda: attend(gqa=True,
        head_dim=200, dtype=torch.float32, sparse=True, softcap=5.0, alibi=True, dropout_p=0.2)  # fmt: skip
    yield "dense bf16 d128 tma atomic dQ", lambda: attend(gqa=True,
        head_dim=128, dtype=torch.bfloat16, deterministic=False, tma=True)  # fmt: skip
    yield "varlen fp16 d72 tma dropout", lambda: attend(gqa=True,
        head_dim=72, dtype=torch.float16, varlen=True, dropout_p=0.1, tma=True)  # fmt: skip
    yield "sparse bf16 d64 tma", lambda: attend(gqa=True,
        head_dim=64, dtype=torch.bfloat16, sparse=True, tma=True)  # fmt: skip
    yield "dense fp32 d256 full", lambda: attend(gqa=True,
        head_dim=256, dtype=torch.float32, causal=False, deterministic=False)  # fmt: skip
    yield "dropout mask", lambda: dropout_keep_mask(torch.tensor([5]), 2, 4, 100, 70, 0.2, "cpu")
    yield "dropout mask varlen int seed", lambda: dropout_keep_mask(
        7, 2, 4, 100, 70, 0.2, "cpu", torch.tensor([0, 30, 100], dtype=torch.int32),
        torch.tensor([0, 20, 70], dtype=torch.int32))  # fmt: skip


def decode(*, dtype, head_dim, heads_q, heads_kv, seqlen_q=1, num_splits=0, window=None,
           softcap=0.0, alibi=False, extras=False, paged=False):  # fmt: skip
    """One flash_decode launch against a 4096-token cache (split kernel, then the combine
    kernel unless a single split writes the output itself); extras: cache_batch_idx and
    cache_leftpad; paged: a block table of 256-token pages."""
    batch, cache_len = 2, 4096
    q = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=dtype)
    rows = (batch * cache_len // 256, 256) if paged else (batch + 1, cache_len)
    cache = torch.empty(*rows, heads_kv, head_dim, dtype=dtype)
    lens = torch.full((batch,), cache_len, dtype=torch.int32)
    left, right = window or (UNBOUNDED, 0)
    flash_decode(
        q, cache, cache, torch.empty_like(q), torch.empty(batch, heads_q, seqlen_q), lens,
        cache_batch_idx=lens if extras else None, cache_leftpad=lens if extras else None,
        softmax_scale=head_dim**-0.5, window_left=left, window_right=right, softcap=softcap,
        alibi_slopes=torch.ones(batch, heads_q) if alibi else None, num_splits=num_splits,
        block_table=torch.zeros(batch, cache_len // 256, dtype=torch.int32) if paged else None,
    )  # fmt: skip


def decode_launches():
    """(tag, launch) of the split-KV decode kernels (flash_attn_with_kvcache): GQA, MQA with a
    window, ALiBi, left padding and cache_batch_idx, fp32 at d256 with a softcap, a chunked
    prefill with one split (no combine), a paged cache."""
    yield "fp16 d128 gqa causal", lambda: decode(
        dtype=torch.float16, head_dim=128, heads_q=32, heads_kv=8, num_splits=16)  # fmt: skip
    yield "bf16 d64 mqa window alibi leftpad batch-idx", lambda: decode(
        dtype=torch.bfloat16, head_dim=64, heads_q=8, heads_kv=1, window=(256, 0),
        alibi=True, extras=True)  # fmt: skip
    yield "fp32 d256 softcap", lambda: decode(
        dtype=torch.float32, head_dim=256, heads_q=4, heads_kv=4, softcap=30.0,
        num_splits=4)  # fmt: skip
    yield "fp16 d80 prefill chunk one split", lambda: decode(
        dtype=torch.float16, head_dim=80, heads_q=4, heads_kv=2, seqlen_q=64,
        num_splits=1)  # fmt: skip
    yield "bf16 d128 paged", lambda: decode(
        dtype=torch.bfloat16, head_dim=128, heads_q=16, heads_kv=4, num_splits=8,
        paged=True)  # fmt: skip


def _forward_variant(config: TileConfig, **launch):
    """attention(**launch)'s forward (no backward) with the forward's tiles and variant forced
    to `config` (block_d follows head_dim)."""
    with tuning.overridden("fwd", config):
        attention(**launch, run_backward=lambda backward: None)


def _dkdv_tiles(config: TileConfig, **launch):
    with tuning.overridden("dkdv", config):
        attention(**launch)


def variant_launches():
    """(tag, launch) of the Hopper variants of issue 30 beside today's defaults, bf16: the
    warp-specialized forward (one visit-plan loop, 4 warps: Triton 3.6 and 3.9 ignore the flag
    at 8), the persistent forward (one program per SM), both together, at d64 and d128, causal
    and not, dense (and varlen), forward only; and dK/dV with 64-row query tiles, forward and
    backward (the forward and dQ kernels the defaults; a binary met before is not repeated)."""
    ws, persistent = dict(warp_specialize=True, tma=True), dict(persistent=True, tma=True)
    forward = {
        "ws 128x128 w4 s2": TileConfig(128, 128, 0, 4, 2, **ws),
        "ws 128x128 w4 s3": TileConfig(128, 128, 0, 4, 3, **ws),
        "ws 128x64 w4 s3": TileConfig(128, 64, 0, 4, 3, **ws),
        "persistent 128x128 w8 s2": TileConfig(128, 128, 0, 8, 2, **persistent),
        "persistent 128x128 w8 s3": TileConfig(128, 128, 0, 8, 3, **persistent),
        "persistent ws 128x128 w4 s2": TileConfig(128, 128, 0, 4, 2, **ws, persistent=True),
    }
    for head_dim in (64, 128):
        for name, config in forward.items():
            for causal in (True, False):
                tag = f"fwd {name} bf16 d{head_dim} {'causal' if causal else 'full'}"
                yield tag, (lambda c=config, h=head_dim, k=causal: _forward_variant(
                    c, head_dim=h, dtype=torch.bfloat16, causal=k))  # fmt: skip
        yield f"fwd ws 128x128 w4 s2 bf16 d{head_dim} causal varlen", (
            lambda h=head_dim: _forward_variant(forward["ws 128x128 w4 s2"], head_dim=h,
                                                dtype=torch.bfloat16, varlen=True))  # fmt: skip
    for head_dim in (64, 128):
        for deterministic in (True, False):
            mode = "deterministic" if deterministic else "atomic-dQ"
            config = TileConfig(64, 128, 0, 8, 2, tma=head_dim <= 64)
            yield f"dkdv 64x128 w8 s2 bf16 d{head_dim} causal {mode}", (
                lambda c=config, h=head_dim, m=deterministic: _dkdv_tiles(
                    c, head_dim=h, dtype=torch.bfloat16, deterministic=m))  # fmt: skip


def _ws_backward(config: TileConfig, run_backward=None, **launch):
    """attention(**launch) with the atomic-dQ backward on the warp-specialized Gluon kernel."""
    with tuning.overridden("dkdv", config):
        _with_backward_runner(run_backward)(deterministic=False, **launch)


def hopper_launches(run_backward=None):
    """(tag, launch) of the warp-specialized Gluon backward (issue 43; kernels/hopper): fp16 and
    bf16 x head_dim 64 and 128 x causal or not, then grouped-query (two query heads per kv
    head) and packed sequences, and at d64 the sweep's other tile (3 ring stages:
    kernels/hopper/route.py TILES) (the forward and the preprocess are the defaults: a binary
    met before is not repeated). run_backward: attention's."""
    default = ws_backward_config()
    for dtype in (torch.bfloat16, torch.float16):
        name = "bf16" if dtype == torch.bfloat16 else "fp16"
        for head_dim in (64, 128):
            for causal in (True, False):
                tag = f"ws-bwd {name} d{head_dim} {'causal' if causal else 'full'}"
                yield tag, functools.partial(_ws_backward, default, run_backward,
                                             head_dim=head_dim, dtype=dtype, causal=causal)  # fmt: skip
    for head_dim in (64, 128):
        yield f"ws-bwd bf16 d{head_dim} causal gqa", functools.partial(
            _ws_backward, default, run_backward, head_dim=head_dim, dtype=torch.bfloat16,
            gqa=True)  # fmt: skip
        yield f"ws-bwd bf16 d{head_dim} causal varlen", functools.partial(
            _ws_backward, default, run_backward, head_dim=head_dim, dtype=torch.bfloat16,
            varlen=True)  # fmt: skip
    yield "ws-bwd bf16 d64 causal 3 stages", functools.partial(
        _ws_backward, ws_backward_config(stages=3), run_backward, head_dim=64,
        dtype=torch.bfloat16)  # fmt: skip


def _ws_forward(config: TileConfig, **launch):
    """attention(**launch)'s forward (no backward) on the Gluon forward."""
    with tuning.overridden("fwd", config):
        attention(**launch, run_backward=lambda backward: None)


def hopper_forward_launches():
    """(tag, launch) of the Gluon forward (issue 46; kernels/hopper/flash_fwd_ws.py), forward
    only: fp16 and bf16 x head_dim 64 and 128 x causal or not, then grouped-query (two query
    heads per kv head) and packed sequences, and every other ring depth route.FWD_STAGES allows."""
    default = ws_forward_config()
    for dtype in (torch.bfloat16, torch.float16):
        name = "bf16" if dtype == torch.bfloat16 else "fp16"
        for head_dim in (64, 128):
            for causal in (True, False):
                tag = f"ws-fwd {name} d{head_dim} {'causal' if causal else 'full'}"
                yield tag, functools.partial(_ws_forward, default, head_dim=head_dim,
                                             dtype=dtype, causal=causal)  # fmt: skip
    for head_dim in (64, 128):
        yield f"ws-fwd bf16 d{head_dim} causal gqa", functools.partial(
            _ws_forward, default, head_dim=head_dim, dtype=torch.bfloat16, gqa=True)  # fmt: skip
        yield f"ws-fwd bf16 d{head_dim} causal varlen", functools.partial(
            _ws_forward, default, head_dim=head_dim, dtype=torch.bfloat16, varlen=True)  # fmt: skip
    for head_dim, depths in FWD_STAGES.items():
        for stages in depths:
            if stages != default.num_stages:
                yield f"ws-fwd bf16 d{head_dim} causal {stages} stages", functools.partial(
                    _ws_forward, ws_forward_config(stages), head_dim=head_dim,
                    dtype=torch.bfloat16)  # fmt: skip


LAUNCH_SETS = {"defaults": default_launches, "features": feature_launches,
               "decode": decode_launches, "variants": variant_launches,
               "hopper": hopper_launches, "hopper-fwd": hopper_forward_launches}  # fmt: skip


def compile_launches(launch_set: str, arch: int, front_end_only: bool, only: str = ""):
    """Yield one dict per kernel compiled (launch tag, kernel name, arch, facts); a binary met
    before in this run is not reported again."""
    compiled: list = []
    install(arch, front_end_only, compiled)
    seen: set[str] = set()
    for tag, launch in LAUNCH_SETS[launch_set]():
        if only and only not in tag:
            continue
        launch()
        for name, kernel, tiles in compiled:
            line = dict(launch=tag, kernel=name, arch=arch, **tiles)
            if kernel is not None:
                if kernel.hash in seen:
                    continue
                seen.add(kernel.hash)
                line.update(kernel_facts(kernel))
                line.update({k: v for k, v in tiles.items() if k == "stages"})  # a Gluon ring
            yield line
        compiled.clear()


def _commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True,
                         text=True, cwd=Path(__file__).parent)  # fmt: skip
    return run.stdout.strip() or "unknown"


# what a reader of each set's table needs to know beyond the columns
SET_NOTES = {
    "defaults": " (causal and full launches share the backward kernels, and the forward does "
    "not depend on the backward mode).",
    "variants": ". Forward launches compile the forward only; the dK/dV ones their backward too "
    "(the dQ kernel is the default's). block_m x block_n is the launch's tile; warps counts a "
    "warp-specialized kernel's partitions (4 asked become 12); its main_loop is the shortest "
    "tensor-core loop of one partition and not comparable with a plain kernel's.",
    "hopper": ". The warp-specialized Gluon backward (kernels/hopper/flash_bwd_ws.py) with the "
    "dK/dV config forced to it, beside the default forward and preprocess. warps counts every "
    "partition's (partitions: default + workers, here the two consumer warpgroups, the loader "
    "and the dQ writer); registers is the count at launch, setmaxnreg what the warps move to "
    "(256: the default partition after the region; 240: the consumers; 120: a worker's idle "
    "count; 24: the loader's and the dQ writer's warpgroup); adds: how dQ reaches its float32 "
    "accumulator (bulk: one TMA reduce-add a warpgroup's half of a tile; atomic: per-element "
    "adds, Triton 3.6's Gluon has no bulk reduce); stages: the Q / dO ring's depth; main_loop: "
    "the shortest loop with tensor-core work, a consumer's.",
    "hopper-fwd": ". The Gluon forward (kernels/hopper/flash_fwd_ws.py) with the fwd config "
    "forced to it, forward only. partitions: default + workers, here the loader (the default "
    "partition, 4 warps of which one issues) and the two consumer warpgroups; registers is the "
    "count at launch, setmaxnreg what the warps move to (256: the default partition after the "
    "region; the consumers' count; 120: a worker's idle count; the loader's, what the consumers "
    "leave); stages: the K / V ring's depth; main_loop: the shortest loop with tensor-core work, "
    "a consumer's (S = Q K^T and P V issued together).",
    "decode": ". These are the tiles a GPU gets (decode_config asks tuning.gpu_capability, which "
    "the stand-in answers; before issue 29 it got the 16 x 16 one-stage interpreter tile). The "
    "split kernel's decode products are mma.sync, not wgmma: a decode step's tile holds the query "
    "rows of one KV head's group (16 here, under wgmma's 64); the chunked prefill's 64-row tile "
    "compiles to wgmma; fp32 runs without tensor cores (main_loop 0). The combine kernel merges "
    "the splits without products; a one-split launch writes its output directly and has no "
    "combine.",
}


def markdown_report(lines: list[dict], arch: int, launch_set: str) -> str:
    """The facts as a Markdown page: what made them, then one row per kernel binary."""
    head = ["launch", "kernel", *FACT_COLUMNS]
    rows = [
        f"# Kernel compile report: sm_{arch}, `{launch_set}` launches",
        "",
        f"Compile-time facts for sm_{arch}, not a measurement: nothing here ran on a GPU. Made by "
        f"`python scripts/kernel_compile.py --arch {arch} --launches {launch_set} --markdown ...` "
        f"under Triton {triton.__version__}, torch {torch.__version__}, at commit `{_commit()}` "
        "(a stand-in driver names the target; each launch compiles to a cubin). Columns: "
        "registers per thread, spill (stack) bytes, shared memory bytes per block, warps, "
        "pipeline stages, loads (`tma`: tensor-descriptor bulk copies in the PTX; `pointer`), "
        "wgmma / mma_sync (SASS HGMMA / HMMA instructions), main_loop (SASS instructions of "
        "the shortest innermost loop with tensor-core work: the unmasked steady state), "
        "loop_spills (SASS LDL / STL in that loop: the spills that cost on every tile; the most "
        "of any partition's), loop_waits / loop_drains (the PTX's wgmma.wait_group on an "
        "iteration of the innermost loop that issues wgmma, and those with a count of 0, each "
        "draining the warpgroup's products: flashtrain/lab/ptx_waits.py). A binary met before "
        "in the run is not repeated" + SET_NOTES.get(launch_set, "."),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for line in lines:
        cells = [
            line["launch"],
            line["kernel"].removeprefix("flash_backward_").removeprefix("flash_"),
        ]
        for column in FACT_COLUMNS:
            value = line.get(column, "")
            cells.append(
                f"{value:,}" if isinstance(value, int) and column == "shared" else str(value)
            )
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    parser.add_argument("--launches", choices=sorted(LAUNCH_SETS), default="defaults")
    parser.add_argument("--only", default="", help="only launches whose tag contains this text")
    parser.add_argument("--front-end-only", action="store_true")
    parser.add_argument("--markdown", type=Path, help="also write the facts as a table here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("kernel_compile compiles; run it without TRITON_INTERPRET=1")
    lines = []
    for line in compile_launches(args.launches, args.arch, args.front_end_only, args.only):
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.markdown:
        tmp = args.markdown.with_name(args.markdown.name + ".tmp")
        tmp.write_text(markdown_report(lines, args.arch, args.launches))
        tmp.replace(args.markdown)


if __name__ == "__main__":
    main()
