"""The split-KV decode kernels compile for a GPU (Triton's compiler, no GPU needed), through the
lab's compile tool as tests/attention/test_kernel_compile.py does for the attention kernels:
`python -m flashtrain.lab.kernel_compile --launches decode` compiles every decode launch to a
cubin through a stand-in driver that names the target GPU (nothing runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashtrain.lab.kernel_compile import decode_launches

pytestmark = pytest.mark.single_route  # kernel internals: run once, not once per CPU route

REPO = Path(__file__).resolve().parents[2]
DECODE_KERNELS = ("flash_decode_split_kernel", "flash_decode_combine_kernel")


def _compile(tmp_path, *args) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), PYTHONPATH=str(REPO),
               TRITON_DEFAULT_FP_FUSION="1")  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "flashtrain.lab.kernel_compile", *args], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.mark.slow  # ~10-30 s of ptxas (the suite's 10 minutes); the decode launches also compile
# in the launch contract's "all" set (-m slow)
def test_decode_kernels_compile_to_cubin(tmp_path):
    """The whole pipeline to an sm_90 cubin (~10 s): split and combine of every launch (the
    one-split chunked prefill writes its output directly: no combine), shared memory within the
    GPU's, nothing spilled."""
    from flashtrain.kernels.tuning import _SHARED_BY_CAPABILITY

    lines = _compile(tmp_path, "--launches", "decode", "--arch", "90")
    tags = [tag for tag, _ in decode_launches()]
    want = [(tag, kernel) for tag in tags for kernel in DECODE_KERNELS if "one split" not in tag
            or kernel == DECODE_KERNELS[0]]  # fmt: skip
    assert [(line["launch"], line["kernel"]) for line in lines] == want
    assert all(line["shared"] <= _SHARED_BY_CAPABILITY[(9, 0)] for line in lines), lines
    assert all(line["spill"] == 0 and line["loop_spills"] == 0 for line in lines), lines
