"""Compile the kernels for a CUDA GPU on a machine that has none, with Triton's own compiler.

TRITON_INTERPRET runs the kernels' Python, not their compilation: rules only the compiler
enforces (module globals must be tl.constexpr, loop-carried types, constexpr-only
arguments) pass the interpreter and fail on the first GPU. This script launches the real
launchers through a stand-in driver that names the target GPU, so each launch compiles
(nothing runs), and prints one JSON line per kernel compiled.

    python tests/attention/kernel_compile.py [--arch 90] [--front-end-only]

--front-end-only stops after Triton's first IR (the checks above, ~0.5 s a kernel); without
it the whole pipeline runs to a cubin (LLVM and ptxas, several seconds a kernel) and the
lines carry the register count and spill bytes. Run it without TRITON_INTERPRET set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

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
from flashtrain.kernels.flash_fwd import flash_forward


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


def _install(arch: int, front_end_only: bool, compiled: list) -> None:
    driver.set_active(_TargetDriver(arch))
    tuning.gpu_capability = lambda device: (arch // 10, arch % 10)

    def compile_only(self, grid):
        def launch(*args, **kwargs):
            try:
                kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            except _FrontEndDone:
                kernel = None
            compiled.append((self.__name__, kernel))

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


def _resources(kernel) -> dict:
    """Registers and spill (stack) bytes of a compiled kernel, from its cubin."""
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [os.path.join(tools, "cuobjdump"), "-res-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return dict(
        registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        stack=int(re.search(r"STACK:(\d+)", usage).group(1)),
        shared=kernel.metadata.shared,
        tma="cp.async.bulk.tensor" in kernel.asm["ptx"],  # descriptor loads compiled in
    )


def _attention(
    *,
    head_dim,
    dtype,
    causal=True,
    varlen=False,
    sparse=False,
    dropout_p=0.0,
    seed=5,
    softcap=0.0,
    alibi=False,
    deterministic=True,
    tma=False,
):
    """One forward and one backward launch (real shapes are irrelevant: nothing runs);
    deterministic=False: the atomic-dQ backward; tma: tensor-descriptor loads and stores."""
    batch, seqlen, heads_q, heads_kv = 2, 256, 4, 2
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
    with tuning.forced_tma(tma):
        flash_forward(q, k, k, out, lse, **opts)
        flash_backward(
            out,
            q,
            k,
            k,
            out,
            lse,
            torch.empty_like(q),
            torch.empty_like(k),
            torch.empty_like(k),
            deterministic=deterministic,
            **opts,
        )


def launches():
    """(tag, launch) pairs: the plain production paths and every feature flag at least once."""
    yield "dense fp16 d128", lambda: _attention(head_dim=128, dtype=torch.float16)
    yield "dense bf16 d64 full", lambda: _attention(head_dim=64, dtype=torch.bfloat16, causal=False)
    yield "sparse bf16 d64", lambda: _attention(head_dim=64, dtype=torch.bfloat16, sparse=True)
    yield (
        "dense bf16 d128 atomic dQ",
        lambda: _attention(head_dim=128, dtype=torch.bfloat16, deterministic=False),
    )
    yield (
        "sparse bf16 d64 atomic dQ",
        lambda: _attention(head_dim=64, dtype=torch.bfloat16, sparse=True, deterministic=False),
    )
    yield (
        "varlen fp16 d72 softcap alibi dropout tensor-seed",
        lambda: _attention(
            head_dim=72,
            dtype=torch.float16,
            varlen=True,
            softcap=30.0,
            alibi=True,
            dropout_p=0.1,
            seed=torch.tensor([5]),
            deterministic=False,
        ),
    )
    yield (
        "sparse fp32 d200 softcap alibi dropout",
        lambda: _attention(
            head_dim=200, dtype=torch.float32, sparse=True, softcap=5.0, alibi=True, dropout_p=0.2
        ),
    )
    yield (
        "dense bf16 d128 tma atomic dQ",
        lambda: _attention(head_dim=128, dtype=torch.bfloat16, deterministic=False, tma=True),
    )
    yield (
        "varlen fp16 d72 tma dropout",
        lambda: _attention(head_dim=72, dtype=torch.float16, varlen=True, dropout_p=0.1, tma=True),
    )
    yield (
        "sparse bf16 d64 tma",
        lambda: _attention(head_dim=64, dtype=torch.bfloat16, sparse=True, tma=True),
    )
    yield "dense fp32 d256 full", lambda: _attention(
        head_dim=256, dtype=torch.float32, causal=False, deterministic=False)  # fmt: skip
    yield "dropout mask", lambda: dropout_keep_mask(torch.tensor([5]), 2, 4, 100, 70, 0.2, "cpu")
    yield "dropout mask varlen int seed", lambda: dropout_keep_mask(
        7, 2, 4, 100, 70, 0.2, "cpu", torch.tensor([0, 30, 100], dtype=torch.int32),
        torch.tensor([0, 20, 70], dtype=torch.int32))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    parser.add_argument("--front-end-only", action="store_true")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("kernel_compile.py compiles; run it without TRITON_INTERPRET=1")
    compiled: list = []
    _install(args.arch, args.front_end_only, compiled)
    for tag, launch in launches():
        launch()
        for name, kernel in compiled:
            line = dict(launch=tag, kernel=name, arch=args.arch)
            if kernel is not None:
                line.update(_resources(kernel))
            print(json.dumps(line), flush=True)
        compiled.clear()


if __name__ == "__main__":
    main()
