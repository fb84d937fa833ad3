"""The split-KV decode kernels compile for a GPU (Triton's compiler, no GPU needed), as
tests/attention/test_kernel_compile.py does for the attention kernels: this file, run as a
script without TRITON_INTERPRET, launches flash_decode through a stand-in driver that names the
target GPU, so each launch compiles (nothing runs), and prints one JSON line per kernel.

    python tests/attention/test_decode_compile.py [--arch 90] [--front-end-only]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# split + combine per launch, except the single-split one (no combine)
LAUNCHES = ("fp16 d128 gqa causal", "bf16 d64 mqa window alibi leftpad batch-idx",
            "fp32 d256 softcap", "fp16 d80 prefill chunk one split", "bf16 d128 paged")  # fmt: skip
EXPECTED_KERNELS = 2 * 4 + 1


def _launches():
    import torch

    from flashtrain.kernels.common import UNBOUNDED
    from flashtrain.kernels.flash_decode import flash_decode

    def run(tag, *, dtype, head_dim, heads_q, heads_kv, seqlen_q=1, num_splits=0, window=None,
            softcap=0.0, alibi=False, extras=False, paged=False):  # fmt: skip
        batch, cache_len = 2, 4096
        q = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=dtype)
        rows = (batch * cache_len // 256, 256) if paged else (batch + 1, cache_len)  # pages of 256
        kc = torch.empty(*rows, heads_kv, head_dim, dtype=dtype)
        lens = torch.full((batch,), cache_len, dtype=torch.int32)
        left, right = window or (UNBOUNDED, 0)
        flash_decode(
            q, kc, kc, torch.empty_like(q), torch.empty(batch, heads_q, seqlen_q), lens,
            cache_batch_idx=lens if extras else None, cache_leftpad=lens if extras else None,
            softmax_scale=head_dim**-0.5, window_left=left, window_right=right, softcap=softcap,
            alibi_slopes=torch.ones(batch, heads_q) if alibi else None, num_splits=num_splits,
            block_table=torch.zeros(batch, cache_len // 256, dtype=torch.int32) if paged else None,
        )  # fmt: skip
        return tag

    yield lambda: run(LAUNCHES[0], dtype=torch.float16, head_dim=128, heads_q=32, heads_kv=8,
                      num_splits=16)  # fmt: skip
    yield lambda: run(LAUNCHES[1], dtype=torch.bfloat16, head_dim=64, heads_q=8, heads_kv=1,
                      window=(256, 0), alibi=True, extras=True)  # fmt: skip
    yield lambda: run(LAUNCHES[2], dtype=torch.float32, head_dim=256, heads_q=4, heads_kv=4,
                      softcap=30.0, num_splits=4)  # fmt: skip
    yield lambda: run(LAUNCHES[3], dtype=torch.float16, head_dim=80, heads_q=4, heads_kv=2,
                      seqlen_q=64, num_splits=1)  # fmt: skip
    yield lambda: run(LAUNCHES[4], dtype=torch.bfloat16, head_dim=128, heads_q=16, heads_kv=4,
                      num_splits=8, paged=True)  # fmt: skip


def _resources(kernel) -> dict:
    """Registers, spill (stack) bytes and shared memory of a compiled kernel, from its cubin."""
    import re
    import tempfile

    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    return dict(registers=int(re.search(r"REG:(\d+)", usage).group(1)),
                spills=int(re.search(r"STACK:(\d+)", usage).group(1)),
                shared=kernel.metadata.shared)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--front-end-only", action="store_true")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: this compiles the kernels")
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from flashtrain.kernels import tuning

    class TargetDriver:  # answers Triton's runtime questions as a GPU of the chosen arch would
        target = GPUTarget("cuda", args.arch, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return self.target

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

    class FrontEndDone(Exception):
        pass

    driver.set_active(TargetDriver())
    tuning.gpu_capability = lambda device: (args.arch // 10, args.arch % 10)
    compiled = []

    def compile_only(self, grid):
        def launch(*a, **kw):
            try:
                kernel = self.run(*a, grid=grid, warmup=True, **kw)
            except FrontEndDone:
                kernel = None
            compiled.append((self.__name__, kernel))

        return launch

    JITFunction.__getitem__ = compile_only
    if args.front_end_only:
        from triton.backends.nvidia.compiler import CUDABackend

        add_stages = CUDABackend.add_stages

        def first_ir_only(self, stages, options, language):
            add_stages(self, stages, options, language)
            first = next(iter(stages))
            for name in list(stages)[1:]:
                del stages[name]

            def stop(module, metadata):
                raise FrontEndDone

            stages[first + "_done"] = stop

        CUDABackend.add_stages = first_ir_only
    for launch in _launches():
        tag = launch()
        for name, kernel in compiled:
            line = dict(launch=tag, kernel=name, arch=args.arch)
            if kernel is not None:
                line.update(_resources(kernel))
            print(json.dumps(line), flush=True)
        compiled.clear()


def _compile(tmp_path, *args) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), PYTHONPATH=str(REPO),
               TRITON_DEFAULT_FP_FUSION="1")  # fmt: skip
    run = subprocess.run([sys.executable, __file__, *args], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.mark.single_route
def test_decode_kernels_compile_to_cubin(tmp_path):
    """The whole pipeline to an sm_90 cubin (~10 s): both kernels of every launch compile, their
    shared memory fits the GPU and nothing spills."""
    from flashtrain.kernels.tuning import _SHARED_BY_CAPABILITY

    lines = _compile(tmp_path, "--arch", "90")
    assert len(lines) == EXPECTED_KERNELS
    assert {line["kernel"] for line in lines} == {
        "flash_decode_split_kernel", "flash_decode_combine_kernel"}  # fmt: skip
    assert all(line["shared"] <= _SHARED_BY_CAPABILITY[(9, 0)] for line in lines), lines
    assert all(line["spills"] == 0 for line in lines), lines


if __name__ == "__main__":
    main()
