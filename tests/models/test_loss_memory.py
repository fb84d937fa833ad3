"""The LM-head loss's extra peak memory: a chunk's logits at most (chunked), none at all (fused),
never the (tokens, vocab) logits. Measured for real: each point runs in a fresh process
(flashtrain.lab.bench.loss.measure_point) that reports its peak resident set (/proc VmHWM, reset
before the call) beyond the resident set with the inputs in place, over forward + backward; large blocks are mapped one by
one (loss_bench.EXACT_RSS_ENV), so freed tensors leave the resident set at once.

The fused kernels run under TRITON_INTERPRET=1 with large tiles (128 tokens x 1024 vocabulary
rows) to keep the interpreter's per-tile overhead down; their footprint does not depend on the
tile size except for the tiles themselves (0.5 MiB each here, registers on a GPU).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashtrain.lab.bench import loss as loss_bench
from flashtrain.models.loss import linear_cross_entropy

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json
from flashtrain.lab.bench import loss as loss_bench
from flashtrain.kernels import tuning
tuning.XENT_INTERPRETER_TILES = tuning.XentTiles(128, 1024, 16, 16, 4, 1)
print(json.dumps(loss_bench.measure_point({method!r}, {tokens}, {hidden}, {vocab}, {chunk}, 1)))
"""
MiB = 2**20


def peak_mib(method, tokens, hidden, vocab, chunk=2048, interpret=False) -> float:
    code = CHILD.format(method=method, tokens=tokens,
                        hidden=hidden, vocab=vocab, chunk=chunk)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **loss_bench.EXACT_RSS_ENV)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]


def logits_mib(tokens, vocab) -> float:
    return tokens * vocab * 4 / MiB


def test_chunked_peak_is_one_chunk_of_logits():
    """8192 tokens x vocab 8192 in chunks of 512: the logits and gradient of one chunk
    (2 x 16 MiB; the meter must see at least one) and O(tokens) terms, against 256 MiB of
    full logits."""
    peak = peak_mib("chunked", 8192, 16, 8192, chunk=512)
    assert logits_mib(512, 8192) <= peak < 3 * logits_mib(512, 8192) + 16, peak


def test_fused_saves_only_its_inputs_and_the_lse():
    """What the fused loss keeps for the backward: hidden, weight, targets and lse (N,) float32,
    nothing of size tokens x vocab (its kernels allocate O(tokens + vocab) only, which the slow
    test below measures)."""
    n, c, v = 37, 24, 150
    h = torch.randn(n, c, requires_grad=True)
    w = torch.randn(v, c, requires_grad=True)
    y = torch.randint(0, v, (n,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss, _ = linear_cross_entropy(h, w, y, impl="fused", compute_hits=False)
    loss.backward()
    assert sorted(tuple(t.shape) for t in saved) == sorted([(n, c), (v, c), (n,), (n,)])
    lse = next(t for t in saved if t.dtype == torch.float32 and t.dim() == 1)
    assert lse.shape == (n,)


@pytest.mark.slow
def test_fused_peak_holds_no_logits():
    """2048 tokens x vocab 8192 through the fused kernels (interpreted, ~2 minutes): O(tokens +
    vocab) buffers only (the per-token lse and loss, fp32 grad_hidden and grad_weight, 128 KiB
    and 512 KiB here), against 64 MiB of full logits; the chunked path at 1024-token chunks
    needs 32 MiB+."""
    fused = peak_mib("fused", 2048, 16, 8192, interpret=True)
    assert fused < logits_mib(2048, 8192) / 16, fused
    assert peak_mib("chunked", 2048, 16, 8192, chunk=1024) > logits_mib(1024, 8192)


@pytest.mark.slow
def test_chunked_peak_at_16k_tokens_and_gpt2_vocab():
    """16384 tokens x 50257 vocabulary (C = 64, 2048-token chunks): one chunk's logits and
    gradient (2 x 393 MiB) and O(tokens), not the 3.1 GiB of full logits. ~1 minute."""
    peak = peak_mib("chunked", 16384, 64, 50257)
    assert logits_mib(2048, 50257) <= peak < 2.5 * logits_mib(2048, 50257) + 64, peak
    assert peak < logits_mib(16384, 50257) / 3, peak
