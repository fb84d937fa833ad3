"""Decode-step latency: one new query row per sequence against a KV cache of 4K-64K tokens.

    python -m flashtrain.inference.bench_decode [--cache-lens 4096 16384 65536] [--out DIR]

Three ways to attend one step, each timed (median of --repeats after a warm-up):
    kvcache       flash_attn_with_kvcache (split-KV kernel, splits chosen from the shape)
    kvcache-1     the same with num_splits=1 (one program per batch x KV head: what the split buys)
    flash         flash_attn_func(q, k[:, :L], v[:, :L]): the normal forward on the cache
    sdpa          torch's scaled_dot_product_attention on the same (heads expanded for GQA)
Writes decode.json and decode.md (the device named) to --out. Timings mean something only on a
GPU; on a CPU the command checks that every method runs (tiny default sizes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from flashtrain.attention import flash_attn_func, flash_attn_with_kvcache
from flashtrain.data.files import atomic_path


def _timer(device: torch.device):
    def measure(fn, repeats: int) -> float:
        fn()  # warm-up (compilation, allocation)
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return measure


def methods(q, k_cache, v_cache, lens):
    """name -> a zero-argument callable attending one decode step."""
    length = k_cache.shape[1]
    group = q.shape[2] // k_cache.shape[2]

    def sdpa():
        qt = q.transpose(1, 2)  # (B, H, 1, D)
        kt = k_cache.transpose(1, 2).repeat_interleave(group, dim=1)
        vt = v_cache.transpose(1, 2).repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(qt, kt, vt)

    return {
        "kvcache": lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens),
        "kvcache-1": lambda: flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lens, num_splits=1
        ),  # fmt: skip
        "flash": lambda: flash_attn_func(q, k_cache[:, :length], v_cache[:, :length]),
        "sdpa": sdpa,
    }


def run(cache_lens, batch, heads_q, heads_kv, head_dim, dtype, device, repeats) -> list[dict]:
    measure = _timer(device)
    rows = []
    for length in cache_lens:
        torch.manual_seed(0)
        q = torch.randn(batch, 1, heads_q, head_dim, dtype=dtype, device=device)
        k_cache = torch.randn(batch, length, heads_kv, head_dim, dtype=dtype, device=device)
        v_cache = torch.randn_like(k_cache)
        lens = torch.full((batch,), length, dtype=torch.int32, device=device)
        reference = None
        for name, fn in methods(q, k_cache, v_cache, lens).items():
            out = (
                fn().reshape(batch, heads_q * head_dim).float()
            )  # Sq = 1: (B, H x D) either layout
            reference = out if reference is None else reference
            error = float((out - reference).abs().max())
            rows.append(dict(cache_len=length, method=name, seconds=measure(fn, repeats),
                             max_abs_diff_vs_kvcache=error))  # fmt: skip
    return rows


def markdown(report: dict) -> str:
    lines = [f"# Decode-step attention latency on {report['device']}", "",
             f"batch {report['batch']}, heads {report['heads_q']} (KV {report['heads_kv']}), "
             f"head_dim {report['head_dim']}, {report['dtype']}; median of {report['repeats']}.",
             "", "| cache tokens | method | time (us) | max diff vs kvcache |", "|---:|---|---:|---:|"]  # fmt: skip
    for r in report["rows"]:
        lines.append(f"| {r['cache_len']} | {r['method']} | {r['seconds'] * 1e6:.1f} | "
                     f"{r['max_abs_diff_vs_kvcache']:.2e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-lens", type=int, nargs="+",
                   default=[4096, 8192, 16384, 32768, 65536] if cuda else [64, 256])  # fmt: skip
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads-q", type=int, default=32 if cuda else 4)
    p.add_argument("--heads-kv", type=int, default=8 if cuda else 2)
    p.add_argument("--head-dim", type=int, default=128 if cuda else 16)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   default="bfloat16" if cuda else "float32")  # fmt: skip
    p.add_argument("--repeats", type=int, default=50 if cuda else 3)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/decode"))
    args = p.parse_args(argv)
    device = torch.device("cuda" if cuda else "cpu")
    rows = run(args.cache_lens, args.batch, args.heads_q, args.heads_kv, args.head_dim,
               getattr(torch, args.dtype), device, args.repeats)  # fmt: skip
    name = torch.cuda.get_device_name(device) if cuda else "CPU (timings not meaningful)"
    report = dict(device=name, batch=args.batch, heads_q=args.heads_q, heads_kv=args.heads_kv,
                  head_dim=args.head_dim, dtype=args.dtype, repeats=args.repeats, rows=rows)  # fmt: skip
    with atomic_path(args.out / "decode.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
    with atomic_path(args.out / "decode.md") as tmp:
        tmp.write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
