"""Offsets that can pass 2^31 within one batch element are int64 in the kernels, and the limits
that remain are refused at the API naming them (issue 25.10): nothing large is allocated (a
storage large only in address space, meta tensors, one tile of Philox draws)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
from flashtrain.attention.validation import MAX_ROW_STRIDE, MAX_SEQLEN
from flashtrain.kernels.dropout import dropout_keep

SCRIPT = Path(__file__).with_name("huge_strides.py")
REPO = SCRIPT.parents[2]


@pytest.mark.parametrize(
    "layout",
    # rows: ~34 s on 2 busy cores, left out of the normal suite (10 minutes); heads stays
    [pytest.param("rows", marks=pytest.mark.slow), "heads"],
)
def test_offsets_past_2_31_within_one_sequence(route, layout):
    """(S, H, D) views whose element offsets pass 2^31 (a row 2^23 - 64 elements apart from the
    next, or a head-major view with heads 2^30 + 64 apart) give the reference's answer and
    gradient on both routes. In a subprocess: before the fix the interpreter read outside the
    storage (SIGSEGV)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(SCRIPT.parent)]))
    run = subprocess.run([sys.executable, str(SCRIPT), layout], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-3000:]}"
    errors = json.loads(run.stdout.splitlines()[-1])
    assert max(errors.values()) < 2e-2, errors  # fp16 against float64 (typical error 2e-3..5e-3)


def _meta(shape, strides=None, dtype=torch.float16):
    if strides is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, strides, dtype=dtype, device="meta")


@pytest.mark.single_route
def test_limits_left_in_int32_are_refused_naming_them():
    ok = _meta((1, 4, 2, 16))
    wide = _meta((1, 4, 2, 16), (0, MAX_ROW_STRIDE + 1, 16, 1))
    with pytest.raises(ValueError, match=r"stride of 8388608 elements between tokens.*2\^23 - 1"):
        flash_attn_func(wide, ok, ok)
    with pytest.raises(ValueError, match=r"v has a stride"):
        flash_attn_func(ok, ok, wide)
    long = _meta((1, MAX_SEQLEN + 1, 1, 16))
    with pytest.raises(ValueError, match=r"k has seqlen 1073741824.*2\^30 - 1"):
        flash_attn_func(_meta((1, 4, 1, 16)), long, long)
    packed = _meta((8, 1, 16))
    cu = torch.tensor([0, 8], dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"max_seqlen_q=1073741824 is over.*2\^30 - 1"):
        flash_attn_varlen_func(packed, packed, packed, cu, cu, MAX_SEQLEN + 1, 8)


@triton.jit
def _draws(OUT, seed, row, col, seqlen_k, N: tl.constexpr):
    """dropout_keep of row `row`, columns col .. col + N - 1, as int8."""
    offs = tl.arange(0, N)
    rows = row + offs * 0  # int32, as the kernels' row indices are
    tl.store(OUT + offs, dropout_keep(seed, rows, col + offs, seqlen_k, 0.5).to(tl.int8))


@pytest.mark.single_route
def test_dropout_counter_does_not_wrap_at_2_32():
    """Element (i, j) draws with counter i * seqlen_k + j: (i + 65535, j + 1) is 2^32 further on
    for seqlen_k = 65537, and must not repeat (i, j)'s draw (an int32 counter wrapped to it)."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("the kernels run under TRITON_INTERPRET=1 or on a GPU")
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def keep(row, col):
        out = torch.empty(256, dtype=torch.int8, device=device)
        _draws[(1,)](out, 2**40 + 5, row, col, 65537, N=256)
        return out.cpu()

    first, wrapped = keep(10, 0), keep(10 + 65535, 1)
    assert (10 + 65535) * 65537 + 1 == 10 * 65537 + 2**32
    assert torch.equal(first, keep(10, 0))  # a pure function of (seed, counter)
    assert (first != wrapped).float().mean() > 0.25, "the draw 2^32 further on repeats"
