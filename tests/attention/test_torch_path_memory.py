"""The PyTorch path's memory is linear in the sequence length: at 16K tokens a windowed call
with dropout (the chunked code, forward and backward) stays far below one 16K x 16K mask
(256 MiB as bool; float32 scores would be 1 GiB), which a chunk that built masks for all rows
would allocate. Each chunk builds its masks for its own rows and the keys its window sees."""

import os
import subprocess
import sys

import pytest

_RUN = """
import resource, torch
from flashtrain.attention import flash_attn_func

def call(seqlen):
    q, k, v = (torch.randn(1, seqlen, 1, 16, requires_grad=True) for _ in range(3))
    out = flash_attn_func(q, k, v, dropout_p=0.1, causal=True, window_size=(256, 0))
    out.sum().backward()

call(512)  # warm up: imports, allocator pools
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
call(16384)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) // 1024)  # peak growth in MiB (ru_maxrss is in KiB on Linux)
"""


@pytest.mark.slow  # ~14 s on 2 idle cores: left out of the normal suite (10 minutes)
@pytest.mark.single_route
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss units differ")
def test_windowed_dropout_at_16k_stays_linear():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FLASHTRAIN_CPU_ATTENTION"] = "torch"
    done = subprocess.run(
        [sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    growth_mib = int(done.stdout.split()[-1])
    assert growth_mib < 40, f"peak memory grew by {growth_mib} MiB at 16K tokens"
