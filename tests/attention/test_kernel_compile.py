"""The kernels compile for a GPU (Triton's compiler, no GPU needed): what the interpreter cannot
check. See kernel_compile.py; each launch there names the variants it compiles."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

SCRIPT = Path(__file__).with_name("kernel_compile.py")
REPO = SCRIPT.parents[2]
# 6 deterministic attention launches (forward, preprocess, dK/dV, dQ), 5 with the atomic-dQ
# backward (forward, preprocess, dK/dV with dQ) and 2 dropout-mask launches
EXPECTED_KERNELS = 6 * 4 + 5 * 3 + 2


def _compile(tmp_path, *args) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), PYTHONPATH=str(REPO),
               TRITON_DEFAULT_FP_FUSION="1")  # fmt: skip
    run = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_kernels_compile_for_hopper(tmp_path):
    """Front end only (~10 s): module globals, constexpr use, loop-carried types."""
    lines = _compile(tmp_path, "--front-end-only", "--arch", "90")
    assert len(lines) == EXPECTED_KERNELS


@pytest.mark.slow
@pytest.mark.parametrize("arch", [80, 90])
def test_kernels_compile_to_cubin(tmp_path, arch):
    """The whole pipeline to a cubin (minutes): LLVM lowering, ptxas, resources reported. Every
    kernel's shared memory fits the GPU (the built-in configs after fit_shared_memory), and the
    launches that ask for descriptors get TMA instructions on Hopper and pointer loads before."""
    from flashtrain.kernels.tuning import _SHARED_BY_CAPABILITY

    lines = _compile(tmp_path, "--arch", str(arch))
    assert len(lines) == EXPECTED_KERNELS
    assert all(line["registers"] > 0 for line in lines)
    limit = _SHARED_BY_CAPABILITY[(arch // 10, arch % 10)]
    assert all(line["shared"] <= limit for line in lines), [l for l in lines if l["shared"] > limit]
    wants_tma = [
        line for line in lines if " tma" in line["launch"] and "preprocess" not in line["kernel"]
    ]
    assert wants_tma and all(line["tma"] == (arch >= 90) for line in wants_tma)
    assert not any(line["tma"] for line in lines if " tma" not in line["launch"])
