"""What every section of the GPU suite is handed: the run (its record, output folder, dry or
real) and the sizes it measures at, real on a GPU and toys in the dry run. Its own module, so
the sections in modules of their own (gpu_suite/hopper.py) and sections.py, which lists them,
both import it, neither the other."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from flashtrain.lab.gpu_suite.record import Record

# The training section's runs (model, seqlen): GPT-2 small at 1K (the MFU target), Llama-125M at
# 16K (ours vs SDPA's best) and at 1K; the dry run's tiny stand-ins, one length a model (every
# code path, in the time the dry run took before Llama's second length joined)
TRAINING = (("gpt2", 1024), ("llama-125m", 16384), ("llama-125m", 1024))
DRY_TRAINING = (("gpt2", 64), ("llama-125m", 128))


@dataclass(frozen=True)
class Sizes:
    dtype: torch.dtype
    head_dims: tuple[int, ...]  # the attention and sweep head dims (targets' first)
    seqlens: tuple[int, ...]  # the attention targets' lengths
    tokens: int  # per attention batch (batch = tokens // seqlen)
    hidden: int  # heads * head_dim
    sparse: tuple[int, int, int]  # block-sparse: seqlen, block size, window in blocks
    matmul_n: int
    copy_mib: int
    long: tuple[int, int, int, int]  # 64K run: batch, seqlen, heads, head_dim
    training: tuple[tuple[str, int], ...]  # (model, seqlen) trainer runs, in order of value
    train_tokens: int  # the global batch of every trainer run, in tokens
    train_schedule: tuple[int, int, int]  # steps: warm (compile), timed, profiled (Schedule)
    train_compile: bool
    decode: tuple[int, int, int, int]  # batch, query heads, KV heads, head_dim
    decode_lens: tuple[int, ...]  # KV cache tokens
    sweep_seqlen: int
    rep: int
    # longctx: P ranks, tile_tokens of its tiled rows, tokens per GPU (long_context_plan.suite_rows)
    longctx: tuple[int, int, tuple[int, ...]] = (8, 16384, (131072, 262144))

    @classmethod
    def for_run(cls, dry: bool, rep: int) -> Sizes:
        if dry:  # toys on CPU: the code paths, no figure
            return cls(torch.float32, (32, 16), (64, 128), 256, 64, (256, 64, 1), 256, 8,
                       (1, 256, 2, 16), DRY_TRAINING, 1024, (1, 2, 1), False, (1, 4, 2, 16),
                       (64, 256), 64, 2, longctx=(4, 32, (64, 128)))  # fmt: skip
        return cls(torch.bfloat16, (128, 64), (4096, 16384), 16384, 2048, (16384, 128, 8), 8192,
                   1024, (1, 65536, 16, 128), TRAINING, 65536, (2, 5, 3), True, (1, 32, 8, 128),
                   (4096, 16384, 65536, 8192, 32768), 4096, rep)  # fmt: skip


@dataclass
class Suite:
    record: Record
    out: Path
    dry: bool
    sizes: Sizes
    pytest_args: tuple[str, ...]

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    @property
    def compile_workers(self) -> int:
        """Threads of a compile phase: a core each on the GPU machine (Triton's compiler releases
        the GIL); one in the dry run (the Triton interpreter of the tests patches modules)."""
        return 1 if self.dry else os.cpu_count() or 8
