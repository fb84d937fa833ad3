"""One attention measurement as result rows (fwd, bwd, fwd+bwd), shared by
scripts/bench_attention.py and scripts/gpu_suite.py."""

from __future__ import annotations

import torch

from flashtrain.lab.bench import baselines, measure
from flashtrain.lab.bench.flops import attention_flops


def random_qkv(batch, seqlen, heads, head_dim, *, device, dtype=torch.bfloat16, kv_heads=None):
    """q: (B, S, H, D), k/v: (B, S, Hkv, D) random leaves that require grad (never zeros)."""
    shapes = [(batch, seqlen, heads, head_dim)] + [(batch, seqlen, kv_heads or heads, head_dim)] * 2
    return tuple(torch.randn(s, device=device, dtype=dtype, requires_grad=True) for s in shapes)


def attention_row(method, mode, ms, peak_mib, note, dims, causal, density=1.0, variant=""):
    batch, heads, seqlen, head_dim = dims
    flops = attention_flops(
        batch, heads, seqlen, seqlen, head_dim, causal=causal, density=density, mode=mode
    )
    return {
        "method": method,
        "mode": mode,
        "seqlen": seqlen,
        "batch": batch,
        "heads": heads,
        "head_dim": head_dim,
        "causal": causal,
        "density": density,
        "variant": variant,
        "ms": ms,
        "tflops": flops / (ms * 1e-3) / 1e12 if ms else None,
        "peak_mib": peak_mib,
        "note": note,
    }


def skipped_rows(method, reason, dims, causal, density=1.0, variant="") -> list[dict]:
    return [
        attention_row(method, mode, None, None, reason, dims, causal, density, variant)
        for mode in ("fwd", "bwd", "fwd_bwd")
    ]


def bench_method(name, forward, inputs, dims, causal, rep, density=1.0, variant="", device=None,
                 *, baseline=None):  # fmt: skip
    """Rows for the forward, the backward (fwd+bwd minus fwd) and fwd+bwd of one method. An error
    in flashtrain's own op is raised (the measurement fails); a baseline's is a note.
    baseline: whether `name` is one (default: every method but "flashtrain")."""
    baseline = name != "flashtrain" if baseline is None else baseline
    fwd = measure.measure(forward, rep=rep, device=device, baseline=baseline)
    both = measure.measure(
        baselines.with_backward(forward, inputs), rep=rep, device=device, baseline=baseline
    )
    rows = [
        attention_row(name, mode, m.ms, m.peak_mib, m.note, dims, causal, density, variant)
        for mode, m in (("fwd", fwd), ("fwd_bwd", both))
    ]
    bwd_ms = both.ms - fwd.ms if both.ms is not None and fwd.ms is not None else None
    rows.append(attention_row(name, "bwd", bwd_ms, None, both.note, dims, causal, density, variant))
    return rows
