"""Decode-step latency: one new query row per sequence against a KV cache of 4K-64K tokens.

    python scripts/bench_decode.py [--cache-lens 4096 16384 65536] [--out DIR]

Four ways to attend one step, each timed (median, flashtrain.lab.bench.measure.time_ms):
    kvcache       flash_attn_with_kvcache (split-KV kernel, splits chosen from the shape)
    kvcache-1     the same with num_splits=1 (one program per batch x KV head: what the split buys)
    flash         flash_attn_func(q, k[:, :L], v[:, :L]): the normal forward on the cache
    sdpa          torch's scaled_dot_product_attention on the same (heads expanded for GQA)
decode_rows() measures (the GPU suite calls it per cache length); main() writes decode.json and
decode.md (the device, versions and commit named) to --out, by default
benchmarks/results/decode/. Timings mean something only on a GPU; on a CPU the command checks
that every method runs and agrees (tiny default sizes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from flashtrain.attention import flash_attn_func, flash_attn_with_kvcache
from flashtrain.data.files import atomic_path
from flashtrain.lab.bench.measure import environment, time_ms
from flashtrain.lab.bench.results import write_json
from flashtrain.lab.checkout import RESULTS

METHODS = ("kvcache", "kvcache-1", "flash", "sdpa")


def methods(q, k_cache, v_cache, lens) -> dict:
    """name -> a zero-argument callable attending one decode step; q (B, 1, Hq, D), caches
    (B, L, Hkv, D) full (lens = L)."""
    length = k_cache.shape[1]
    group = q.shape[2] // k_cache.shape[2]

    def sdpa():
        qt = q.transpose(1, 2)  # (B, Hq, 1, D)
        kt = k_cache.transpose(1, 2).repeat_interleave(group, dim=1)  # (B, Hq, L, D)
        vt = v_cache.transpose(1, 2).repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(qt, kt, vt)

    return {
        "kvcache": lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens),
        "kvcache-1": lambda: flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lens, num_splits=1
        ),
        "flash": lambda: flash_attn_func(q, k_cache[:, :length], v_cache[:, :length]),
        "sdpa": sdpa,
    }


def decode_inputs(length, batch, heads_q, heads_kv, head_dim, dtype, device):
    """q (B, 1, Hq, D), full caches (B, L, Hkv, D) and their lengths: what methods() takes."""
    q = torch.randn(batch, 1, heads_q, head_dim, dtype=dtype, device=device)
    k_cache = torch.randn(batch, length, heads_kv, head_dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    return q, k_cache, v_cache, torch.full((batch,), length, dtype=torch.int32, device=device)


def launch_once(length, batch, heads_q, heads_kv, head_dim, dtype, device) -> None:
    """flashtrain's methods at one cache length, once each: the first call compiles their
    kernels (the GPU suite's compile phase; SDPA is torch's)."""
    inputs = decode_inputs(length, batch, heads_q, heads_kv, head_dim, dtype, device)
    for name, fn in methods(*inputs).items():
        if name != "sdpa":
            fn()


def decode_rows(cache_lens, batch, heads_q, heads_kv, head_dim, dtype, device, repeats) -> list[dict]:  # fmt: skip
    """One row per (cache length, method): cache_len, method, seconds (median of about
    `repeats` calls after a warm-up) and max_abs_diff_vs_kvcache (every method's output against
    the split-KV kernel's, float32)."""
    rows = []
    for length in cache_lens:
        torch.manual_seed(0)
        inputs = decode_inputs(length, batch, heads_q, heads_kv, head_dim, dtype, device)
        reference = None
        for name, fn in methods(*inputs).items():
            out = fn().reshape(batch, heads_q * head_dim).float()  # Sq = 1: either layout
            reference = out if reference is None else reference
            seconds = time_ms(fn, warmup=2, rep=repeats, device=device) / 1e3
            rows.append(dict(cache_len=length, method=name, seconds=seconds,
                             max_abs_diff_vs_kvcache=float((out - reference).abs().max())))  # fmt: skip
    return rows


def markdown(report: dict) -> str:
    env = report["env"]
    lines = [f"# Decode-step attention latency on {env['device']}", "",
             f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}. "
             f"batch {report['batch']}, heads {report['heads_q']} (KV {report['heads_kv']}), "
             f"head_dim {report['head_dim']}, {report['dtype']}; median of ~{report['repeats']}.",
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
    p.add_argument("--out", type=Path, default=RESULTS / "decode")
    args = p.parse_args(argv)
    device = torch.device("cuda" if cuda else "cpu")
    rows = decode_rows(args.cache_lens, args.batch, args.heads_q, args.heads_kv, args.head_dim,
                       getattr(torch, args.dtype), device, args.repeats)  # fmt: skip
    env = environment()
    if not cuda:
        env["device"] = f"{env['device']} (timings not meaningful)"
    report = dict(env=env, batch=args.batch, heads_q=args.heads_q, heads_kv=args.heads_kv,
                  head_dim=args.head_dim, dtype=args.dtype, repeats=args.repeats, rows=rows)  # fmt: skip
    write_json(args.out / "decode.json", report)
    with atomic_path(args.out / "decode.md") as tmp:
        tmp.write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
